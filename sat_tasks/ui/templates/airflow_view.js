// Inside Airflow's navigation (its plugin iframe) Airflow shows the entry whose route the frame was opened under,
// and keeps it as the frame moves: a job page reached from the Create form, or the Workspaces reached from the
// view's own links, stayed under "Create Training Job" or "Training Jobs". A page that belongs to an entry
// (body[data-airflow-view]) moves Airflow's route to that entry, same path, once: Airflow then shows it under its
// own entry (one more load of the page, in that entry's frame). Only between SAT's own entries; outside /plugin/
// (opened on its own, or Airflow under another base path) nothing happens.
(function(){var own=document.body.getAttribute('data-airflow-view'),ours={{ airflow_routes|tojson }};
if(!own||window.top===window)return;
try{var top=window.top,m=/^\/plugin\/([^\/]+)/.exec(top.location.pathname);
if(!m||m[1]===own||ours.indexOf(m[1])<0)return;
top.history.replaceState(null,'','/plugin/'+own+location.pathname+location.search+location.hash);
top.dispatchEvent(new top.PopStateEvent('popstate',{state:null}));}catch(e){}})();
