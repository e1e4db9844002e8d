"""The Workspaces page of the Training Jobs view: the list, the Create form, Edit node count, Delete (with refusals).

Rendered from templates/workspaces.html like the other pages (`sat_tasks.ui.pages`); every
value escaped. The store is the one the `sat workspace` command writes
(`sat_tasks.io.workspaces`); who runs or waits in a workspace comes from the local slot
board and the Airflow runs (`sat_tasks.ui.routers.workspaces` merges them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sat_tasks.core.workspaces import WorkspaceUse
from sat_tasks.io.workspaces import WorkspaceStore
from sat_tasks.spec.loading import SpecProblem
from sat_tasks.spec.model import SERVER_TYPES
from sat_tasks.spec.workspace import WORKSPACE_NAME_PATTERN, Workspace
from sat_tasks.ui.templating import render

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


def workspace_row(workspace: Workspace, uses: list[WorkspaceUse], used: dict[str, float] | None = None
                  ) -> dict[str, Any]:
    """One workspace for the list and the JSON API: its fields, who runs and who waits, and `usage`: the GPU-hours,
    node-hours and number of its jobs' runs (`run_index.usage_by_workspace`; zeros when none ran there)."""
    return {
        **workspace.to_dict(),
        "running": [{"job": u.job, "run_id": u.run_id, "nodes": u.slots, "on": list(u.nodes)}
                    for u in uses if u.state == "running"],
        "queued": [{"job": u.job, "run_id": u.run_id, "nodes": u.slots} for u in uses if u.state == "queued"],
        "nodes_used": sum(u.slots for u in uses if u.state == "running"),
        "usage": dict(used) if used else {"gpu_hours": 0.0, "node_hours": 0.0, "runs": 0},
    }


@dataclass(frozen=True)
class InputView:
    """One input of the Create form as the template shows it."""

    name: str
    label: str
    help: str
    value: str
    errors: list[str]
    options: tuple[str, ...] = ()


def workspaces_page(rows: list[dict[str, Any]], *, values: dict[str, str] | None = None,
                    errors: dict[str, list[str]] | None = None, notice: str | None = None,
                    refusal: str | None = None, confirm_delete: str | None = None) -> str:
    """The list (with Edit node count and Delete per row) and the Create form; a refusal or notice on top.

    `confirm_delete`: the name whose Delete asks first (a box on top with the button that deletes).
    """
    errors = errors or {}
    fields = [InputView(form_name, label, help_, DEFAULTS.get(form_name, "") if values is None
                        else values.get(form_name, ""), errors.get(path, []),
                        tuple(SERVER_TYPES) if form_name == "resources.server_type" else ())
              for form_name, label, path, help_ in FORM_FIELDS]
    return render("workspaces.html", rows=rows, fields=fields, notice=notice, refusal=refusal,
                  confirm_delete=confirm_delete, problems=sum(len(v) for v in errors.values()))
