"""Workspace rules: the model's field rules, what a job may ask of its workspace, FIFO queueing, edit/delete refusals."""

from __future__ import annotations

import datetime as dt

import pytest

from sat_tasks.core.workspaces import (
    Holding,
    SlotRequest,
    WorkspaceUse,
    admit,
    delete_refusal,
    job_problems,
    merge_uses,
    resize_refusal,
    workspace_nodes,
)
from sat_tasks.spec import SpecError, parse_spec
from sat_tasks.spec.workspace import load_workspace, parse_workspace
from tests.sat_tasks.workspaces.conftest import WORKSPACE, job_spec
from tests.support.paths import REPO

IN_CONTRACT = dt.date(2026, 6, 1)


def _ws(**overrides):
    return parse_workspace({**WORKSPACE, **overrides})


def _problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_workspace(data, source="ws.yaml")
    return [str(p) for p in caught.value.problems]


# ---- the model --------------------------------------------------------------------------------
def test_example_workspaces_load():
    files = sorted((REPO / "include" / "workspaces").glob("*.yaml"))
    assert files
    for path in files:
        assert load_workspace(path).name == path.stem


@pytest.mark.parametrize("change, expected", [
    pytest.param({"name": "Team_A"}, "name: must be 1-63 chars of lowercase letters", id="name-chars"),
    pytest.param({"name": "a" * 64}, "name: must be 1-63 chars", id="name-too-long"),
    pytest.param({"name": "-team"}, "name: must be 1-63 chars", id="name-starts-with-dash"),
    pytest.param({"nodes": 0}, "nodes: must be between 1 and 64", id="no-nodes"),
    pytest.param({"resources": {"server_type": "g2", "gpus_per_node": 9}}, "resources.gpus_per_node: must be between 0 and 8",
                 id="too-many-gpus"),
    pytest.param({"resources": {"server_type": "g2", "gpus_per_node": 0}},
                 "resources.gpus_per_node: must be >= 1 on a GPU server type", id="gpu-server-without-gpus"),
    pytest.param({"resources": {"server_type": "g9"}}, "resources.server_type: must be one of", id="server-type"),
    pytest.param({"resources": {"memory": "lots"}}, "resources.memory: must be a Kubernetes quantity", id="memory"),
    pytest.param({"contract": {"start": "2026-13-01", "end": "2026-12-31"}}, "contract.start: must be a date YYYY-MM-DD",
                 id="bad-date"),
    pytest.param({"contract": {"start": "2026-06-01", "end": "2026-05-31"}},
                 "contract.end: must be on or after start (2026-06-01)", id="end-before-start"),
    pytest.param({"contract": {"start": "2026-06-01"}}, "contract.end: required field is missing", id="no-end"),
    pytest.param({"warm": True}, "warm: unknown field", id="unknown-field"),
])
def test_workspace_field_rules(change, expected):
    problems = _problems({**WORKSPACE, **change})
    assert any(p.startswith(expected) for p in problems), problems


def test_every_problem_is_reported_at_once():
    problems = _problems({"name": "Bad", "nodes": 0, "contract": {"start": "2026-02-01", "end": "2026-01-01"}})
    assert [p.split(":")[0] for p in problems] == ["name", "nodes", "contract.end"]


def test_name_of_63_chars_with_dots_is_valid():
    assert _ws(name="a." + "b" * 61).name == "a." + "b" * 61


def test_job_names_its_workspace_with_the_same_rule():
    assert parse_spec(job_spec()).workspace == "team-a"
    with pytest.raises(SpecError, match="workspace: must be a workspace name"):
        parse_spec(job_spec(workspace="Team A"))


# ---- what a job may ask -----------------------------------------------------------------------
def test_a_job_that_fits_has_no_problems():
    assert job_problems(parse_spec(job_spec()), _ws(), IN_CONTRACT) == []
    assert job_problems(parse_spec(job_spec(workspace=None)), None, IN_CONTRACT) == []


@pytest.mark.parametrize("spec, workspace, expected", [
    pytest.param(job_spec(nodes=4), {}, "nodes: the job asks for 4 nodes; workspace team-a has 3", id="nodes"),
    pytest.param(job_spec(resources={"server_type": "g3", "gpus_per_node": 8}), {},
                 "resources.server_type: the job asks for g3; workspace team-a has g2 nodes", id="server-type"),
    pytest.param(job_spec(), {"resources": {**WORKSPACE["resources"], "gpus_per_node": 4}},
                 "resources.gpus_per_node: the job asks for 8 GPUs per node; workspace team-a has 4", id="gpus"),
    pytest.param(job_spec(resources={"server_type": "g2", "gpus_per_node": 8, "memory": "1600Gi",
                                     "shared_memory": "1Gi"}), {},
                 "resources.memory: the job asks for 1600Gi + 1Gi shared memory per node; workspace team-a has 1600Gi",
                 id="memory-with-shm"),
])
def test_a_job_asking_more_than_the_workspace_has_is_refused_with_the_numbers(spec, workspace, expected):
    problems = [str(p) for p in job_problems(parse_spec(spec), _ws(**workspace), IN_CONTRACT)]
    assert problems == [expected]


@pytest.mark.parametrize("day", [dt.date(2025, 12, 31), dt.date(2100, 1, 1)], ids=["before", "after"])
def test_a_job_outside_the_contract_is_refused_with_the_dates(day):
    problems = [str(p) for p in job_problems(parse_spec(job_spec()), _ws(), day)]
    assert problems == [f"workspace: workspace team-a's contract runs 2026-01-01 to 2099-12-31; "
                        f"the job starts {day.isoformat()}, outside it"]


def test_contract_days_at_both_ends_count():
    job = parse_spec(job_spec())
    assert job_problems(job, _ws(), dt.date(2026, 1, 1)) == job_problems(job, _ws(), dt.date(2026, 12, 31)) == []


def test_an_unknown_workspace_is_named_with_those_there_are():
    problems = job_problems(parse_spec(job_spec(workspace="team-b")), None, IN_CONTRACT, known=["team-a", "x"])
    assert [str(p) for p in problems] == ["workspace: no workspace named 'team-b' (workspaces: team-a, x)"]


# ---- queueing ---------------------------------------------------------------------------------
def _req(ticket: str, slots: int, *, job: str | None = None, exclude=(), failover=False) -> SlotRequest:
    return SlotRequest(ticket=ticket, job=job or f"job-{ticket}", run_id=f"run-{ticket}", attempt=1, slots=slots,
                       exclude=tuple(exclude), failover=failover)


def test_one_slot_per_node_and_first_in_first_out():
    ws = _ws(nodes=3)
    a, b, c = _req("a", 2), _req("b", 2), _req("c", 1)
    first = admit(ws, "a", [a, b, c], [])
    assert first.nodes == ("team-a-node-0", "team-a-node-1")
    held = [Holding(a, first.nodes)]
    # b (2 nodes) does not fit the one node left; c would, but waits behind b (first in, first out)
    waiting_b = admit(ws, "b", [b, c], held)
    assert not waiting_b.admitted and "2 node(s) needed, 1 free of 3 (2 used by job-a)" in waiting_b.reason
    waiting_c = admit(ws, "c", [b, c], held)
    assert not waiting_c.admitted and waiting_c.position == 2 and "behind job-b" in waiting_c.reason
    # a ends: b starts, then c fits in the node left
    assert admit(ws, "b", [b, c], []).nodes == ("team-a-node-0", "team-a-node-1")
    assert admit(ws, "c", [c], [Holding(b, ("team-a-node-0", "team-a-node-1"))]).nodes == ("team-a-node-2",)


def test_a_node_count_edit_counts_for_the_next_job_that_starts():
    a, b = _req("a", 2), _req("b", 2)
    held = [Holding(a, ("team-a-node-0", "team-a-node-1"))]
    assert not admit(_ws(nodes=3), "b", [b], held).admitted
    assert admit(_ws(nodes=4), "b", [b], held).nodes == ("team-a-node-2", "team-a-node-3")
    # shrunk below what is held: the holder keeps its nodes, the next job waits
    assert not admit(_ws(nodes=2), "b", [b], held).admitted


def test_excluded_nodes_count_against_the_workspace():
    ws = _ws(nodes=3)
    retry = _req("r", 2, exclude=["team-a-node-0"], failover=True)
    assert admit(ws, "r", [retry], []).nodes == ("team-a-node-1", "team-a-node-2")
    # another job holds node 2: one healthy node free, the failover waits and says so
    other = _req("o", 1)
    answer = admit(ws, "r", [retry], [Holding(other, ("team-a-node-2",))])
    assert not answer.admitted and answer.lacks_healthy_nodes and "1 excluded" in answer.reason


def test_a_request_that_cannot_fit_the_healthy_nodes_waits_aside_without_blocking_others():
    ws = _ws(nodes=3)
    stuck = _req("s", 2, exclude=["team-a-node-0", "team-a-node-1"], failover=True)
    later = _req("l", 1)
    answer = admit(ws, "s", [stuck, later], [])
    assert not answer.admitted and answer.lacks_healthy_nodes
    assert "2 of them excluded after failed attempts (team-a-node-0, team-a-node-1)" in answer.reason
    assert admit(ws, "l", [stuck, later], []).nodes == ("team-a-node-0",)
    # the workspace grows: capacity returns and the failover fits
    assert admit(_ws(nodes=4), "s", [stuck], []).nodes == ("team-a-node-2", "team-a-node-3")


def test_a_preferred_free_node_is_taken_first():
    """The node a warm run kept comes first when it is free; otherwise the request takes what is free."""
    ws = _ws(nodes=3)
    warm = SlotRequest(ticket="w", job="job-w", run_id="run-w", attempt=1, slots=2, prefer=("team-a-node-2",))
    assert admit(ws, "w", [warm], []).nodes == ("team-a-node-2", "team-a-node-0")
    other = _req("o", 1)
    assert admit(ws, "w", [warm], [Holding(other, ("team-a-node-2",))]).nodes == ("team-a-node-0", "team-a-node-1")


def test_workspace_nodes_are_named_after_it():
    assert workspace_nodes(_ws(nodes=2)) == ["team-a-node-0", "team-a-node-1"]


# ---- refusals ---------------------------------------------------------------------------------
USES = [WorkspaceUse("train-a", "run-1", 2, "running", ("team-a-node-0", "team-a-node-1")),
        WorkspaceUse("train-b", "run-2", 1, "queued")]


def test_shrinking_below_what_runs_is_refused_with_what_runs_there():
    refusal = resize_refusal(_ws(), 1, USES)
    assert refusal == ("workspace team-a: cannot shrink to 1 node(s): running jobs use 2: train-a (run-1, running, "
                       "2 node(s) on team-a-node-0, team-a-node-1)")
    assert resize_refusal(_ws(), 2, USES) is None  # queued jobs hold nothing yet
    assert resize_refusal(_ws(), 5, USES) is None


def test_deleting_with_a_running_or_queued_job_is_refused_with_their_names():
    refusal = delete_refusal(_ws(), USES)
    assert "train-a (run-1, running" in refusal and "train-b (run-2, queued, 1 node(s))" in refusal
    assert delete_refusal(_ws(), []) is None


def test_uses_from_two_sources_are_merged_per_run():
    from_db = [WorkspaceUse("train-a", "run-1", 2, "queued"), WorkspaceUse("train-c", "run-3", 1, "running")]
    merged = merge_uses(USES, from_db)
    assert [(u.job, u.state) for u in merged] == [("train-a", "running"), ("train-b", "queued"), ("train-c", "running")]
