// Tabs: one section at a time (by the URL's #fragment); without script every section shows.
// A page answering a refused form (a tag edit) opens on that form's tab (its section says data-open).
function showTab(){var opened=document.querySelector('section.tab[data-open]');
var id=(location.hash||'#'+(opened?opened.id:'details')).slice(1);var known=false;
document.querySelectorAll('section.tab').forEach(function(s){if(s.id===id)known=true;});if(!known)id='details';
document.querySelectorAll('section.tab').forEach(function(s){s.style.display=s.id===id?'':'none';});
document.querySelectorAll('.tabs a[data-tab]').forEach(function(a){a.classList.toggle('active',a.dataset.tab===id);});}
window.addEventListener('hashchange',showTab);showTab();
// The page follows its run: the status word changes in place; a new attempt or status entry
// reloads the page (not while a person is typing in one of its forms).
(function(){var el=document.getElementById('status');var api=el.dataset.api;var seen=el.dataset.seen;
var terminal=JSON.parse(el.dataset.terminal);
function typing(){var a=document.activeElement;return a&&(a.tagName==='TEXTAREA'||a.tagName==='INPUT');}
function poll(){fetch(api,{credentials:'same-origin'}).then(function(r){return r.ok?r.json():null;}).then(function(p){
if(!p)return;el.textContent=p.status;el.className='status '+p.status.replace(/ /g,'');
document.getElementById('attempt').textContent=p.attempt===null?'':p.attempt;
var w=document.getElementById('waiting');if(w){w.textContent=p.waiting||'';w.hidden=!p.waiting;}
var now=p.history.length+'/'+p.attempts.length+'/'+(p.stop_requested?1:0)+'/'+p.run_state;
if(now!==seen&&!typing()){location.reload();return;}
if(terminal.indexOf(p.status)<0||p.run_state==='running'||p.run_state==='queued')setTimeout(poll,3000);})
.catch(function(){setTimeout(poll,10000);});}
if(terminal.indexOf(el.textContent)<0||el.dataset.runState==='running'||el.dataset.runState==='queued')
setTimeout(poll,3000);})();
