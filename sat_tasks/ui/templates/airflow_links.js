// Links to Airflow's own pages (a[data-airflow-link]) inside Airflow's embedded view: the view's iframe is
// sandboxed without allow-top-navigation or allow-popups, so a _top or _blank target is refused. Its sandbox allows
// scripts on this same origin: the click moves Airflow's single-page app (history + popstate, which its router
// follows). Opened on its own (not framed) the link is a plain link; where moving Airflow's app fails, it opens here.
document.addEventListener('click',function(e){var a=e.target.closest&&e.target.closest('a[data-airflow-link]');
if(!a||e.defaultPrevented||e.button!==0||e.metaKey||e.ctrlKey||e.shiftKey||e.altKey||window.top===window)return;
e.preventDefault();var href=a.getAttribute('href');
try{var top=window.top;top.history.pushState(null,'',href);top.dispatchEvent(new top.PopStateEvent('popstate',{state:null}));}
catch(err){location.assign(href);}});
