// The Tags form saves in place (fetch): the page keeps its own address, so nothing reloads it onto the form's
// POST-only URL (Airflow's navigation re-requests the embedded view's address with GET; the page following its
// run reloads itself) and a reload never posts again. The answer's Tags section (and the Details tab's tags)
// replace this page's: a refusal's rule under the field, with what was typed; a saved edit, the new tags.
// Without script the form posts as a plain form and the answer is the job page on its Tags tab.
(function(){
function failed(form,why){var note=document.getElementById('tags-failed');
if(!note){note=document.createElement('p');note.id='tags-failed';note.className='error';note.setAttribute('role','alert');
form.appendChild(note);}note.textContent='Tags not saved: '+why;}
function bind(){var form=document.querySelector('#tags form');if(!form)return;
form.addEventListener('submit',function(ev){ev.preventDefault();var button=form.querySelector('button[type=submit]');
if(button)button.disabled=true;
fetch(form.action,{method:'POST',body:new URLSearchParams(new FormData(form)),credentials:'same-origin'})
.then(function(r){return r.text().then(function(text){
if(!r.ok&&r.status!==422){var why='HTTP '+r.status;try{why=JSON.parse(text).detail||why;}catch(e){}throw new Error(why);}
var answer=new DOMParser().parseFromString(text,'text/html');
['tags','details-tags'].forEach(function(id){var here=document.getElementById(id),there=answer.getElementById(id);
if(here&&there)here.innerHTML=there.innerHTML;});
bind();var area=document.getElementById('tags-text');if(r.status===422&&area)area.focus();});})
.catch(function(e){if(button)button.disabled=false;failed(form,e.message||String(e));});});}
bind();})();
