"""Elastic failover (issue 32, ADR 0029): the spec's rules, the shrink policy and the local placement on fewer nodes."""

from __future__ import annotations

import pytest

from sat_tasks.backends.local.launch import elastic_command
from sat_tasks.backends.local.pool import NodePool, place
from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.core.handoffs import Action, Plan, Verdict, VerdictKind
from sat_tasks.core.policy import (
    GROW_BACK,
    GrowBack,
    decide_next,
    elastic_shrink,
    grow_back,
    grow_verdict,
    shrink_reason,
)
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.core.workspaces import Holding, SlotRequest
from sat_tasks.spec import SpecError, parse_spec

BASE = {"name": "elastic-job", "job_failover": True, "nodes": 2, "image": {"url": "registry.example.com/t/train:1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        "command": "python train.py --max_steps 10"}


def job(**fields):
    return parse_spec({**BASE, "elastic": {"min_nodes": 1}, **fields})


# ---- the spec ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "field", "rule"), [
    pytest.param({"job_failover": False}, "elastic", "only with job_failover: true", id="without-failover"),
    pytest.param({"elastic": {"min_nodes": 2}}, "elastic.min_nodes", "must be less than nodes (2), got 2",
                 id="min-not-below-nodes"),
    pytest.param({"elastic": {"min_nodes": 0}}, "elastic.min_nodes", "must be >= 1", id="zero-min"),
    pytest.param({"elastic": {"min_nodes": 1, "wait_seconds": -1}}, "elastic.wait_seconds",
                 "must be between 0 and 86400", id="negative-wait"),
    pytest.param({"learning_type": "spot", "job_failover": False}, "elastic", "only with job_failover", id="spot"),
])
def test_a_bad_elastic_field_is_refused_naming_the_field_and_the_rule(fields, field, rule):
    with pytest.raises(SpecError) as refused:
        job(**fields)
    assert any(p.field == field and rule in p.rule for p in refused.value.problems), refused.value.problems


def test_elastic_is_allowed_with_ddp_and_deepspeed():
    assert job(framework="deepspeed").elastic.min_nodes == 1 and job().elastic.min_nodes == 1


def test_elastic_is_off_by_default_and_kept_when_given():
    assert parse_spec(BASE).elastic is None
    assert job(elastic={"min_nodes": 1, "wait_seconds": 30}).elastic.wait_seconds == 30


# ---- the policy ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("nodes", "low", "healthy", "expected", "scale"), [
    pytest.param(2, 1, 1, 1, 2, id="2-to-1"),
    pytest.param(4, 1, 3, 2, 2, id="3-does-not-divide-4-so-2"),
    pytest.param(4, 3, 3, None, 1, id="3-does-not-divide-4-and-2-is-below-min"),
    pytest.param(8, 2, 7, 4, 2, id="8-to-4"),
    pytest.param(2, 1, 0, None, 1, id="none-healthy"),
    pytest.param(4, 2, 1, None, 1, id="below-min"),
])
def test_the_shrink_takes_the_largest_count_that_keeps_the_global_batch(nodes, low, healthy, expected, scale):
    shrink = elastic_shrink(job(nodes=nodes, elastic={"min_nodes": low}), healthy)
    assert (shrink.nodes, shrink.accumulation_scale) == (expected, scale)
    if expected is None:
        assert shrink.why.startswith("elastic:") and shrink.why


def test_a_refused_shrink_says_why():
    shrink = elastic_shrink(job(nodes=4, elastic={"min_nodes": 3}), 3)
    assert "no count from 3 to 3 divides 4, so the gradient accumulation could not keep the global batch" in shrink.why


def test_the_shrink_reason_names_the_excluded_node_and_its_cause():
    shrink = elastic_shrink(job(), 1)
    assert shrink_reason(shrink, {"local-node-0": "HARDWARE"}) == (
        "resumed on 1 of 2 nodes (local-node-0 excluded: HARDWARE); gradient accumulation x2 keeps the global batch")


def test_the_local_command_is_one_rank_per_node_held():
    assert elastic_command("python -u train.py --x 1", 1) == (
        "torchrun --standalone --nnodes=1 --nproc_per_node=1 train.py --x 1")
    assert elastic_command("python train.py --deepspeed", 2, deepspeed=True) == (
        "torchrun --standalone --nnodes=1 --nproc_per_node=2 -m ckpt_engine.launch train.py --deepspeed")
    assert elastic_command("bash run.sh", 2) == "bash run.sh"
    assert elastic_command("python -m torch.distributed.run train.py", 2) == "python -m torch.distributed.run train.py"


# ---- the local placement -------------------------------------------------------------------------
def test_the_pool_gives_a_multi_slot_request_distinct_nodes_or_says_too_few():
    pool = NodePool(("n0", "n1", "n2"), 1)
    two = SlotRequest(ticket="t", job="j", run_id="r", attempt=1, slots=2)
    assert place(pool, "t", [two], []).nodes == ("n0", "n1")
    other = Holding(SlotRequest(ticket="o", job="o", run_id="o", attempt=1, slots=1), ("n0",))
    assert place(pool, "t", [two], [other]).nodes == ("n1", "n2")
    excluded = SlotRequest(ticket="t", job="j", run_id="r", attempt=2, slots=2, exclude=("n0", "n1"), failover=True)
    answer = place(pool, "t", [excluded], [])
    assert not answer.admitted and answer.lacks_healthy_nodes and "2 needed, 1 healthy" in answer.reason


class FakeRun:
    """What `attempt_nodes` uses of a JobRun: the job, the run id, a status history in memory (no Object Storage)."""

    def __init__(self, training_job) -> None:
        self.job, self.run_id, self.entries = training_job, "run-elastic", []

    def history(self, log=print) -> StatusHistory:
        return StatusHistory(load=lambda: self.entries, save=lambda e: setattr(self, "entries", e), log=log)


@pytest.fixture
def two_local_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "local-node-0,local-node-1")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "30")


def test_an_elastic_job_holds_every_node_and_its_failover_resumes_on_the_one_left(two_local_nodes):
    run = FakeRun(job())
    with attempt_nodes(run, Plan(attempt=1), lambda _line: None, poll_seconds=0.02) as nodes:
        assert nodes == ["local-node-0", "local-node-1"] and nodes.note == ""
    plan = Plan(attempt=2, exclude_nodes=["local-node-0"], failovers=1, resume_step=20)
    with attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.02) as nodes:
        assert nodes == ["local-node-1"]
        assert nodes.note == ("resumed on 1 of 2 nodes (local-node-0 excluded: HARDWARE); gradient accumulation x2 "
                              "keeps the global batch")
    waited = run.entries[-1]
    assert waited["status"] == JobStatus.FAILOVER_IN_PROGRESS.value and "2 needed, 1 healthy" in waited["reason"]


def test_a_job_without_elastic_still_fails_at_the_deadline_with_too_few_nodes(two_local_nodes, monkeypatch):
    from sat_tasks.io.workspaces import WorkspaceWaitTimeout

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "0")
    run = FakeRun(job(elastic={"min_nodes": 1}, nodes=2).model_copy(update={"elastic": None}))
    plan = Plan(attempt=2, exclude_nodes=["local-node-0", "local-node-1"], failovers=1)
    from sat_tasks.backends.local.runner import NoHealthyNodeError

    with pytest.raises((NoHealthyNodeError, WorkspaceWaitTimeout)), \
            attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.02):
        pass


def test_a_shrink_below_min_nodes_is_refused_in_the_history_and_waits(two_local_nodes, monkeypatch):
    from sat_tasks.io.workspaces import WorkspaceWaitTimeout

    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "local-node-0,local-node-1,local-node-2,local-node-3")
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "1")
    run = FakeRun(job(nodes=4, elastic={"min_nodes": 3}))
    plan = Plan(attempt=2, exclude_nodes=["local-node-0"], failovers=1)
    with pytest.raises(WorkspaceWaitTimeout), attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.02):
        pass
    reasons = [e["reason"] for e in run.entries]
    assert any("no count from 3 to 3 divides 4" in r for r in reasons), reasons
    assert run.entries[-1]["status"] == JobStatus.FAILED.value


# ---- growing back --------------------------------------------------------------------------------
@pytest.mark.parametrize(("nodes", "held", "free", "expected"), [
    pytest.param(2, 1, ["local-node-0"], 2, id="1-to-2"),
    pytest.param(2, 1, [], None, id="nothing-free"),
    pytest.param(4, 2, ["a"], None, id="3-does-not-divide-4"),
    pytest.param(8, 2, ["a", "b", "c"], 4, id="2-to-4-of-8"),
    pytest.param(2, 2, ["a"], None, id="already-whole"),
])
def test_growing_back_takes_the_largest_count_that_keeps_the_global_batch(nodes, held, free, expected):
    grow = grow_back(job(nodes=nodes), held, free, readmitted=["local-node-0"])
    assert (grow.nodes if grow else None) == expected


def test_a_planned_restart_is_no_failover_and_takes_the_released_node_back():
    training_job = job()
    plan = Plan(attempt=2, exclude_nodes=["local-node-0"], failovers=1, resume_step=5)
    grow = grow_back(training_job, 1, ["local-node-0"], readmitted=["local-node-0"])
    assert grow.why == f"{GROW_BACK} from 1 to 2 of 2 nodes: capacity is back (local-node-0 released)"
    raw = Verdict(kind=VerdictKind.HARDWARE, reason="killed by SIGTERM", evidence=["exit 143"], attempt=2,
                  node="local-node-1", last_committed_step=17)
    verdict = grow_verdict(raw, grow.why)
    decision = decide_next(training_job, plan, verdict, now=0.0, readmitted=list(grow.readmitted))
    assert (decision.action, decision.status, decision.failovers, decision.exclude_nodes, decision.resume_step) == (
        Action.FAILOVER, JobStatus.RUNNING, 1, [], 17)
    assert decision.why.endswith("attempt 3 resumes from checkpoint 17 (not a failover: 1 of 3 used)")
    stopped = decide_next(training_job, plan, verdict, now=0.0, stop_request={"by": "ann", "at": "now"})
    assert stopped.status is JobStatus.STOPPED  # a person's stop still wins


def test_the_runner_stops_an_attempt_that_may_grow_with_a_final_checkpoint_and_records_why(tmp_path):
    from sat_tasks.backends.local.runner import LocalAttempt

    trainer = tmp_path / "code" / "t.py"
    trainer.parent.mkdir()
    trainer.write_text(
        "import json, os, signal, sys, time\n"
        "out = os.path.join(os.environ['SAT_OUTPUT_DIR'], 'concurrent_checkpoint'); os.makedirs(out, exist_ok=True)\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "for step in range(1, 100000):\n"
        "    time.sleep(0.02)\n"
        "    json.dump({'step': step, 'last_committed_step': step if stop else step - step % 5},\n"
        "              open(os.path.join(out, 'p.tmp'), 'w'))\n"
        "    os.replace(os.path.join(out, 'p.tmp'), os.path.join(out, 'progress.json'))\n"
        "    if stop: print('final checkpoint', step, flush=True); sys.exit(143)\n")
    asked: list[int] = []

    def grow_check():
        asked.append(1)
        return GrowBack(2, ("local-node-0",), "planned restart to grow back from 1 to 2 of 2 nodes") \
            if len(asked) >= 2 else None

    lines: list[str] = []
    record = LocalAttempt(
        job="unit-job", attempt=2, node="local-node-1", command="python t.py",
        env={"SAT_OUTPUT_DIR": str(tmp_path / "out")}, cwd=trainer.parent, output_dir=tmp_path / "out",
        job_log=tmp_path / "job.log", node_dir=tmp_path / "nodes" / "local-node-1", grace_seconds=30,
        poll_seconds=0.05, grow_check=grow_check, grow_poll_seconds=0.1).run(lines.append)
    assert record.exit_code == 143 and "final checkpoint" in "\n".join(record.log_tail)
    assert record.planned_restart == "planned restart to grow back from 1 to 2 of 2 nodes"
    assert record.readmitted_nodes == ["local-node-0"]
    assert any("a planned restart, not a failover" in line for line in lines)
