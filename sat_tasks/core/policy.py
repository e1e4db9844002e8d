"""The restart policy, as pure functions: which attempt runs, and what follows a verdict.

`plan_attempt` and `decide_next` read nothing and write nothing: the task that calls
`decide_next` records the `Decision.status` it returns (with `Decision.why`) in the job's
status history. ADR 0001 and ADR 0004 say why each verdict leads where it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sat_tasks.core.handoffs import (
    INTERRUPTED,
    Action,
    Decision,
    Plan,
    Verdict,
    VerdictKind,
)
from sat_tasks.core.node_health import ACROSS_NODES, RELOCATION
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import NotApplicable
from sat_tasks.spec import FaultKind, TrainingJob

EVIDENCE_IN_STATUS = 3  # evidence lines quoted in a status reason


def plan_attempt(job: TrainingJob, attempt: int, previous: Decision | None) -> Plan:
    """Whether attempt `attempt` runs, where it must not run, and from which step it resumes.

    Attempt 1 always runs, fresh. A later attempt runs only when the previous decision
    asks for one (fail over or resume); otherwise NotApplicable (its tasks are skipped).
    """
    if attempt == 1:
        return Plan(attempt=1)
    if previous is None or not previous.needs_attempt:
        raise NotApplicable(f"attempt {attempt} is not needed")
    return Plan(attempt=attempt, exclude_nodes=list(previous.exclude_nodes), resume_step=previous.resume_step,
                failovers=previous.failovers, resumes=previous.resumes, interruptions=previous.interruptions)


def resume_interrupted(plan: Plan, last_committed_step: int | None) -> Plan:
    """The plan of attempt `plan.attempt` run again after its task was interrupted (a service restart, a killed task).

    Not a new attempt and no failover: the same attempt resumes from the newest checkpoint
    it (or an earlier attempt) committed, as a failover would (`CKPT_LAST_STEP`). With no
    checkpoint committed since the plan was made, the plan's own resume step stands (None:
    a fresh start). Node exclusions, failovers and resumes used are unchanged.
    """
    if last_committed_step is None:
        return plan
    return plan.model_copy(update={"resume_step": last_committed_step})


def stop_reason(request: dict) -> str:
    """The status reason of a person's stop: who, when and from where."""
    return (f"stopped by {request.get('by') or 'unknown'} at {request.get('at') or '?'}"
            f" ({request.get('via') or 'the Training Jobs view'})")


def stopped_verdict(verdict: Verdict, request: dict) -> Verdict:
    """The verdict of an attempt a person stopped: STOPPED, by whom and through which route, never a node fault."""
    return verdict.model_copy(update={
        "kind": VerdictKind.STOPPED, "reason": stop_reason(request) + " (the training got SIGTERM: not a node fault)",
        "evidence": [(f"stop requested by {request.get('by') or 'unknown'} at {request.get('at') or '?'} through "
                      f"{request.get('via') or 'the Training Jobs view'}")] + list(verdict.evidence)})


def decide_next(job: TrainingJob, plan: Plan, verdict: Verdict, *, now: float,
                stop_request: dict | None = None, readmitted: Sequence[str] = ()) -> Decision:
    """Turn a verdict into the next action and the job status it implies (`now`: epoch seconds).

    A person's stop request (`stop_request`) ends the job as Stopped whatever the verdict,
    unless training finished anyway (then its results are uploaded as usual). An elastic
    attempt stopped to grow back (PLANNED_RESTART, `grow_verdict`) restarts on more nodes
    (`grow_decision`), `readmitted` (its record's) no longer excluded. Every kind has its rule
    here: one without (a new kind) raises rather than fail over as a fault.
    """
    attempt, node = plan.attempt, verdict.node
    exclude = list(plan.exclude_nodes)
    evidence = "; ".join(verdict.evidence[:EVIDENCE_IN_STATUS]) or verdict.reason
    base = {
        "attempt": attempt, "verdict": verdict.kind, "exclude_nodes": exclude, "failovers": plan.failovers,
        "resumes": plan.resumes, "interruptions": plan.interruptions,
        "resume_step": -1 if verdict.last_committed_step is None else verdict.last_committed_step,
    }

    def stop(status: JobStatus, why: str) -> Decision:
        return Decision(**base, action=Action.STOP, status=status, why=why)

    kind = verdict.kind
    if kind is VerdictKind.SUCCEEDED:
        return Decision(**base, action=Action.UPLOAD, why="training completed")
    if stop_request is not None or kind is VerdictKind.STOPPED:
        step = verdict.last_committed_step
        why = stop_reason(stop_request) if stop_request is not None else verdict.reason
        return stop(JobStatus.STOPPED, why + "; last committed checkpoint: "
                    + ("none" if step is None else f"step {step}"))
    if kind is VerdictKind.PLANNED_RESTART:
        return grow_decision(job, plan, verdict, readmitted)
    if kind is VerdictKind.IMAGE_PULL:
        return stop(JobStatus.IMAGE_PULL_BACKOFF, f"image could not be pulled: {evidence}")
    if kind is VerdictKind.INTERNAL:
        if verdict.reason.startswith((RELOCATION, ACROSS_NODES)):  # decided across nodes: say by which rule
            evidence = verdict.reason
        return stop(JobStatus.INTERNAL_ERROR, f"internal error in attempt {attempt} (no retry): {evidence}")
    if kind is VerdictKind.PREEMPTED and verdict.reason.startswith(INTERRUPTED):
        return interrupted_decision(job, plan, verdict, base, now=now)
    if kind is VerdictKind.PREEMPTED:
        delay = max([f.capacity_delay_seconds for f in job.faults
                     if f.attempt == attempt and f.kind is FaultKind.PREEMPTION] or [0])
        if not job.is_spot:
            # A queue (Kueue) or scheduler preemption, a node shutdown or Karpenter's consolidation of an
            # on-demand job: nothing is wrong with the node or the job, so wait for quota/capacity and
            # resume like a Spot job, without spending a failover or excluding the node (issue 27, ADR 0004).
            if plan.attempt >= job.max_attempts():
                return stop(JobStatus.FAILED, f"pre-empted on {node} and no attempt is left "
                                              f"({job.max_attempts()} in all): {evidence}")
            return Decision(**{**base, "resumes": plan.resumes + 1}, action=Action.RESUME,
                            status=JobStatus.PREEMPTED, preempted_at=now, capacity_at=now + delay,
                            why=f"attempt {attempt} pre-empted on {node} (not a node fault, no failover spent); "
                                f"waiting for capacity: {evidence}")
        if plan.resumes >= job.spot.max_resumes:
            return stop(JobStatus.FAILED, f"pre-empted again after {plan.resumes} resumes (spot.max_resumes)")
        return Decision(**{**base, "resumes": plan.resumes + 1}, action=Action.RESUME,
                        status=JobStatus.PREEMPTED,
                        why=f"attempt {attempt} pre-empted on {node}; waiting for capacity",
                        preempted_at=now, capacity_at=now + delay)
    if kind not in (VerdictKind.HARDWARE, VerdictKind.SUSPECT_NODE):
        raise ValueError(f"no rule for verdict {kind.value} of attempt {attempt}")
    # HARDWARE, or SUSPECT_NODE: both move to another node; the suspect's move is the relocation test
    failed_nodes = exclude + ([node] if node else [])
    suspect = kind is VerdictKind.SUSPECT_NODE
    fault = f"suspect node {node}" if suspect else f"hardware fault on {node}"
    if not job.job_failover and not job.is_spot:
        return stop(JobStatus.FAILED, f"{fault} and job_failover is off"
                    + (" (no relocation to tell the node from the job)" if suspect else "") + f": {evidence}")
    if job.is_spot:
        if plan.resumes >= job.spot.max_resumes:
            return stop(JobStatus.FAILED, f"{fault} after {plan.resumes} resumes: {evidence}")
        return Decision(**{**base, "resumes": plan.resumes + 1, "exclude_nodes": failed_nodes},
                        action=Action.RESUME, preempted_at=now,
                        why=f"{fault}: relocating to another node" if suspect else "hardware fault on a spot node")
    if plan.failovers >= job.max_failovers:
        return stop(JobStatus.MAX_RETRIES_EXCEEDED,
                    f"{fault} after {plan.failovers} failovers (max {job.max_failovers}): {evidence}")
    move = ("relocating once to tell the node from the job: the same failure on another node is the job's"
            if suspect else "failing over")
    return Decision(**{**base, "failovers": plan.failovers + 1, "exclude_nodes": failed_nodes},
                    action=Action.FAILOVER, status=JobStatus.FAILOVER_IN_PROGRESS,
                    why=f"{fault}: {evidence}; {move} (failover {plan.failovers + 1} of {job.max_failovers})")


def interrupted_decision(job: TrainingJob, plan: Plan, verdict: Verdict, base: dict, *, now: float) -> Decision:
    """An interruption from outside with no evidence of a fault (reason `INTERRUPTED`, ADR 0004): resumed without blame.

    No failover is spent and the node is not excluded, as after a pre-emption; but it has a budget of
    its own, `job.max_interruptions`, so that an endless reclaim loop (something that kills every attempt
    and leaves no trace) ends with a status that names it. It also spends what any resume spends: an
    attempt of the DAG (on-demand) or a Spot resume.
    """
    attempt, node, used = plan.attempt, verdict.node, plan.interruptions
    what = verdict.reason[len(INTERRUPTED):].split(", with no evidence", 1)[0].strip() or "interrupted"
    budget = f"max_interruptions={job.max_interruptions}"
    if used >= job.max_interruptions:
        return Decision(**base, action=Action.STOP, status=JobStatus.FAILED, why=(
            f"interrupted from outside again in attempt {attempt} on {node} ({what}) after {used} interruption(s) "
            f"resumed ({budget}): the interruption budget is spent; nothing showed a fault of the node or the job, "
            "so something outside keeps ending the training (a reclaim loop?)"))
    if job.is_spot and plan.resumes >= job.spot.max_resumes:
        return Decision(**base, action=Action.STOP, status=JobStatus.FAILED, why=(
            f"interrupted from outside in attempt {attempt} on {node} ({what}) after {plan.resumes} resumes "
            f"(spot.max_resumes; {used} of {budget} used)"))
    if not job.is_spot and attempt >= job.max_attempts():
        return Decision(**base, action=Action.STOP, status=JobStatus.FAILED, why=(
            f"interrupted from outside in attempt {attempt} on {node} ({what}) and no attempt is left "
            f"({job.max_attempts()} in all; {used} of {budget} used)"))
    return Decision(**{**base, "resumes": plan.resumes + 1, "interruptions": used + 1}, action=Action.RESUME,
                    status=JobStatus.PREEMPTED, preempted_at=now, capacity_at=now,
                    why=(f"attempt {attempt} interrupted from outside on {node} ({what}) with no evidence of a fault: "
                         f"resumed without blame (not a node fault, no failover spent, no ledger entry); "
                         f"interruption {used + 1} of {budget}"))


# ---- elastic failover (issue 32, ADR 0029) ---------------------------------------------------------
class ElasticShrink(NamedTuple):
    """How many nodes an elastic failover resumes on, and what that does to the training.

    `nodes`: the node count to ask for (None: no shrink is allowed; `why` says which rule refused it).
    `accumulation_scale`: the factor the gradient accumulation is multiplied by so that the global
    batch stays `job.nodes` nodes' worth (`job.nodes // nodes`).
    """

    nodes: int | None
    accumulation_scale: int
    why: str


def elastic_shrink(job: TrainingJob, healthy: int) -> ElasticShrink:
    """The node count an elastic job's failover resumes on when only `healthy` nodes are left for it.

    The largest count `n` with `elastic.min_nodes <= n <= healthy`, `n < job.nodes`, that divides
    `job.nodes`: each rank then accumulates `job.nodes // n` times the micro-batches it did, so the
    global batch (ranks x per-device batch x accumulation) is unchanged. A count that does not divide
    `job.nodes` would change the global batch, so it is skipped, and when none is left the shrink is
    refused with the reason (the failover then waits for the full count, as a job without `elastic`).
    """
    elastic = job.elastic
    if elastic is None:
        return ElasticShrink(None, 1, "the job is not elastic (no elastic field)")
    top = min(healthy, job.nodes - 1)
    if top < elastic.min_nodes:
        return ElasticShrink(None, 1, f"elastic: {healthy} healthy node(s) left, fewer than elastic.min_nodes "
                                      f"({elastic.min_nodes})")
    for count in range(top, elastic.min_nodes - 1, -1):
        if job.nodes % count == 0:
            return ElasticShrink(count, job.nodes // count, f"resumed on {count} of {job.nodes} nodes")
    return ElasticShrink(None, 1, (
        f"elastic: refused to resume on {top} of {job.nodes} nodes: no count from {elastic.min_nodes} to {top} "
        f"divides {job.nodes}, so the gradient accumulation could not keep the global batch"))


def shrink_reason(shrink: ElasticShrink, excluded: dict[str, str]) -> str:
    """The status history's words for a shrink: 'resumed on 1 of 2 nodes (local-node-0 excluded: HARDWARE)'."""
    why = ", ".join(f"{node} excluded: {cause}" for node, cause in excluded.items())
    scale = (f"; gradient accumulation x{shrink.accumulation_scale} keeps the global batch"
             if shrink.accumulation_scale > 1 else "")
    return shrink.why + (f" ({why})" if why else "") + scale


#: How the status history and a PLANNED_RESTART verdict's reason say an attempt was stopped to grow back.
GROW_BACK = "planned restart to grow back"


class GrowBack(NamedTuple):
    """An elastic job running on fewer nodes may grow back: to `nodes`, taking back `readmitted` (excluded, then released)."""

    nodes: int
    readmitted: tuple[str, ...]
    why: str


def grow_back(job: TrainingJob, held: int, free: Sequence[str], readmitted: Sequence[str] = ()) -> GrowBack | None:
    """Whether an elastic attempt on `held` nodes should restart on more, now that `free` healthy nodes have a slot.

    The largest count above `held`, up to `job.nodes`, that divides `job.nodes` (the global batch
    stays whole) and that `held + len(free)` covers; None when there is none. `readmitted`: nodes
    the plan excluded that a person has released since (they are among `free` when free).
    """
    if job.elastic is None or held >= job.nodes:
        return None
    for count in range(min(job.nodes, held + len(free)), held, -1):
        if job.nodes % count == 0:
            back = [n for n in readmitted if n in free]
            named = f" ({', '.join(back)} released)" if back else ""
            return GrowBack(count, tuple(back), (
                f"{GROW_BACK} from {held} to {count} of {job.nodes} nodes: capacity is back{named}"))
    return None


def grow_verdict(verdict: Verdict, why: str) -> Verdict:
    """The verdict of an attempt the launcher stopped to grow back: PLANNED_RESTART, whatever its exit status says.

    Neither a preemption (nothing took capacity away: no resume spent, no wait for capacity)
    nor a fault (never against the node, no failover spent).
    """
    return verdict.model_copy(update={
        "kind": VerdictKind.PLANNED_RESTART, "reason": why,
        "evidence": [f"the launcher stopped the attempt for a final checkpoint: {why}"] + list(verdict.evidence)[:2]})


def grow_decision(job: TrainingJob, plan: Plan, verdict: Verdict, readmitted: Sequence[str]) -> Decision:
    """The next attempt after a planned restart: all nodes again, from the final checkpoint; no failover spent.

    A FAILOVER action (the next attempt is placed as a failover: it waits `elastic.wait_seconds`
    for the full count and shrinks again if it lost the race), with the failover count unchanged
    and the readmitted nodes no longer excluded; the job status stays Running.
    """
    step = verdict.last_committed_step
    return Decision(attempt=plan.attempt, verdict=verdict.kind, action=Action.FAILOVER, status=JobStatus.RUNNING,
                    exclude_nodes=[n for n in plan.exclude_nodes if n not in readmitted], failovers=plan.failovers,
                    resumes=plan.resumes, resume_step=-1 if step is None else step,
                    why=f"{verdict.reason}; attempt {plan.attempt + 1} resumes from "
                        + ("the newest checkpoint" if step is None else f"checkpoint {step}")
                        + f" (not a failover: {plan.failovers} of {job.max_failovers} used)")
