"""The restart policy as pure functions, and the typed contracts the tasks hand each other."""

from __future__ import annotations

import json

import pytest

from sat_tasks.core.handoffs import Action, Decision, Plan, Verdict, VerdictKind
from sat_tasks.core.policy import decide_next, plan_attempt
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import NotApplicable
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

NOW = 1_800_000_000.0


def job(**changes):
    return parse_spec({**BASE, **changes})


def verdict(kind: VerdictKind, node: str | None = "gpu-1", step: int | None = 60, attempt: int = 1) -> Verdict:
    return Verdict(kind=kind, evidence=[f"{kind.value} evidence"], reason=kind.value.lower(), attempt=attempt,
                   node=node, last_committed_step=step)


SPOT = {"learning_type": "spot", "job_failover": False, "spot": {"max_resumes": 2}}


@pytest.mark.parametrize(("spec", "plan", "kind", "action", "status"), [
    pytest.param({}, Plan(attempt=1), VerdictKind.SUCCEEDED, Action.UPLOAD, None, id="succeeded"),
    pytest.param({}, Plan(attempt=1), VerdictKind.INTERNAL, Action.STOP, JobStatus.INTERNAL_ERROR, id="internal"),
    pytest.param({}, Plan(attempt=1), VerdictKind.IMAGE_PULL, Action.STOP, JobStatus.IMAGE_PULL_BACKOFF, id="image"),
    pytest.param({}, Plan(attempt=1), VerdictKind.HARDWARE, Action.FAILOVER, JobStatus.FAILOVER_IN_PROGRESS,
                 id="hardware-fails-over"),
    pytest.param({}, Plan(attempt=4, failovers=3), VerdictKind.HARDWARE, Action.STOP,
                 JobStatus.MAX_RETRIES_EXCEEDED, id="hardware-after-3-failovers"),
    pytest.param({"job_failover": False}, Plan(attempt=1), VerdictKind.HARDWARE, Action.STOP, JobStatus.FAILED,
                 id="hardware-without-failover"),
    pytest.param({}, Plan(attempt=1), VerdictKind.PREEMPTED, Action.RESUME, JobStatus.PREEMPTED,
                 id="on-demand-preempted-waits-for-capacity"),
    pytest.param({"job_failover": False}, Plan(attempt=1), VerdictKind.PREEMPTED, Action.STOP, JobStatus.FAILED,
                 id="on-demand-preempted-without-attempts-left"),
    pytest.param(SPOT, Plan(attempt=1), VerdictKind.PREEMPTED, Action.RESUME, JobStatus.PREEMPTED, id="spot-resumes"),
    pytest.param(SPOT, Plan(attempt=3, resumes=2), VerdictKind.PREEMPTED, Action.STOP, JobStatus.FAILED,
                 id="spot-out-of-resumes"),
    pytest.param(SPOT, Plan(attempt=1), VerdictKind.HARDWARE, Action.RESUME, None, id="spot-hardware-resumes"),
])
def test_decide_next(spec, plan, kind, action, status):
    decision = decide_next(job(**spec), plan, verdict(kind, attempt=plan.attempt), now=NOW)
    assert decision.action is action and decision.status is status and decision.verdict is kind
    assert decision.why  # every decision says why, in the words the status history shows


@pytest.mark.parametrize("kind", [VerdictKind.HARDWARE, VerdictKind.PREEMPTED, VerdictKind.INTERNAL])
def test_a_stop_request_ends_the_job_as_stopped_whatever_the_verdict(kind):
    request = {"by": "alice", "at": "2026-12-01T10:00:00+00:00", "via": "the Training Jobs view"}
    decision = decide_next(job(), Plan(attempt=1), verdict(kind, step=40), now=NOW, stop_request=request)
    assert decision.action is Action.STOP and decision.status is JobStatus.STOPPED
    assert "stopped by alice at 2026-12-01T10:00:00+00:00" in decision.why and "step 40" in decision.why


def test_a_job_that_finished_before_its_stop_took_effect_still_uploads():
    decision = decide_next(job(), Plan(attempt=1), verdict(VerdictKind.SUCCEEDED), now=NOW,
                           stop_request={"by": "alice"})
    assert decision.action is Action.UPLOAD


def test_a_queue_preemption_of_an_on_demand_job_spends_no_failover_and_keeps_the_node():
    """Kueue/scheduler preemption, node shutdown, Karpenter consolidation: wait for quota and resume (issue 27)."""
    decision = decide_next(job(), Plan(attempt=2, exclude_nodes=["gpu-0"], failovers=1),
                           verdict(VerdictKind.PREEMPTED, node="gpu-1", step=80, attempt=2), now=NOW)
    assert decision.action is Action.RESUME and decision.status is JobStatus.PREEMPTED
    assert decision.failovers == 1 and decision.exclude_nodes == ["gpu-0"] and decision.resume_step == 80
    assert "no failover spent" in decision.why and decision.preempted_at == NOW
    nxt = plan_attempt(job(), 3, decision)
    assert nxt == Plan(attempt=3, exclude_nodes=["gpu-0"], resume_step=80, failovers=1, resumes=1)


def test_a_failover_excludes_the_failed_node_and_resumes_from_the_last_commit():
    decision = decide_next(job(), Plan(attempt=2, exclude_nodes=["gpu-0"], failovers=1),
                           verdict(VerdictKind.HARDWARE, node="gpu-1", step=120, attempt=2), now=NOW)
    assert decision.exclude_nodes == ["gpu-0", "gpu-1"] and decision.failovers == 2 and decision.resume_step == 120
    assert "failover 2 of 3" in decision.why and "HARDWARE evidence" in decision.why
    nxt = plan_attempt(job(), 3, decision)
    assert nxt == Plan(attempt=3, exclude_nodes=["gpu-0", "gpu-1"], resume_step=120, failovers=2, resumes=0)


def test_no_commit_yet_resumes_from_the_newest_checkpoint():
    decision = decide_next(job(), Plan(attempt=1), verdict(VerdictKind.HARDWARE, step=None), now=NOW)
    assert decision.resume_step == -1


def test_a_spot_preemption_waits_for_the_injected_capacity_delay():
    spec = {**SPOT, "faults": [{"kind": "preemption", "at_step": 5, "capacity_delay_seconds": 30}]}
    decision = decide_next(job(**spec), Plan(attempt=1), verdict(VerdictKind.PREEMPTED), now=NOW)
    assert (decision.preempted_at, decision.capacity_at) == (NOW, NOW + 30) and decision.resumes == 1


@pytest.mark.parametrize("previous", [
    pytest.param(None, id="previous-skipped"),
    pytest.param(Decision(attempt=1, verdict=VerdictKind.SUCCEEDED, action=Action.UPLOAD, why="done"), id="upload"),
    pytest.param(Decision(attempt=1, verdict=VerdictKind.INTERNAL, action=Action.STOP, why="bug"), id="stop"),
])
def test_an_attempt_nobody_asked_for_is_not_applicable(previous):
    with pytest.raises(NotApplicable, match="attempt 2 is not needed"):
        plan_attempt(job(), 2, previous)


def test_the_first_attempt_always_runs_fresh():
    assert plan_attempt(job(), 1, None) == Plan(attempt=1, exclude_nodes=[], resume_step=None)


@pytest.mark.parametrize("contract", [
    Plan(attempt=2, exclude_nodes=["a"], resume_step=40, failovers=1),
    verdict(VerdictKind.HARDWARE),
    Decision(attempt=1, verdict=VerdictKind.PREEMPTED, action=Action.RESUME, why="spot", status=JobStatus.PREEMPTED,
             preempted_at=NOW, capacity_at=NOW + 5),
], ids=["plan", "verdict", "decision"])
def test_contracts_cross_xcom_as_json_and_come_back_typed(contract):
    data = json.loads(json.dumps(contract.to_xcom()))
    back = type(contract).from_xcom(data)
    assert back == contract and type(contract).from_xcom(None) is None


def test_a_contract_refuses_what_it_does_not_know():
    with pytest.raises(ValueError):
        Decision.from_xcom({"attempt": 1, "verdict": "HARDWARE", "action": "retry-forever", "why": "x"})
    with pytest.raises(ValueError):
        Plan.from_xcom({"attempt": 1, "surprise": True})


@pytest.mark.parametrize(("plan", "committed", "resume_step"), [
    pytest.param(Plan(attempt=1), 36, 36, id="first-attempt-resumes-from-its-checkpoint"),
    pytest.param(Plan(attempt=1), None, None, id="nothing-committed-starts-fresh"),
    pytest.param(Plan(attempt=2, exclude_nodes=["gpu-1"], resume_step=20, failovers=1), 25, 25, id="newer-than-plan"),
    pytest.param(Plan(attempt=2, exclude_nodes=["gpu-1"], resume_step=20, failovers=1), None, 20, id="plan-stands"),
])
def test_an_interrupted_attempt_resumes_without_spending_a_failover(plan, committed, resume_step):
    from sat_tasks.core.policy import resume_interrupted

    resumed = resume_interrupted(plan, committed)
    assert resumed.resume_step == resume_step
    assert (resumed.attempt, resumed.exclude_nodes, resumed.failovers, resumed.resumes) == (
        plan.attempt, plan.exclude_nodes, plan.failovers, plan.resumes)


@pytest.mark.parametrize(("left", "step", "reason"), [
    pytest.param(0, 36, "attempt 1 was interrupted by a service restart at 2026-12-02T07:00:00+00:00; "
                        "resumed from checkpoint-36 (not a failover: none spent)", id="service-restart"),
    pytest.param(2, 36, "attempt 1 was interrupted: its launch task died (last heard from at 2026-12-02T07:00:00+00:00) while training "
                        "went on (2 process(es) of it stopped); resumed from checkpoint-36 (not a failover: none spent)",
                 id="task-killed"),
    pytest.param(0, None, "attempt 1 was interrupted by a service restart at 2026-12-02T07:00:00+00:00; no checkpoint "
                          "was committed, so it starts again from step 0 (not a failover: none spent)", id="no-checkpoint"),
])
def test_an_interruption_says_what_happened_and_where_training_goes_on(left, step, reason):
    from datetime import UTC, datetime

    from sat_tasks.core.attempt import Interruption

    at = datetime(2026, 12, 2, 7, 0, 0, 123456, tzinfo=UTC)
    assert Interruption(attempt=1, last_seen=at, left_running=left, resume_step=step).reason == reason


# ---- a planned restart to grow back (issue 32, ADR 0029) -------------------------------------------------------
def test_a_planned_restart_is_its_own_verdict_and_spends_neither_a_failover_nor_a_resume():
    from sat_tasks.core.policy import GROW_BACK, grow_verdict

    elastic = job(nodes=2, elastic={"min_nodes": 1})
    why = f"{GROW_BACK} from 1 to 2 of 2 nodes: capacity is back (gpu-0 released)"
    planned = grow_verdict(verdict(VerdictKind.PREEMPTED, attempt=2), why)  # whatever the exit status suggested
    assert planned.kind is VerdictKind.PLANNED_RESTART and planned.reason == why
    plan = Plan(attempt=2, exclude_nodes=["gpu-0"], failovers=1, resumes=1)
    decision = decide_next(elastic, plan, planned, now=NOW, readmitted=["gpu-0"])
    assert (decision.verdict, decision.action, decision.status) == (
        VerdictKind.PLANNED_RESTART, Action.FAILOVER, JobStatus.RUNNING)
    assert (decision.failovers, decision.resumes, decision.exclude_nodes) == (1, 1, [])  # the budgets unchanged
    assert decision.preempted_at is None  # no wait for capacity, as a preemption would
    assert Decision.from_xcom(decision.to_xcom()) == decision


@pytest.mark.parametrize("kind", list(VerdictKind), ids=lambda k: k.value)
def test_every_verdict_kind_has_a_rule_and_none_falls_through_to_a_failover(kind):
    decision = decide_next(job(nodes=2, elastic={"min_nodes": 1}), Plan(attempt=1), verdict(kind), now=NOW)
    fails_over = kind in (VerdictKind.HARDWARE, VerdictKind.SUSPECT_NODE)
    assert (decision.failovers == 1) is fails_over  # only a fault of the node spends a failover
    assert (decision.status is JobStatus.FAILOVER_IN_PROGRESS) is fails_over


# ---- the interruption budget (issue 43 item 1, ADR 0004) ------------------------------------------------
def interrupted(attempt: int = 1, node: str = "gpu-1") -> Verdict:
    return Verdict(kind=VerdictKind.PREEMPTED, evidence=['container "train" terminated: reason=-, exitCode=143'],
                   reason="interrupted: killed by SIGTERM from outside, with no evidence of a fault: resumed without "
                          "blame (no failover spent, no ledger entry; ADR 0004)",
                   attempt=attempt, node=node, last_committed_step=40)


def test_an_interruption_resumes_without_blame_and_counts_against_its_own_budget():
    spec = job()
    decision = decide_next(spec, Plan(attempt=1), interrupted(), now=NOW)
    assert decision.action is Action.RESUME and decision.status is JobStatus.PREEMPTED
    assert decision.failovers == 0 and decision.exclude_nodes == [] and decision.resume_step == 40
    assert decision.interruptions == 1 and decision.resumes == 1
    assert "no failover spent" in decision.why and "interruption 1 of max_interruptions=3" in decision.why
    assert plan_attempt(spec, 2, decision).interruptions == 1  # carried to the next attempt


def test_an_endless_reclaim_loop_ends_when_the_interruption_budget_is_spent():
    # Spot, 5 resumes allowed, 2 interruptions: the third interruption ends it, naming the budget
    spec = job(**{**SPOT, "spot": {"max_resumes": 5}, "max_interruptions": 2})
    plan, decisions = Plan(attempt=1), []
    for attempt in range(1, 7):
        decision = decide_next(spec, plan, interrupted(attempt), now=NOW)
        decisions.append(decision)
        if not decision.needs_attempt:
            break
        plan = plan_attempt(spec, attempt + 1, decision)
    assert [d.action for d in decisions] == [Action.RESUME, Action.RESUME, Action.STOP]
    last = decisions[-1]
    assert last.status is JobStatus.FAILED
    assert "max_interruptions=2" in last.why and "interruption budget is spent" in last.why, last.why
    assert "after 2 interruption(s)" in last.why and "killed by SIGTERM from outside" in last.why


def test_pre_emptions_with_their_own_evidence_do_not_spend_the_interruption_budget():
    spec = job(**{**SPOT, "spot": {"max_resumes": 5}, "max_interruptions": 0})
    decision = decide_next(spec, Plan(attempt=1), verdict(VerdictKind.PREEMPTED), now=NOW)  # a Spot notice
    assert decision.action is Action.RESUME and decision.interruptions == 0
    assert decide_next(spec, Plan(attempt=2, resumes=1), interrupted(2), now=NOW).action is Action.STOP


@pytest.mark.parametrize(("spec", "plan", "words"), [
    pytest.param({"job_failover": False}, Plan(attempt=1), "no attempt is left (1 in all; 0 of max_interruptions=3",
                 id="on-demand-out-of-attempts"),
    pytest.param({**SPOT}, Plan(attempt=3, resumes=2), "after 2 resumes (spot.max_resumes; 0 of max_interruptions=3",
                 id="spot-out-of-resumes"),
])
def test_an_interruption_past_the_jobs_other_limits_says_which(spec, plan, words):
    decision = decide_next(job(**spec), plan, interrupted(plan.attempt), now=NOW)
    assert decision.action is Action.STOP and decision.status is JobStatus.FAILED
    assert words in decision.why, decision.why


def test_the_interruption_budget_is_a_spec_field_from_0_to_5():
    assert job().max_interruptions == 3
    assert job(max_interruptions=0).max_interruptions == 0
    for bad in (-1, 6):
        with pytest.raises(Exception, match="max_interruptions"):
            job(max_interruptions=bad)
