"""The workspace store (YAML files) and the local backend's slot board: queueing, release, refusals, the job status while waiting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import yaml

from sat_tasks.backends.local.workspace import attempt_nodes, node_pool
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.errors import JobStopped
from sat_tasks.io.workspaces import (
    SlotBoard,
    WorkspaceNotFound,
    WorkspaceRefused,
    WorkspaceStore,
    WorkspaceWaitTimeout,
)
from sat_tasks.pipeline.steps import check_workspace
from sat_tasks.spec import SpecError, parse_spec
from tests.sat_tasks.workspaces.conftest import job_spec

DEADLINE = 60.0  # generous: what a test waits for an event at most


def wait_for(predicate, what: str, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---- the store --------------------------------------------------------------------------------
def test_create_list_get_and_the_written_yaml(sat_dirs, workspace_data):
    store = WorkspaceStore()
    created = store.create(workspace_data)
    path = sat_dirs / "workspaces" / "team-a.yaml"
    assert yaml.safe_load(path.read_text())["contract"] == {"start": "2026-01-01", "end": "2099-12-31"}
    assert [w.name for w in store.list()] == ["team-a"]
    assert store.get("team-a") == created
    assert not list((sat_dirs / "workspaces").glob(".*.tmp"))  # written through a temp file and a rename


def test_create_refuses_a_taken_name_and_broken_fields(sat_dirs, workspace_data):
    store = WorkspaceStore()
    store.create(workspace_data)
    with pytest.raises(SpecError, match="name: a workspace named 'team-a' exists already"):
        store.create(workspace_data)
    with pytest.raises(SpecError) as caught:
        store.create({**workspace_data, "name": "team-b", "nodes": 0})
    assert [str(p) for p in caught.value.problems] == ["nodes: must be between 1 and 64"]
    assert not (sat_dirs / "workspaces" / "team-b.yaml").exists()


def test_unknown_workspace_and_broken_files_are_reported(sat_dirs, workspace_data):
    store = WorkspaceStore()
    store.create(workspace_data)
    (sat_dirs / "workspaces" / "broken.yaml").write_text("name: broken\nnodes: -1\n")
    with pytest.raises(WorkspaceNotFound, match=r"no workspace named 'nope' \(workspaces: team-a\)"):
        store.get("nope")
    assert [w.name for w in store.list()] == ["team-a"]
    problems = store.problems()
    assert list(problems) == [str(sat_dirs / "workspaces" / "broken.yaml")]
    assert "nodes: must be between 1 and 64" in next(iter(problems.values()))


def test_edit_and_delete_are_refused_while_jobs_use_the_workspace(sat_dirs, workspace_data):
    store = WorkspaceStore()
    store.create(workspace_data)
    board = SlotBoard("team-a")
    running = board.enqueue(job="train-a", run_id="run-1", attempt=1, slots=2)
    assert board.poll(store.get("team-a"), running).admitted
    board.enqueue(job="train-b", run_id="run-2", attempt=1, slots=3)
    with pytest.raises(WorkspaceRefused, match=r"cannot shrink to 1 node\(s\): running jobs use 2: train-a \(run-1"):
        store.set_nodes("team-a", 1, board.uses())
    with pytest.raises(WorkspaceRefused, match=r"train-a \(run-1, running.*train-b \(run-2, queued"):
        store.delete("team-a", board.uses())
    assert store.set_nodes("team-a", 2, board.uses()).nodes == 2
    with pytest.raises(SpecError, match="nodes: must be between 1 and 64"):
        store.set_nodes("team-a", 0)
    board.release(running)
    assert [u.job for u in board.uses()] == ["train-b"]
    with pytest.raises(WorkspaceRefused, match="train-b"):
        store.delete("team-a", board.uses())
    board.release(board_ticket(board, "train-b"))
    store.delete("team-a", board.uses())
    assert store.list() == []


def board_ticket(board: SlotBoard, job: str) -> str:
    import json

    state = json.loads(board.file.read_text())
    return next(e["request"]["ticket"] for e in state["queue"] + state["holdings"] if e["request"]["job"] == job)


# ---- the slot board ---------------------------------------------------------------------------
def test_a_dead_holders_nodes_come_back(sat_dirs, workspace_data):
    import json

    ws = WorkspaceStore().create(workspace_data)
    board = SlotBoard("team-a")
    ticket = board.enqueue(job="killed", run_id="run-k", attempt=1, slots=3)
    assert board.poll(ws, ticket).admitted
    assert [u.job for u in board.uses()] == ["killed"]
    # its process is gone (a killed task): an exited child's pid stands in for it
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    state = json.loads(board.file.read_text())
    state["holdings"][0]["owner"]["pid"] = int(gone.stdout)
    board.file.write_text(json.dumps(state))
    assert board.uses() == []
    fresh = board.enqueue(job="next", run_id="run-n", attempt=1, slots=3)
    assert board.poll(ws, fresh).nodes == ("team-a-node-0", "team-a-node-1", "team-a-node-2")


def test_jobs_start_in_order_as_capacity_frees(sat_dirs, workspace_data):
    """Three jobs of 2, 2 and 1 nodes on 3 nodes: the second waits for the first; the third waits behind it."""
    store = WorkspaceStore()
    store.create(workspace_data)
    board = SlotBoard("team-a")
    started: list[str] = []
    waits: dict[str, list[str]] = {"b": [], "c": []}
    release = {name: threading.Event() for name in "abc"}
    errors: list[BaseException] = []

    def job(name: str, slots: int) -> None:
        try:
            ticket, _nodes = board.acquire(lambda: store.get("team-a"), job=f"job-{name}", run_id=f"run-{name}",
                                          attempt=1, slots=slots, deadline_seconds=DEADLINE,
                                          on_wait=lambda a: waits.setdefault(name, []).append(a.reason),
                                          poll_seconds=0.05)
            started.append(name)
            release[name].wait(DEADLINE)
            board.release(ticket)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = {"a": threading.Thread(target=job, args=("a", 2))}
    threads["a"].start()
    wait_for(lambda: started == ["a"], "job a to start")
    for name, slots in (("b", 2), ("c", 1)):
        threads[name] = threading.Thread(target=job, args=(name, slots))
        threads[name].start()
        wait_for(lambda n=name: waits[n], f"job {name} to queue")
    assert "2 node(s) needed, 1 free of 3 (2 used by job-a)" in waits["b"][0]
    assert "position 2, behind job-b" in waits["c"][0]  # c would fit, but waits its turn
    assert started == ["a"]
    release["a"].set()
    wait_for(lambda: "b" in started and "c" in started, "jobs b and c to start")
    assert started == ["a", "b", "c"]
    assert {u.job: u.nodes for u in board.uses()} == {
        "job-b": ("team-a-node-0", "team-a-node-1"), "job-c": ("team-a-node-2",)}
    for name in "bc":
        release[name].set()
    for thread in threads.values():
        thread.join(DEADLINE)
    assert not errors and board.uses() == []


def test_the_board_keeps_a_requests_preference(sat_dirs, workspace_data):
    ws = WorkspaceStore().create(workspace_data)
    board = SlotBoard("team-a")
    ticket = board.enqueue(job="warm", run_id="run-w", attempt=1, slots=1, prefer=["team-a-node-1"])
    assert board.poll(ws, ticket).nodes == ("team-a-node-1",)


def test_waiting_past_the_deadline_leaves_the_queue(sat_dirs, workspace_data):
    store = WorkspaceStore()
    store.create({**workspace_data, "nodes": 1})
    board = SlotBoard("team-a")
    with pytest.raises(WorkspaceWaitTimeout, match=r"waited 0s for the nodes of workspace team-a.*too few healthy"):
        board.acquire(lambda: store.get("team-a"), job="j", run_id="r", attempt=2, slots=1,
                      exclude=["team-a-node-0"], failover=True, deadline_seconds=0, poll_seconds=0.01)
    assert board.uses() == []


# ---- the local backend: a job of a workspace --------------------------------------------------
class FakeRun:
    """What `attempt_nodes` uses of a JobRun: the job, the run id, a status history (kept in memory)."""

    def __init__(self, job, run_id: str = "run-1") -> None:
        self.job, self.run_id, self.entries = job, run_id, []

    def history(self, log=print) -> StatusHistory:
        return StatusHistory(load=lambda: self.entries, save=lambda e: setattr(self, "entries", e), log=log)

    def statuses(self) -> list[tuple[str, str]]:
        return [(e["status"], e["reason"]) for e in self.entries]


def test_a_job_without_a_workspace_uses_the_shared_pool(sat_dirs, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "n0,n1")
    run = FakeRun(parse_spec(job_spec(workspace=None, resources={"server_type": "cpu"}, nodes=1)))
    with attempt_nodes(run, Plan(attempt=2, exclude_nodes=["n0"]), print) as nodes:
        assert nodes == ["n1"]
    assert node_pool(None) == ["n0", "n1"]


def test_a_workspace_job_holds_its_nodes_while_it_runs_and_gives_them_back(sat_dirs, workspace_data):
    WorkspaceStore().create(workspace_data)
    run = FakeRun(parse_spec(job_spec()))
    lines: list[str] = []
    with attempt_nodes(run, Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["team-a-node-0", "team-a-node-1"]
        assert [(u.job, u.state) for u in SlotBoard("team-a").uses()] == [("ws-job", "running")]
    assert SlotBoard("team-a").uses() == []
    assert "[sat] workspace team-a: released team-a-node-0, team-a-node-1" in lines
    assert node_pool("team-a") == ["team-a-node-0", "team-a-node-1", "team-a-node-2"]


def test_a_failover_without_healthy_nodes_says_so_until_capacity_returns(sat_dirs, workspace_data):
    """3 nodes, another job holds one, the failed node is excluded: the failover waits as failoverinprogress."""
    store = WorkspaceStore()
    store.create(workspace_data)
    board = SlotBoard("team-a")
    other = board.enqueue(job="other", run_id="run-o", attempt=1, slots=1)
    assert board.poll(store.get("team-a"), other).nodes == ("team-a-node-0",)
    run = FakeRun(parse_spec(job_spec()))
    plan = Plan(attempt=2, exclude_nodes=["team-a-node-1"], failovers=1)
    got: list[list[str]] = []

    def failover() -> None:
        with attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.05) as nodes:
            got.append(nodes)

    thread = threading.Thread(target=failover)
    thread.start()
    status, reason = wait_for(lambda: run.statuses() and run.statuses()[-1], "the waiting status")
    assert status == JobStatus.FAILOVER_IN_PROGRESS.value
    assert "2 node(s) needed, 1 free of 3 (1 used by other, 1 excluded)" in reason
    assert not got
    board.release(other)  # capacity returns
    thread.join(DEADLINE)
    assert got == [["team-a-node-0", "team-a-node-2"]]


def test_a_failover_that_waits_past_the_deadline_fails_with_what_it_waited_for(sat_dirs, workspace_data,
                                                                                 monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "0.2")
    WorkspaceStore().create({**workspace_data, "nodes": 2})
    run = FakeRun(parse_spec(job_spec()))
    plan = Plan(attempt=2, exclude_nodes=["team-a-node-0"], failovers=1)
    with pytest.raises(WorkspaceWaitTimeout), attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.05):
        pass
    statuses = run.statuses()
    assert statuses[0][0] == JobStatus.FAILOVER_IN_PROGRESS.value
    assert "1 of them excluded after failed attempts (team-a-node-0): too few healthy nodes for 2" in statuses[0][1]
    assert statuses[-1][0] == JobStatus.FAILED.value and "[sat] workspace_wait_seconds" in statuses[-1][1]


def test_a_job_in_the_queue_is_pending_with_its_place(sat_dirs, workspace_data):
    store = WorkspaceStore()
    store.create(workspace_data)
    board = SlotBoard("team-a")
    first = board.enqueue(job="first", run_id="run-f", attempt=1, slots=3)
    assert board.poll(store.get("team-a"), first).admitted
    run = FakeRun(parse_spec(job_spec()))
    done = threading.Event()

    def start() -> None:
        with attempt_nodes(run, Plan(attempt=1), lambda _line: None, poll_seconds=0.05):
            done.set()

    thread = threading.Thread(target=start)
    thread.start()
    status, reason = wait_for(lambda: run.statuses() and run.statuses()[-1], "the waiting status")
    assert status == JobStatus.PENDING.value and "2 node(s) needed, 0 free of 3 (3 used by first)" in reason
    store.set_nodes("team-a", 5, board.uses())  # the edit counts for the next job that starts: this one
    assert done.wait(DEADLINE)
    thread.join(DEADLINE)


# ---- validation refuses what the workspace cannot take ----------------------------------------
def test_validate_spec_refuses_a_job_its_workspace_cannot_take(sat_dirs, workspace_data):
    WorkspaceStore().create(workspace_data)
    fits = FakeRun(parse_spec(job_spec()))
    check_workspace(fits.job, fits)
    assert fits.entries == []
    too_big = FakeRun(parse_spec(job_spec(nodes=5)))
    with pytest.raises(JobStopped, match="nodes: the job asks for 5 nodes; workspace team-a has 3"):
        check_workspace(too_big.job, too_big)
    assert too_big.statuses()[-1][0] == JobStatus.FAILED.value
    unknown = FakeRun(parse_spec(job_spec(workspace="team-z")))
    with pytest.raises(JobStopped, match=r"no workspace named 'team-z' \(workspaces: team-a\)"):
        check_workspace(unknown.job, unknown)
