"""HTML of the Training Jobs view: the list, a job page with its tabs, the Create form, the Delete confirmation.

Server-rendered HTML and CSS; a little script adds what a page cannot do alone (the tabs
show one section at a time, the job page follows the status without a reload) and the
pages work without it (every section shown, a reload shows the news). Every value is
escaped; nothing here reads a secret (the spec holds none, the registry password field is
never filled back in). Forms post to the same origin (`sat_tasks.ui.api` checks it).
"""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from sat_tasks.core.status import TERMINAL, JobStatus
from sat_tasks.ui.create import FIELDS, SECTIONS, FormField, help_text

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2328}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid #d0d7de;
vertical-align:top}th{background:#f6f8fa}.status{font-weight:600}.Completed{color:#1a7f37}.Failed,
.Pending-maxretriesexceeded,.Pending-internalerror,.Pending-imagepullbackoff{color:#cf222e}.Running{color:#0969da}
.Stopped{color:#9a6700}.tabs{border-bottom:1px solid #d0d7de;padding-bottom:.4rem}.tabs a{margin-right:1.2rem}
.tabs a.active{font-weight:700;text-decoration:none;color:#1f2328}section{margin-top:1.2rem}
pre{background:#f6f8fa;padding:.6rem;overflow:auto}.evidence{font-family:monospace;font-size:.85rem}
.actions{margin:.8rem 0}.actions form{display:inline}button,.button{padding:.35rem .9rem;border:1px solid #d0d7de;
border-radius:6px;background:#f6f8fa;cursor:pointer;font-size:.9rem;color:#1f2328;text-decoration:none}
button.primary,.button.primary{background:#1f883d;color:#fff;border-color:#1a7f37}button.danger{background:#cf222e;
color:#fff;border-color:#a40e26}fieldset{border:1px solid #d0d7de;border-radius:6px;margin:1rem 0;padding:.6rem 1rem}
legend{font-weight:600}label{display:block;margin:.6rem 0 .15rem;font-weight:500}input[type=text],
input[type=number],input[type=password],select,textarea{width:32rem;max-width:100%;padding:.3rem}
input[type=checkbox]{margin-right:.4rem}.help{color:#59636e;font-size:.8rem}.error{color:#cf222e;font-size:.85rem;
font-weight:600}.invalid{border:2px solid #cf222e}.notice{background:#fff8c5;padding:.5rem .8rem;border-radius:6px}
.chart{margin:.5rem 0 1.5rem}
"""

TABS = (("details", "Details"), ("attempts", "Attempts"), ("checkpoints", "Checkpoints"), ("logs", "Logs"),
        ("monitoring", "Monitoring"), ("tags", "Tags"))

# Tabs: one section at a time (by the URL's #fragment); without script every section shows.
TABS_SCRIPT = """
function showTab(){var id=(location.hash||'#details').slice(1);var known=false;
document.querySelectorAll('section.tab').forEach(function(s){if(s.id===id)known=true;});if(!known)id='details';
document.querySelectorAll('section.tab').forEach(function(s){s.style.display=s.id===id?'':'none';});
document.querySelectorAll('.tabs a[data-tab]').forEach(function(a){a.classList.toggle('active',a.dataset.tab===id);});}
window.addEventListener('hashchange',showTab);showTab();
"""

# The job page follows its run: the status word changes in place; a new attempt or status
# entry reloads the page (not while a person is typing in one of its forms).
LIVE_SCRIPT = """
(function(){var el=document.getElementById('status');var api=el.dataset.api;var seen=el.dataset.seen;
var terminal=JSON.parse(el.dataset.terminal);
function typing(){var a=document.activeElement;return a&&(a.tagName==='TEXTAREA'||a.tagName==='INPUT');}
function poll(){fetch(api,{credentials:'same-origin'}).then(function(r){return r.ok?r.json():null;}).then(function(p){
if(!p)return;el.textContent=p.status;el.className='status '+p.status.replace(/ /g,'');
document.getElementById('attempt').textContent=p.attempt===null?'':p.attempt;
var now=p.history.length+'/'+p.attempts.length+'/'+(p.stop_requested?1:0)+'/'+p.run_state;
if(now!==seen&&!typing()){location.reload();return;}
if(terminal.indexOf(p.status)<0||p.run_state==='running'||p.run_state==='queued')setTimeout(poll,3000);})
.catch(function(){setTimeout(poll,10000);});}
if(terminal.indexOf(el.textContent)<0||el.dataset.runState==='running'||el.dataset.runState==='queued')
setTimeout(poll,3000);})();
"""


def _page(title: str, body: str, script: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)} - SAT</title>"
            f"<style>{STYLE}</style></head><body>{body}"
            + (f"<script>{script}</script>" if script else "") + "</body></html>")


def _status(word: str | None, element_id: str = "") -> str:
    word = word or ""
    ident = f" id='{element_id}'" if element_id else ""
    return f"<span{ident} class='status {escape(word.replace(' ', ''))}'>{escape(word)}</span>"


def _cell(value: Any) -> str:
    return "" if value is None else escape(str(value))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def job_href(row: dict[str, Any]) -> str:
    """The job page's path relative to /sat/."""
    return f"jobs/{quote(row['dag_id'], safe='')}/runs/{quote(row['run_id'], safe='')}"


def list_page(rows: list[dict[str, Any]], status: str | None = None) -> str:
    """The Training Jobs list: newest first, a status filter, one row per run, the Create button."""
    options = "".join(f"<option value='{escape(s.value)}'{' selected' if s.value == status else ''}>"
                      f"{escape(s.value)}</option>" for s in JobStatus)
    head = ("<th>Job</th><th>Learning type</th><th>Framework</th><th>Nodes</th><th>Status</th><th>Attempt</th>"
            "<th>Last checkpoint</th><th>Started</th><th>Duration</th><th>Tags</th><th>Next run</th>")
    body = []
    for row in rows:
        tags = ", ".join(f"{k}={v}" for k, v in row["tags"].items())
        body.append(
            f"<tr><td><a href='/sat/{escape(job_href(row))}'>{escape(row['job'])}</a><br><small>"
            f"{escape(row['run_id'])}</small></td><td>{_cell(row['learning_type'])}</td><td>{_cell(row['framework'])}"
            f"</td><td>{_cell(row['nodes'])}</td><td>{_status(row['status'])}</td><td>{_cell(row['attempt'])}</td>"
            f"<td>{_cell(row['last_checkpoint_step'])}</td><td>{_cell(row['started'])}</td>"
            f"<td>{_duration(row['duration_s'])}</td><td>{escape(tags)}</td><td>{_cell(row['next_run'])}</td></tr>")
    empty = "" if rows else "<p>No Training Jobs yet.</p>"
    return _page("Training Jobs", (
        "<h1>Training Jobs</h1>"
        "<p class='actions'><a class='button primary' href='/sat/jobs/new'>Create Training Job</a></p>"
        f"<form method='get'><label>Status <select name='status' onchange='this.form.submit()'>"
        f"<option value=''>any</option>{options}</select></label> <button>Filter</button></form>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{empty}"))


# ---- the Create Training Job form ------------------------------------------------------------------
def _input(form: FormField, value: Any, errors: list[str]) -> str:
    name = escape(form.name)
    invalid = " class='invalid' aria-invalid='true'" if errors else ""
    described = f" aria-describedby='error-{name}'" if errors else ""
    if form.kind == "checkbox":
        checked = " checked" if value else ""
        control = f"<input type='checkbox' id='{name}' name='{name}'{checked}{invalid}>"
        label = f"<label>{control}{escape(form.label)}</label>"
    else:
        label = f"<label for='{name}'>{escape(form.label)}</label>"
        text = "" if value is None else str(value)
        if form.kind == "select":
            options = "".join(f"<option value='{escape(o)}'{' selected' if o == text else ''}>{escape(o)}</option>"
                              for o in form.options)
            control = f"<select id='{name}' name='{name}'{invalid}{described}>{options}</select>"
        elif form.kind == "textarea":
            control = f"<textarea id='{name}' name='{name}' rows='4'{invalid}{described}>{escape(text)}</textarea>"
        else:
            kind = {"number": "text", "password": "password"}.get(form.kind, "text")  # numbers: the model's rule
            shown = "" if form.kind == "password" else escape(text)
            autocomplete = " autocomplete='new-password'" if form.kind == "password" else ""
            control = (f"<input type='{kind}' id='{name}' name='{name}' value='{shown}'"
                       f"{autocomplete}{invalid}{described}>")
        label += control
    help_ = help_text(form)
    error_lines = "".join(f"<div class='error' id='error-{name}'>{escape(line)}</div>" for line in errors)
    return f"<div class='field'>{label}{error_lines}" + (f"<div class='help'>{escape(help_)}</div>" if help_ else "") \
        + "</div>"


def create_page(values: dict[str, Any] | None = None, errors: dict[str, list[str]] | None = None,
                notice: str | None = None) -> str:
    """The "Create Training Job" form, in sections; with the posted values and each problem next to its field."""
    errors = errors or {}
    fresh = values is None
    fieldsets = []
    for section in SECTIONS:
        inputs = []
        for form in FIELDS:
            if form.section != section:
                continue
            if fresh:
                value = form.default
            elif form.kind == "checkbox":
                value = values.get(form.name) not in (None, "", "off", "false")
            else:
                value = values.get(form.name)
            inputs.append(_input(form, value, errors.get(form.name, [])))
        fieldsets.append(f"<fieldset><legend>{escape(section)}</legend>{''.join(inputs)}</fieldset>")
    count = sum(len(lines) for lines in errors.values())
    summary = (f"<p class='error' role='alert'>{count} problem(s): nothing was started. Fix the fields marked "
               "below.</p>") if count else ""
    return _page("Create Training Job", (
        "<p><a href='/sat/jobs'>Training Jobs</a></p><h1>Create Training Job</h1>"
        + (f"<p class='notice'>{escape(notice)}</p>" if notice else "") + summary
        + "<form method='post' action='/sat/jobs/new' novalidate>" + "".join(fieldsets)
        + "<p class='actions'><button class='primary' type='submit'>Create Training Job</button> "
          "<a class='button' href='/sat/jobs'>Cancel</a></p></form>"))


# ---- the job page -----------------------------------------------------------------------------------
def _chart(points: list[tuple[float, float]], markers: list[tuple[float, str]], *, title: str, x_label: str,
           y_label: str, chart_id: str) -> str:
    """A line chart as inline SVG, with dashed vertical markers (failovers, resumes)."""
    if not points:
        return f"<p id='{chart_id}'>{escape(title)}: no data yet.</p>"
    width, height, left, bottom, top, right = 720, 240, 60, 40, 24, 16
    xs = [x for x, _ in points] + [x for x, _ in markers]
    ys = [y for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - bottom - top)

    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2' fill='#0969da'><title>{x:g}: {y:.4g}</title>"
                   "</circle>" for x, y in points)
    marks = "".join(
        f"<line x1='{sx(x):.1f}' y1='{top}' x2='{sx(x):.1f}' y2='{height - bottom}' stroke='#cf222e' "
        f"stroke-dasharray='4 3'/><text x='{sx(x) + 4:.1f}' y='{top + 12}' font-size='11' fill='#cf222e' "
        f"class='marker'>{escape(label)}</text>" for x, label in markers)
    axes = (f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' stroke='#59636e'/>"
            f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#59636e'/>"
            f"<text x='{left}' y='{height - 8}' font-size='11'>{x0:g}</text>"
            f"<text x='{width - right}' y='{height - 8}' font-size='11' text-anchor='end'>{x1:g}</text>"
            f"<text x='{(width + left) / 2:.0f}' y='{height - 8}' font-size='12' text-anchor='middle'>"
            f"{escape(x_label)}</text><text x='4' y='{top + 4}' font-size='11'>{y1:.3g}</text>"
            f"<text x='4' y='{height - bottom}' font-size='11'>{y0:.3g}</text>"
            f"<text x='4' y='{top - 8}' font-size='12'>{escape(y_label)}</text>")
    return (f"<figure class='chart' id='{chart_id}'><figcaption>{escape(title)}</figcaption>"
            f"<svg width='{width}' height='{height}' role='img' aria-label='{escape(title)}'>{axes}"
            f"<polyline fill='none' stroke='#0969da' stroke-width='1.5' points='{path}'/>{dots}{marks}</svg></figure>")


def _monitoring(page: dict[str, Any]) -> str:
    data = page["monitoring"]
    loss = [(p["step"], p["loss"]) for p in data["loss"]]
    step_marks = [(m["step"], m["label"]) for m in data["markers"] if m["step"] is not None]
    stamped = [r for r in data["steps_per_second"] if r["t"]]
    start = min([r["t"] for r in stamped] + [m["at"] for m in data["markers"] if m["at"]], default=0.0)
    rate = [(round(r["t"] - start, 1), r["steps_per_second"]) for r in stamped]
    time_marks = [(round(m["at"] - start, 1), m["label"]) for m in data["markers"] if m["at"] and stamped]
    note = f"<p>{escape(data['note'])}</p>" if data["note"] else ""
    source = f"<p class='help'>from <code>{escape(data['source'])}</code></p>" if data["source"] else ""
    report = f"/sat/{job_href(page)}/report"
    return (note + _chart(loss, step_marks, title="Loss by step", x_label="step", y_label="loss",
                          chart_id="loss-chart")
            + _chart(rate, time_marks, title="Steps per second over time", x_label="seconds since the first log",
                     y_label="steps/s", chart_id="rate-chart") + source
            + "<h3>Metrics series</h3><p>Throughput, checkpoint stalls and persist time, CPU, memory and GPU per "
              "device, goodput and recovery per fault, from the series the job records every "
              f"<code>[sat] metrics_interval_seconds</code> (<a href='{escape(report)}' target='_blank'>open the "
              "job report</a>):</p>"
              f"<iframe id='report-frame' src='{escape(report)}' loading='lazy' title='job report' "
              "style='width:100%;height:1600px;border:1px solid #d0d7de'></iframe>")


def _tags(page: dict[str, Any], tag_errors: list[str] | None) -> str:
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in page["tags"].items())
    text = "\n".join(f"{k}={v}" for k, v in page["tags"].items())
    errors = "".join(f"<div class='error'>{escape(line)}</div>" for line in tag_errors or [])
    return (f"<table><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody>{rows}</tbody></table>"
            + ("" if rows else "<p>No tags.</p>")
            + f"<form method='post' action='/sat/{escape(job_href(page))}/tags'><label for='tags-text'>Edit tags "
              "(key=value, one per line)</label>"
              f"<textarea id='tags-text' name='tags' rows='5'>{escape(text)}</textarea>{errors}"
              "<p><button type='submit'>Save tags</button></p></form>")


def _actions(page: dict[str, Any]) -> str:
    href = f"/sat/{job_href(page)}"
    stop = page.get("stop_requested")
    running = page["run_state"] in ("queued", "running")
    parts = []
    if stop and page["status"] == JobStatus.STOPPED.value:
        parts.append(f"<p class='notice' id='stop-notice'>Stopped by {_cell(stop.get('by'))} (asked at "
                     f"{_cell(stop.get('at'))}).</p>")
    elif stop:
        parts.append(f"<p class='notice' id='stop-notice'>Stop requested by {_cell(stop.get('by'))} at "
                     f"{_cell(stop.get('at'))}: the training gets SIGTERM and writes a final checkpoint; the "
                     "status changes to Stopped when it has.</p>")
    elif running:
        parts.append(f"<form method='post' action='{escape(href)}/stop'><button class='danger' type='submit' "
                     "id='stop'>Stop</button></form> ")
    parts.append(f"<a class='button' href='{escape(href)}/delete' id='delete'>Delete</a>")
    return "<div class='actions'>" + "".join(parts) + "</div>"


def job_page_html(page: dict[str, Any], tag_errors: list[str] | None = None) -> str:
    """A job page: status (live), actions, and the tabs Details, Attempts, Checkpoints, Logs, Monitoring, Tags."""
    history = "".join(f"<tr><td>{_cell(e.get('at'))}</td><td>{_status(e.get('status'))}</td>"
                      f"<td>{_cell(e.get('attempt'))}</td><td>{_cell(e.get('reason'))}</td></tr>"
                      for e in page["history"])
    attempts = "".join(
        f"<tr><td>{a['attempt']}</td><td>{_cell(a['node'])}</td><td>{_cell(a['verdict'])}"
        + (f"<br><small>stopped by {_cell(a['stopped_by'])}</small>" if a.get("stopped_by") else "")
        + f"</td><td>{_cell(a['exit_code'])}</td><td>{_duration(a.get('duration_s'))}</td>"
        f"<td>{_cell(a['resumed_from_step'])}</td><td>{_cell(a['last_committed_step'])}</td>"
        f"<td>{_cell(a['reason'])}<div class='evidence'>"
        + "<br>".join(escape(line) for line in a["evidence"]) + "</div></td></tr>"
        for a in page["attempts"])
    checkpoints = "".join(
        f"<tr><td>{c['step']}</td><td>{_bytes(c['size_bytes'])}</td><td>{_cell(c['files'])}</td>"
        f"<td>{'yes' if c['mirrored'] else 'no'}</td>"
        f"<td>{'' if c['verified'] is None else ('yes' if c['verified'] else 'NO')}</td>"
        f"<td>{escape(c['note'])}</td></tr>" for c in page["checkpoints"]["steps"])
    grid = f"/dags/{quote(page['dag_id'], safe='')}/runs/{quote(page['run_id'], safe='')}"
    log_href = f"/sat/api/{job_href(page)}/log"
    api_href = f"/sat/api/{job_href(page)}"
    seen = f"{len(page['history'])}/{len(page['attempts'])}/{1 if page.get('stop_requested') else 0}/" \
           f"{page['run_state']}"
    terminal = json.dumps(sorted(s.value for s in TERMINAL))
    status = (f"<span id='status' class='status {escape((page['status'] or '').replace(' ', ''))}' "
              f"data-api='{escape(api_href)}' data-seen='{escape(seen)}' data-run-state='{escape(page['run_state'])}' "
              f"data-terminal='{escape(terminal)}'>{escape(page['status'] or '')}</span>")
    tabs = "".join(f"<a href='#{tab}' data-tab='{tab}'>{label}</a>" for tab, label in TABS)
    return _page(page["job"], (
        f"<p><a href='/sat/jobs'>Training Jobs</a></p><h1>{escape(page['job'])} {status}</h1>"
        f"<p>run {escape(page['run_id'])} · {_cell(page['learning_type'])} · {_cell(page['framework'])} · "
        f"{page['nodes']} node(s) · attempt <span id='attempt'>{_cell(page['attempt'])}</span> · started "
        f"{_cell(page['started'])} · {_duration(page['duration_s'])}</p>" + _actions(page)
        + f"<p class='tabs'>{tabs}<a href='{escape(grid)}' target='_top'>Airflow grid and task logs</a></p>"
        "<section class='tab' id='details'><h2>Details</h2><h3>Status history</h3><table><thead><tr><th>At</th>"
        f"<th>Status</th><th>Attempt</th><th>Reason</th></tr></thead><tbody>{history}</tbody></table>"
        f"<h3>Spec</h3><pre>{escape(json.dumps(page['spec'], indent=2))}</pre></section>"
        "<section class='tab' id='attempts'><h2>Attempts</h2><table><thead><tr><th>#</th><th>Node</th><th>Verdict</th>"
        "<th>Exit status</th><th>Duration</th><th>Resumed from step</th><th>Last committed step</th><th>Evidence</th>"
        f"</tr></thead><tbody>{attempts}</tbody></table></section>"
        "<section class='tab' id='checkpoints'><h2>Checkpoints</h2><table><thead><tr><th>Step</th><th>Size</th>"
        "<th>Files</th><th>Mirrored</th><th>Verified</th><th></th></tr></thead>"
        f"<tbody>{checkpoints}</tbody></table>"
        + ("" if checkpoints else "<p>No checkpoint committed yet.</p>")
        + f"<p>results: <code>{escape(page['results'])}</code></p></section>"
        "<section class='tab' id='logs'><h2>Logs</h2><p>One log for the whole job, every attempt in turn, each "
        f"starting with \"Starting dataset initialization\": <a href='{escape(log_href)}'>download job.log</a> "
        f"(uploaded when the run ends; <code>{escape(page['log'])}</code>). While it runs, the task logs in "
        f"<a href='{escape(grid)}' target='_top'>Airflow's grid</a>.</p></section>"
        f"<section class='tab' id='monitoring'><h2>Monitoring</h2>{_monitoring(page)}</section>"
        f"<section class='tab' id='tags'><h2>Tags</h2>{_tags(page, tag_errors)}</section>"),
        TABS_SCRIPT + LIVE_SCRIPT)


def delete_page(page: dict[str, Any]) -> str:
    """The Delete confirmation: what goes, what stays unless asked."""
    href = f"/sat/{job_href(page)}"
    running = page["run_state"] == "running"
    body = (f"<p><a href='{escape(href)}'>{escape(page['job'])}</a></p><h1>Delete {escape(page['job'])}?</h1>"
            f"<p>Run <code>{escape(page['run_id'])}</code> ({_status(page['status'])}) leaves the Training Jobs list "
            "and Airflow's history. Its results stay in Object Storage at "
            f"<code>{escape(page['results'])}</code> unless you tick the box.</p>")
    if running:
        body += ("<p class='error'>The job is running: stop it first; a running job cannot be deleted.</p>"
                 f"<p><a class='button' href='{escape(href)}'>Back</a></p>")
    else:
        body += (f"<form method='post' action='{escape(href)}/delete'><label><input type='checkbox' "
                 "name='delete_results' id='delete_results'>Also delete the results in Object Storage "
                 "(checkpoints, outputs, logs)</label><p class='actions'><button class='danger' type='submit' "
                 f"id='confirm-delete'>Delete</button> <a class='button' href='{escape(href)}'>Cancel</a></p></form>")
    return _page(f"Delete {page['job']}", body)


def deleted_page(job: str, run_id: str, removed_objects: int | None, at: datetime | None = None) -> str:
    """What Delete did."""
    kept = ("its results were kept in Object Storage" if removed_objects is None
            else f"{removed_objects} object(s) of its results were deleted from Object Storage")
    return _page("Deleted", f"<h1>Deleted</h1><p id='deleted'>{escape(job)} run {escape(run_id)} was deleted; "
                            f"{escape(kept)}.</p><p><a href='/sat/jobs'>Training Jobs</a></p>")
