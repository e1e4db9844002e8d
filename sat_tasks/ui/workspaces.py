"""The Workspaces page of the Training Jobs view: the list, the Create form, Edit node count, Delete (with refusals).

Server-rendered like the other pages (`sat_tasks.ui.pages`); every value escaped. The
store is the one the `sat workspace` command writes (`sat_tasks.io.workspaces`); who
runs or waits in a workspace comes from the local slot board and the Airflow runs
(`sat_tasks.ui.api` merges them).
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from sat_tasks.core.workspaces import WorkspaceUse
from sat_tasks.spec.loading import SpecProblem
from sat_tasks.spec.model import SERVER_TYPES
from sat_tasks.spec.workspace import WORKSPACE_NAME_PATTERN, Workspace
from sat_tasks.ui.pages import _page

# The Create form's inputs: (form name, label, spec path, help).
FORM_FIELDS = (
    ("name", "Workspace name", "name",
     "1-63 chars: lowercase letters, digits, '-' and '.', a letter or digit at both ends"),
    ("description", "Description", "description", "what the team uses it for (optional)"),
    ("resources.server_type", "Server type", "resources.server_type", "cpu, g2 (8x H100) or g3 (8x B300)"),
    ("resources.gpus_per_node", "GPUs per node", "resources.gpus_per_node", "0-8"),
    ("resources.memory", "Memory per node", "resources.memory", "a Kubernetes quantity, e.g. 1600Gi"),
    ("resources.cpu", "CPU cores per node", "resources.cpu", "e.g. 100"),
    ("nodes", "Number of nodes", "nodes", "1-64; distributed training from 2"),
    ("contract.start", "Contract start", "contract.start", "YYYY-MM-DD"),
    ("contract.end", "Contract end", "contract.end", "YYYY-MM-DD"),
    ("warm_pool.keep_alive_seconds", "Warm pool keep-alive (seconds)", "warm_pool.keep_alive_seconds",
     "optional, 1-3600: its jobs' runs stay warm this long for their next run (not Spot jobs)"),
)
NUMBERS = ("nodes", "resources.gpus_per_node", "warm_pool.keep_alive_seconds")
NAME = re.compile(WORKSPACE_NAME_PATTERN)
# On top of the view's style: the row's edit and delete forms on one line, a short node count input, a refusal box.
STYLE = """
td.row-actions,.date{white-space:nowrap}td.row-actions form{display:inline-block;margin-right:.6rem}
td.row-actions label{display:inline;margin:0 .3rem 0 0}td input.count{width:4.5rem}
.confirm{background:#fff8c5;border:1px solid #d4a72c;padding:.5rem .8rem;border-radius:6px;margin:1rem 0}
.confirm form{display:inline;margin-right:.6rem}
.refusal{background:#ffebe9;border:1px solid #cf222e;padding:.5rem .8rem;border-radius:6px;font-size:.9rem}
"""
DEFAULTS = {"resources.server_type": "cpu", "resources.gpus_per_node": "0", "resources.memory": "16Gi",
            "resources.cpu": "4", "nodes": "2"}


def workspace_from_form(values: dict[str, str]) -> dict[str, Any]:
    """The form's values as a workspace mapping (numbers stay text when they are not: the model says why)."""
    data: dict[str, Any] = {}
    for form_name, _label, path, _help in FORM_FIELDS:
        value = (values.get(form_name) or "").strip()
        if value == "":
            continue  # optional, or required and left empty: the model reports it missing
        if path in NUMBERS and value.lstrip("-").isdigit():
            value = int(value)
        target = data
        *parents, leaf = path.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return data


def problems_by_field(problems: list[SpecProblem]) -> dict[str, list[str]]:
    """Each problem under the form input it is about (`contract.end: ...` under contract.end)."""
    known = {path for _f, _l, path, _h in FORM_FIELDS}
    found: dict[str, list[str]] = {}
    for problem in problems:
        field = problem.field if problem.field in known else next(
            (path for path in known if problem.field.startswith(path + ".")), "name")
        found.setdefault(field, []).append(f"{problem.field}: {problem.rule}")
    return found


def done_notice(*, created: str | None = None, resized: str | None = None, deleted: str | None = None) -> str | None:
    """The notice the list shows after a change (the redirect's query names the workspace; the rest is read here)."""
    from sat_tasks.io.workspaces import WorkspaceStore

    name = created or resized or deleted
    if not name or len(name) > 63 or not NAME.match(name):
        return None
    if deleted:
        return f"workspace {name} deleted" if WorkspaceStore().find(name) is None else None
    workspace = WorkspaceStore().find(name)
    if workspace is None:
        return None
    if created:
        return f"workspace {name} created: {workspace.nodes} node(s)"
    return f"workspace {name}: {workspace.nodes} node(s) from the next job that starts"


def workspace_row(workspace: Workspace, uses: list[WorkspaceUse]) -> dict[str, Any]:
    """One workspace for the list and the JSON API: its fields, who runs and who waits."""
    return {
        **workspace.to_dict(),
        "running": [{"job": u.job, "run_id": u.run_id, "nodes": u.slots, "on": list(u.nodes)}
                    for u in uses if u.state == "running"],
        "queued": [{"job": u.job, "run_id": u.run_id, "nodes": u.slots} for u in uses if u.state == "queued"],
        "nodes_used": sum(u.slots for u in uses if u.state == "running"),
    }


def _warm(row: dict[str, Any]) -> str:
    warm = row.get("warm_pool") or {}
    seconds = warm.get("keep_alive_seconds")
    return f"<br><small>warm pool: {int(seconds)} s</small>" if seconds else ""


def _input(form_name: str, label: str, help_: str, value: str, errors: list[str]) -> str:
    name = escape(form_name)
    invalid = f" class='invalid' aria-invalid='true' aria-describedby='error-{name}'" if errors else ""
    if form_name == "resources.server_type":
        options = "".join(f"<option value='{escape(o)}'{' selected' if o == value else ''}>{escape(o)}</option>"
                          for o in SERVER_TYPES)
        control = f"<select id='{name}' name='{name}'{invalid}>{options}</select>"
    else:
        control = f"<input type='text' id='{name}' name='{name}' value='{escape(value)}'{invalid}>"
    lines = (f"<div class='error' id='error-{name}'>" + "<br>".join(escape(line) for line in errors) + "</div>"
             if errors else "")
    return (f"<div class='field'><label for='{name}'>{escape(label)}</label>{control}{lines}"
            f"<div class='help'>{escape(help_)}</div></div>")


def workspaces_page(rows: list[dict[str, Any]], *, values: dict[str, str] | None = None,
                    errors: dict[str, list[str]] | None = None, notice: str | None = None,
                    refusal: str | None = None, confirm_delete: str | None = None) -> str:
    """The list (with Edit node count and Delete per row) and the Create form; a refusal or notice on top.

    `confirm_delete`: the name whose Delete asks first (a box on top with the button that deletes). Not a
    script confirm(): Airflow shows the page in an iframe whose sandbox allows no dialogs.
    """
    errors = errors or {}
    body = []
    for row in rows:
        name = escape(row["name"])
        running = "; ".join(f"{r['job']} ({r['nodes']} node(s))" for r in row["running"]) or "none"
        queued = ", ".join(q["job"] for q in row["queued"]) or "none"
        res = row["resources"]
        body.append(
            f"<tr id='ws-{name}'><td>{name}<br><small>{escape(row.get('description') or '')}</small></td>"
            f"<td>{escape(res['server_type'])}: {res['gpus_per_node']} GPU(s), {escape(res['memory'])}, "
            f"{escape(str(res['cpu']))} CPU{_warm(row)}</td>"
            f"<td>{row['nodes_used']} of {row['nodes']}</td>"
            f"<td><span class='date'>{escape(row['contract']['start'])}</span> to "
            f"<span class='date'>{escape(row['contract']['end'])}</span></td>"
            f"<td>{escape(running)}</td><td>{escape(queued)}</td>"
            f"<td class='row-actions'><form method='post' action='/sat/workspaces/{name}/nodes' novalidate>"
            f"<label for='nodes-{name}'>Nodes</label> "
            f"<input type='number' class='count' id='nodes-{name}' name='nodes' value='{row['nodes']}' min='1' "
            f"max='64'> <button type='submit'>Save node count</button></form>"
            f"<form method='post' action='/sat/workspaces/{name}/delete'>"
            f"<button class='danger' type='submit'>Delete</button></form></td></tr>")
    table = ("<table><thead><tr><th>Workspace</th><th>Per node</th><th>Nodes used</th><th>Contract</th>"
             "<th>Running</th><th>Queued</th><th>Actions</th></tr></thead><tbody>" + "".join(body)
             + "</tbody></table>") if rows else "<p>No Training Workspaces yet: create one below.</p>"
    fresh = values is None
    inputs = "".join(
        _input(form_name, label, help_, (DEFAULTS.get(form_name, "") if fresh else values.get(form_name, "")),
               errors.get(path, []))
        for form_name, label, path, help_ in FORM_FIELDS)
    count = sum(len(v) for v in errors.values())
    summary = f"<p class='error' role='alert'>{count} problem(s): nothing was created.</p>" if count else ""
    return _page("Workspaces", (
        f"<style>{STYLE}</style><p><a href='/sat/jobs'>Training Jobs</a></p><h1>Training Workspaces</h1>"
        "<p>Nodes reserved for a team. Jobs name their workspace (<code>workspace: NAME</code>), run only on its "
        "nodes and queue for them (one slot per node). A new node count counts for the next job that starts.</p>"
        + (f"<p class='error refusal' role='alert' id='refusal'>{escape(refusal)}</p>" if refusal else "")
        + (f"<p class='notice' id='notice'>{escape(notice)}</p>" if notice else "")
        + (_confirm_box(confirm_delete) if confirm_delete else "")
        + table + "<h2>Create Workspace</h2>" + summary
        + "<form method='post' action='/sat/workspaces' novalidate><fieldset><legend>Workspace</legend>"
        + inputs + "</fieldset><p class='actions'><button class='primary' type='submit'>Create Workspace</button>"
          "</p></form>"))


def _confirm_box(name: str) -> str:
    """Delete asks first: what goes, what stays, and the button that deletes (or Cancel)."""
    name = escape(name)
    return (f"<div class='confirm' id='confirm-box' role='alertdialog' aria-labelledby='confirm-text'>"
            f"<p id='confirm-text'>Delete workspace <strong>{name}</strong>? Its definition ({name}.yaml) and its "
            f"Airflow pool sat-workspace-{name} are deleted; jobs that name it can no longer start. Refused while "
            f"jobs run or wait in it.</p><form method='post' action='/sat/workspaces/{name}/delete'>"
            f"<input type='hidden' name='confirm' value='yes'>"
            f"<button class='danger' id='confirm-delete' type='submit'>Delete workspace {name}</button></form>"
            f"<a class='button' href='/sat/workspaces'>Cancel</a></div>")
