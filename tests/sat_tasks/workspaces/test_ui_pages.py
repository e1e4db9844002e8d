"""The Workspaces page's pieces without a server: the form to a workspace mapping, problems per field, the list."""

from __future__ import annotations

from sat_tasks.core.workspaces import WorkspaceUse
from sat_tasks.spec import SpecError
from sat_tasks.spec.workspace import parse_workspace
from sat_tasks.ui.workspaces import (
    problems_by_field,
    workspace_from_form,
    workspace_row,
    workspaces_page,
)
from tests.sat_tasks.workspaces.conftest import WORKSPACE

FORM = {"name": "team-a", "description": "", "resources.server_type": "g2", "resources.gpus_per_node": "8",
        "resources.memory": "1600Gi", "resources.cpu": "100", "nodes": "3", "contract.start": "2026-01-01",
        "contract.end": "2099-12-31"}


def test_the_form_becomes_the_workspace_the_cli_would_write():
    assert parse_workspace(workspace_from_form(FORM)) == parse_workspace(WORKSPACE)


def test_each_problem_lands_on_its_input():
    try:
        parse_workspace(workspace_from_form({**FORM, "nodes": "two", "contract.end": "", "name": "A"}))
    except SpecError as exc:
        found = problems_by_field(exc.problems)
    assert set(found) == {"name", "nodes", "contract.end"}
    assert found["contract.end"] == ["contract.end: required field is missing"]


def test_the_list_shows_who_runs_and_waits_and_escapes_everything():
    ws = parse_workspace({**WORKSPACE, "description": "<script>x</script>"})
    row = workspace_row(ws, [WorkspaceUse("train-a", "r1", 2, "running", ("team-a-node-0", "team-a-node-1")),
                             WorkspaceUse("train-b", "r2", 1, "queued")])
    assert row["nodes_used"] == 2 and row["queued"] == [{"job": "train-b", "run_id": "r2", "nodes": 1}]
    html = workspaces_page([row], refusal="workspace team-a: cannot delete <it>")
    assert "<script>x" not in html and "&lt;script&gt;" in html
    assert "2 of 3" in html and "train-a (2 node(s))" in html and "train-b" in html
    assert "cannot delete &lt;it&gt;" in html
    assert "action='/sat/workspaces/team-a/nodes'" in html and "action='/sat/workspaces/team-a/delete'" in html
