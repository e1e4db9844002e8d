"""The shared local pool's slots (issue 31.4): concurrent jobs spread over the nodes and queue when every slot is taken."""

from __future__ import annotations

import threading
import time

import pytest

from sat_tasks.backends.local.pool import (
    NodePool,
    PoolBoard,
    PoolSettingError,
    node_pool_now,
    place,
)
from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.core.workspaces import Holding, SlotRequest
from sat_tasks.spec import parse_spec

DEADLINE = 60.0  # generous: what a test waits for an event at most
TWO_BY_ONE = NodePool(("n0", "n1"), slots=1)


def request(ticket: str, **fields) -> SlotRequest:
    return SlotRequest(ticket=ticket, job=f"job-{ticket}", run_id=f"run-{ticket}", attempt=1, slots=1, **fields)


def held(ticket: str, node: str) -> Holding:
    return Holding(request(ticket), (node,))


# ---- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("pool", "holdings", "expected"), [
    pytest.param(TWO_BY_ONE, [], ("n0",), id="empty-pool-first-node"),
    pytest.param(TWO_BY_ONE, [held("a", "n0")], ("n1",), id="spreads-to-the-free-node"),
    pytest.param(TWO_BY_ONE, [held("a", "n0"), held("b", "n1")], None, id="full-waits"),
    pytest.param(NodePool(("n0", "n1"), 2), [held("a", "n0")], ("n1",), id="least-loaded-first"),
    pytest.param(NodePool(("n0", "n1"), 2), [held("a", "n0"), held("b", "n1")], ("n0",), id="second-slot"),
])
def test_place_takes_the_least_loaded_node_with_a_free_slot(pool, holdings, expected):
    assert place(pool, "t", [request("t")], holdings).nodes == expected


def test_a_full_pool_says_who_holds_it_and_who_is_ahead():
    queue = [request("x"), request("t")]
    answer = place(TWO_BY_ONE, "t", queue, [held("a", "n0"), held("b", "n1")])
    assert not answer.admitted and answer.position == 2
    assert answer.reason == ("waiting for a free slot in the local pool: 2 healthy node(s) x 1 slot(s), "
                             "all in use (by job-a, job-b), 1 job(s) queued ahead")


def test_the_first_in_the_queue_gets_a_freed_slot_before_a_later_one():
    queue = [request("first"), request("later")]
    holdings = [held("a", "n0")]
    assert place(TWO_BY_ONE, "later", queue, holdings).nodes is None  # n1 is the first's
    assert place(TWO_BY_ONE, "first", queue, holdings).nodes == ("n1",)


def test_a_request_that_fits_nowhere_does_not_hold_up_one_that_fits():
    queue = [request("failover", exclude=("n1",)), request("fresh")]
    answer = place(TWO_BY_ONE, "fresh", queue, [held("a", "n0")])
    assert answer.nodes == ("n1",)
    assert not place(TWO_BY_ONE, "failover", queue, [held("a", "n0")]).admitted


def test_the_warm_node_comes_first_and_an_excluded_node_never():
    pool = NodePool(("n0", "n1", "n2"), 2)
    assert place(pool, "t", [request("t", prefer=("n2",))], [held("a", "n2")]).nodes == ("n2",)
    assert place(pool, "t", [request("t", exclude=("n0",))], []).nodes == ("n1",)
    nothing = place(pool, "t", [request("t", exclude=("n0", "n1", "n2"))], [])
    assert nothing.lacks_healthy_nodes and "no healthy node left in the local pool" in nothing.reason


@pytest.mark.parametrize("value", [pytest.param("0", id="zero"), pytest.param("two", id="not-a-number")])
def test_a_bad_slot_setting_names_the_field_and_the_rule(monkeypatch, value):
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", value)
    with pytest.raises(PoolSettingError, match=r"\[sat\] local_node_slots: must be a whole number of at least 1"):
        node_pool_now()


# ---- three concurrent placements through attempt_nodes, 2 nodes x 1 slot -------------------------
class FakeRun:
    """What `attempt_nodes` uses of a JobRun: the job, the run id, a status history in memory (no Object Storage)."""

    def __init__(self, name: str) -> None:
        self.job = parse_spec({"name": name, "image": {"url": "registry.example.com/team/train:1.0"},
                               "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
                               "results": {"destination": "s3://sat-demo/results/"}, "command": "python train.py"})
        self.run_id, self.entries = f"run-{name}", []

    def history(self, log=print) -> StatusHistory:
        return StatusHistory(load=lambda: self.entries, save=lambda e: setattr(self, "entries", e), log=log)


def wait_for(predicate, what: str):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_three_concurrent_jobs_on_two_single_slot_nodes_two_run_and_the_third_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "local-node-0,local-node-1")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    runs = [FakeRun(f"job-{i}") for i in range(3)]
    placed: dict[str, list[str]] = {}
    finish = {run.job.name: threading.Event() for run in runs}

    def attempt(run: FakeRun) -> None:
        with attempt_nodes(run, Plan(attempt=1), lambda _line: None, poll_seconds=0.02) as nodes:
            placed[run.job.name] = nodes
            finish[run.job.name].wait(DEADLINE)

    threads = [threading.Thread(target=attempt, args=(run,)) for run in runs]
    for thread in threads[:2]:
        thread.start()
    wait_for(lambda: len(placed) == 2, "the first two placements")
    threads[2].start()
    waiting = wait_for(lambda: runs[2].entries, "the third job's waiting status")
    assert sorted(n for nodes in placed.values() for n in nodes) == ["local-node-0", "local-node-1"]
    assert "job-2" not in placed
    assert waiting[-1]["status"] == JobStatus.PENDING.value
    assert "2 healthy node(s) x 1 slot(s), all in use (by job-0, job-1)" in waiting[-1]["reason"]
    assert [(u.job, u.state) for u in PoolBoard().uses()][-1] == ("job-2", "queued")

    finish["job-1"].set()  # one frees its slot: the third takes that node
    wait_for(lambda: "job-2" in placed, "the third placement")
    assert placed["job-2"] == placed["job-1"]
    for event in finish.values():
        event.set()
    for thread in threads:
        thread.join(DEADLINE)
    assert PoolBoard().uses() == []
