"""HTML of the Training Jobs view: the list and a job page, rendered on the server from `ui.jobs`' rows and pages.

Plain HTML and CSS, no script: the page works in any browser and in Airflow's iframe for
plugin views. Every value is escaped; nothing here reads a secret (the spec holds none).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote

from sat_tasks.core.status import JobStatus

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2328}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid #d0d7de}
th{background:#f6f8fa}.status{font-weight:600}.Completed{color:#1a7f37}.Failed,.Pending-maxretriesexceeded,
.Pending-internalerror,.Pending-imagepullbackoff{color:#cf222e}.Running{color:#0969da}
.tabs a{margin-right:1rem}section{margin-top:1.5rem}pre{background:#f6f8fa;padding:.6rem;overflow:auto}
.evidence{font-family:monospace;font-size:.85rem}
"""


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)} - SAT</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _status(word: str | None) -> str:
    word = word or ""
    return f"<span class='status {escape(word.replace(' ', ''))}'>{escape(word)}</span>"


def _cell(value: Any) -> str:
    return "" if value is None else escape(str(value))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def job_href(row: dict[str, Any]) -> str:
    return f"jobs/{quote(row['dag_id'], safe='')}/runs/{quote(row['run_id'], safe='')}"


def list_page(rows: list[dict[str, Any]], status: str | None = None) -> str:
    """The Training Jobs list: newest first, a status filter, one row per run."""
    options = "".join(f"<option value='{escape(s.value)}'{' selected' if s.value == status else ''}>"
                      f"{escape(s.value)}</option>" for s in JobStatus)
    head = ("<th>Job</th><th>Learning type</th><th>Framework</th><th>Nodes</th><th>Status</th><th>Attempt</th>"
            "<th>Last checkpoint</th><th>Started</th><th>Duration</th><th>Tags</th><th>Next run</th>")
    body = []
    for row in rows:
        tags = ", ".join(f"{k}={v}" for k, v in row["tags"].items())
        body.append(
            f"<tr><td><a href='{escape(job_href(row))}'>{escape(row['job'])}</a><br><small>{escape(row['run_id'])}"
            f"</small></td><td>{_cell(row['learning_type'])}</td><td>{_cell(row['framework'])}</td>"
            f"<td>{_cell(row['nodes'])}</td><td>{_status(row['status'])}</td><td>{_cell(row['attempt'])}</td>"
            f"<td>{_cell(row['last_checkpoint_step'])}</td><td>{_cell(row['started'])}</td>"
            f"<td>{_duration(row['duration_s'])}</td><td>{escape(tags)}</td><td>{_cell(row['next_run'])}</td></tr>")
    empty = "" if rows else "<p>No Training Jobs yet.</p>"
    return _page("Training Jobs", (
        "<h1>Training Jobs</h1>"
        f"<form method='get'><label>Status <select name='status' onchange='this.form.submit()'>"
        f"<option value=''>any</option>{options}</select></label> <button>Filter</button></form>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{empty}"))


def job_page_html(page: dict[str, Any]) -> str:
    """A job page: Details (spec, status history), Attempts (node, verdict, evidence), Checkpoints, links."""
    history = "".join(f"<tr><td>{_cell(e.get('at'))}</td><td>{_status(e.get('status'))}</td>"
                      f"<td>{_cell(e.get('attempt'))}</td><td>{_cell(e.get('reason'))}</td></tr>"
                      for e in page["history"])
    attempts = "".join(
        f"<tr><td>{a['attempt']}</td><td>{_cell(a['node'])}</td><td>{_cell(a['verdict'])}</td>"
        f"<td>{_cell(a['exit_code'])}</td><td>{_cell(a['resumed_from_step'])}</td>"
        f"<td>{_cell(a['last_committed_step'])}</td><td>{_cell(a['reason'])}<div class='evidence'>"
        + "<br>".join(escape(line) for line in a["evidence"]) + "</div></td></tr>"
        for a in page["attempts"])
    steps = ", ".join(str(s) for s in page["checkpoints"]["committed_steps"]) or "none yet"
    grid = f"/dags/{quote(page['dag_id'], safe='')}/runs/{quote(page['run_id'], safe='')}"
    log_href = f"/sat/api/{job_href(page)}/log"
    return _page(page["job"], (
        f"<p><a href='../../../jobs'>Training Jobs</a></p><h1>{escape(page['job'])} {_status(page['status'])}</h1>"
        f"<p>run {escape(page['run_id'])} · {_cell(page['learning_type'])} · {_cell(page['framework'])} · "
        f"{page['nodes']} node(s) · attempt {_cell(page['attempt'])} · started {_cell(page['started'])} · "
        f"{_duration(page['duration_s'])}</p>"
        "<p class='tabs'><a href='#details'>Details</a><a href='#attempts'>Attempts</a>"
        f"<a href='#checkpoints'>Checkpoints</a><a href='#logs'>Logs</a>"
        f"<a href='{escape(grid)}' target='_top'>Airflow grid and task logs</a></p>"
        "<section id='details'><h2>Details</h2><h3>Status history</h3><table><thead><tr><th>At</th><th>Status</th>"
        f"<th>Attempt</th><th>Reason</th></tr></thead><tbody>{history}</tbody></table>"
        f"<h3>Spec</h3><pre>{escape(json.dumps(page['spec'], indent=2))}</pre></section>"
        "<section id='attempts'><h2>Attempts</h2><table><thead><tr><th>#</th><th>Node</th><th>Verdict</th>"
        "<th>Exit status</th><th>Resumed from step</th><th>Last committed step</th><th>Evidence</th></tr></thead>"
        f"<tbody>{attempts}</tbody></table></section>"
        f"<section id='checkpoints'><h2>Checkpoints</h2><p>committed steps: {escape(steps)}; last mirrored to "
        f"Object Storage: {_cell(page['checkpoints']['last_mirrored_step'])}</p>"
        f"<p>results: <code>{escape(page['results'])}</code></p></section>"
        "<section id='logs'><h2>Logs</h2><p>One log for the whole job, every attempt in turn, each starting with "
        f"\"Starting dataset initialization\": <a href='{escape(log_href)}'>download job.log</a> (uploaded when the "
        f"run ends; <code>{escape(page['log'])}</code>). While it runs, the task logs in Airflow's grid.</p></section>"))
