// The Logs tab follows the job log: it asks for what came after the offset it has (only new bytes travel),
// appends those lines (the attempts' markers marked) and keeps the page's copy bounded.
(function(){var pre=document.getElementById('job-log');if(!pre)return;
var api=pre.dataset.tail,offset=Number(pre.dataset.offset),ended=pre.dataset.ended==='yes';
var cursor=pre.dataset.cursor||'';  // a running Kubernetes attempt's section is followed by cursor, not bytes
var marker=new RegExp(pre.dataset.marker),state=document.getElementById('log-state');
var follow=document.getElementById('log-follow'),KEEP=2000000,kept=pre.textContent.length;
function shown(){var s=document.getElementById('logs');return !s||s.style.display!=='none';}
function line(text,cls){kept+=text.length+1;if(cls){var s=document.createElement('span');s.className=cls;
s.textContent=text;pre.appendChild(s);pre.appendChild(document.createTextNode('\n'));}
else{pre.appendChild(document.createTextNode(text+'\n'));}}
function add(text){var lines=text.split('\n');if(lines[lines.length-1]==='')lines.pop();
lines.forEach(function(l){line(l,marker.test(l)?'marker':'');});
while(kept>KEEP&&pre.firstChild){kept-=pre.firstChild.textContent.length;pre.removeChild(pre.firstChild);}
if(follow&&follow.checked)pre.scrollTop=pre.scrollHeight;}
function poll(){var calm=shown()?2000:10000;  // another tab open: keep up, less often
fetch(api+'?offset='+offset+(cursor?'&cursor='+encodeURIComponent(cursor):''),{credentials:'same-origin'}).then(function(r){return r.ok?r.json():null;}).then(function(p){
if(!p){setTimeout(poll,10000);return;}
if(p.restarted){pre.textContent='';kept=0;}
if(p.skipped)line('... '+p.skipped+' bytes left out here (the download has them) ...','skipped');
if(p.text)add(p.text);offset=p.offset;cursor=p.cursor||'';
if(p.source)state.textContent=p.size+' bytes so far, from '+p.source+(p.ended?'; the run has ended.':'; new lines follow as the job writes them.');
if(p.ended&&p.offset>=p.size)return;
setTimeout(poll,p.offset<p.size||p.more?200:calm);}).catch(function(){setTimeout(poll,10000);});}
if(follow&&follow.checked)pre.scrollTop=pre.scrollHeight;
if(!ended)setTimeout(poll,2000);})();
