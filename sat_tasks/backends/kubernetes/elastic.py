"""An elastic job's failover on Kubernetes (ADR 0029): resume on fewer nodes when no spare is healthy.

Call order, inside the `launch` tasks of a failover attempt of an elastic job (`needs_elastic_placement`):

1. Rank 0 (`place_elastic`) asks the cluster, as the Spot capacity check and the workspace wait
   do (`capacity.cluster_capacity`, on the rank pod as it would be submitted: selector, taints,
   the plan's exclusions and the quarantined nodes, the requests), until `job.nodes` nodes fit
   one rank each, recording `Pending - failoverinprogress` with the answer, for at most
   `elastic.wait_seconds`. Then it takes `core.policy.elastic_shrink` of the nodes that fit: the
   count `K` and the status history's words ("resumed on 1 of 2 nodes (node-b excluded:
   HARDWARE); gradient accumulation x2 keeps the global batch", `core.policy.shrink_reason`, the
   local backend's words). No count qualifies: it says why and the attempt goes on for all
   `job.nodes`, as a job without `elastic`.
2. Rank 0 creates the attempt's rendezvous Service with `K` in its `sat.ai/ranks` annotation
   (`pods.rendezvous_service`), before any pod: the Service is where the decision is kept.
3. Every other rank (`await_attempt_ranks`) waits for that Service and reads `K`; a rank `>= K`
   ends without a pod (its task succeeds: classify reads the `K` pods that ran), the others
   create their pod rendered for `K` ranks (`pods.attempt_pod_manifests(ranks=K)`: `NNODES`,
   `SAT_NODES`, `SAT_GRAD_ACCUM_SCALE`).

Growing back (`check_growth`, then `request_growth`), from the attempt group's `watch_growth`
sensor while an attempt runs on `K < nodes` ranks: once its pods have started training, the
cluster is asked again (the same `capacity.cluster_capacity`, the plan's exclusions less the
nodes a person released in the node health ledger since the attempt started, plus the
quarantined ones) and `core.policy.grow_back` decides on the nodes that fit and the attempt does
not hold. Then every pod of the attempt gets the `sat.ai/planned-restart` annotation; each pod's
PID 1 sees it through the downward API and SIGTERMs its command (the final checkpoint), the pods
end and are kept, and `records.read_attempt_record` carries the annotation into the record's
`planned_restart`, so classify and decide take over as on the local backend (a planned restart,
not a failover). A workspace job grows back only when its workspace's queue is Kueue and no other
workload waits in it (`workspace_queue_waiting`: the LocalQueue's `pendingWorkloads`): freed room
is theirs first, as the local backend's slot board decides. A workspace job queued by the Airflow
pool does not grow back: the tasks waiting in a pool are not visible to a task (ADR 0029).

Without Kueue a workspace job's ranks hold the workspace pool's slots (`workspace.launch_pool`):
rank 0 counts only the ranks whose tasks hold theirs (`ranks_with_slots`), so `K` never names a
rank still queued in the pool.

Nothing here imports Airflow: the launch task passes its client, clock and log in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.capacity import (
    CapacityAssessment,
    CapacityForbidden,
    cluster_capacity,
)
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.backends.kubernetes.workspace import (
    KUEUE_API,
    local_queue_name,
    pool_name,
)
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.core.policy import GrowBack, elastic_shrink, grow_back, shrink_reason
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.errors import SatError
from sat_tasks.spec import TrainingJob

# How often rank 0 asks the cluster again while it waits for the full count.
POLL_SECONDS = 15.0
#: Why a node is left out of an elastic failover, as the local backend says it (ADR 0029).
EXCLUDED_HARDWARE = "HARDWARE"
EXCLUDED_QUARANTINED = "quarantined by the node health ledger"


class ElasticPlacement(NamedTuple):
    """How many node ranks an elastic failover runs, and the status history's words for a shrink ("" when none)."""

    ranks: int
    note: str = ""


class RanksUndecided(SatError, RuntimeError):
    """Rank 0 did not say how many ranks the attempt runs (its task ended without, or the wait ran out)."""


def needs_elastic_placement(job: TrainingJob, plan: Plan) -> bool:
    """A failover attempt of an elastic job: it may resume on fewer nodes (as the local backend's placement decides)."""
    return job.elastic is not None and job.distributed and plan.attempt > 1 and plan.failovers > 0


def ranks_with_slots(states: Mapping[int, str | None], job: TrainingJob) -> int:
    """The ranks an attempt can count on in its workspace pool: 0 to min_nodes-1 (rank 0's slots) and each
    following rank while its task runs (`states`: rank -> task state); a rank still queued ends the count."""
    count = job.elastic.min_nodes if job.elastic is not None else job.nodes
    while count < job.nodes and states.get(count) == "running":
        count += 1
    return count


def place_elastic(
    job: TrainingJob,
    run_id: str,
    plan: Plan,
    *,
    client: Any,
    history: StatusHistory,
    quarantined: Sequence[str] = (),
    slots: Callable[[], int] | None = None,
    poll_seconds: float = POLL_SECONDS,
    log: Log = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ElasticPlacement:
    """Rank 0's decision: all `job.nodes` when they fit within `elastic.wait_seconds`, else `elastic_shrink` of those that do.

    `quarantined`: the nodes the node health ledger quarantined (left out like the plan's
    exclusions); `slots`: how many ranks hold their workspace pool slots now (`ranks_with_slots`;
    None: no pool). A connection that may not list nodes cannot count healthy nodes: all ranks,
    said in the log (the pods then wait Pending, as without `elastic`).
    """
    if job.elastic is None:
        return ElasticPlacement(job.nodes)
    excluded = list(plan.exclude_nodes) + [n for n in quarantined if n not in plan.exclude_nodes]
    check = plan.model_copy(update={"exclude_nodes": excluded})
    deadline = clock() + job.elastic.wait_seconds
    found: CapacityAssessment | None = None
    held = job.nodes
    last_reason = None
    while True:
        try:
            assessment = cluster_capacity(job, run_id, check, client=client, log=log)
        except CapacityForbidden as exc:
            log(f"[sat] elastic: cannot count the healthy nodes ({exc}); attempt {plan.attempt} asks for all "
                f"{job.nodes} nodes")
            return ElasticPlacement(job.nodes)
        found = assessment or found
        held = slots() if slots is not None else job.nodes
        if assessment is not None and assessment.available and held >= job.nodes:
            if last_reason is not None:
                log(f"[sat] elastic: room for all {job.nodes} nodes again ({assessment.summary()})")
            return ElasticPlacement(job.nodes)
        answer = assessment.summary() if assessment is not None else "the Kubernetes API did not answer"
        if held < job.nodes:
            answer += f"; {held} rank(s) hold their workspace pool slots"
        reason = (f"elastic failover of attempt {plan.attempt} waits up to {job.elastic.wait_seconds:g}s "
                  f"(elastic.wait_seconds) for {job.nodes} healthy nodes (excluded: {', '.join(excluded) or 'none'}): "
                  f"{answer}")
        if reason != last_reason:
            last_reason = reason
            log(f"[sat] {reason}")
            history.record(JobStatus.FAILOVER_IN_PROGRESS, reason, attempt=plan.attempt, task="launch")
        left = deadline - clock()
        if left <= 0:
            break
        sleep(min(poll_seconds, left))
    if found is None:
        log(f"[sat] elastic: the Kubernetes API did not answer; attempt {plan.attempt} asks for all {job.nodes} nodes")
        return ElasticPlacement(job.nodes)
    shrink = elastic_shrink(job, min(len(found.fitting), held))
    if shrink.nodes is None:
        why = f"{shrink.why}; waiting for {job.nodes} node(s) as a job without elastic would"
        log(f"[sat] {why}")
        history.record(JobStatus.FAILOVER_IN_PROGRESS, why, attempt=plan.attempt, task="launch")
        return ElasticPlacement(job.nodes)
    log(f"[sat] elastic: {found.summary()}; resuming on {shrink.nodes} of {job.nodes} node(s) instead")
    causes = {n: EXCLUDED_HARDWARE for n in plan.exclude_nodes}
    causes.update({n: EXCLUDED_QUARANTINED for n in excluded if n not in causes})
    return ElasticPlacement(shrink.nodes, shrink_reason(shrink, causes))


def read_attempt_ranks(client: Any, namespace: str, job: TrainingJob, run_id: str, attempt: int) -> int | None:
    """The rank count in the attempt's rendezvous Service (`sat.ai/ranks`); None while it does not exist.

    ApiException other than 404 is raised (a connection that may not read Services cannot wait for one).
    """
    from kubernetes.client.exceptions import ApiException

    try:
        service = client.read_namespaced_service(names.attempt_name(job, run_id, attempt), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    raw = ((getattr(service.metadata, "annotations", None) or {}).get(names.ANNOTATION_RANKS) or "").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= job.nodes:
        raise RanksUndecided(f"the rendezvous Service {namespace}/{names.attempt_name(job, run_id, attempt)} has no "
                             f"valid {names.ANNOTATION_RANKS} annotation ({raw!r}): it was not made by this attempt's "
                             "rank 0")
    return int(raw)


def await_attempt_ranks(
    client: Any,
    namespace: str,
    job: TrainingJob,
    run_id: str,
    attempt: int,
    *,
    node_rank: int,
    deadline_seconds: float,
    rank0_ended: Callable[[], str | None] = lambda: None,
    poll_seconds: float = 10.0,
    log: Log = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """A rank > 0 of an elastic failover: wait until rank 0 has said how many ranks run (its Service); that count.

    RanksUndecided when rank 0's task ended without creating it (`rank0_ended()`: its state, None
    while it runs or cannot be read) or after `deadline_seconds`.
    """
    deadline = clock() + deadline_seconds
    said = False
    while True:
        ranks = read_attempt_ranks(client, namespace, job, run_id, attempt)
        if ranks is not None:
            return ranks
        ended = rank0_ended()
        if ended is not None:
            ranks = read_attempt_ranks(client, namespace, job, run_id, attempt)  # created just before it ended
            if ranks is not None:
                return ranks
            raise RanksUndecided(f"rank 0's task ended ({ended}) without deciding how many ranks attempt {attempt} "
                                 f"runs: rank {node_rank} does not start")
        if clock() >= deadline:
            raise RanksUndecided(f"rank {node_rank} gave up after {deadline_seconds:.0f}s: rank 0 did not decide how "
                                 f"many ranks attempt {attempt} runs (its rendezvous Service was never created)")
        if not said:
            said = True
            log(f"[sat] rank {node_rank} waits for rank 0 to decide how many nodes the elastic failover of attempt "
                f"{attempt} resumes on (at most {deadline_seconds:.0f}s)")
        sleep(max(0.0, min(poll_seconds, deadline - clock())))


# ---- growing back --------------------------------------------------------------------------------
class Growth(NamedTuple):
    """One look of the grow-back watch: `done` ends the watch; `grow` (and the attempt's `pods` to ask) to grow."""

    done: bool
    why: str
    grow: GrowBack | None = None
    pods: tuple[str, ...] = ()


def check_growth(
    job: TrainingJob,
    run_id: str,
    plan: Plan,
    *,
    client: Any,
    namespace: str,
    quarantined: Sequence[str] = (),
    released: Sequence[str] = (),
    kueue: bool | None = None,
    log: Log = print,
) -> Growth:
    """Whether attempt `plan.attempt`, running on fewer ranks than `job.nodes`, should stop now to grow back.

    `released`: nodes a person released in the node health ledger since the attempt started (of
    the plan's exclusions, they count again); `quarantined`: the ledger's quarantined nodes (never
    counted). Not done while the attempt's decision, its pods or its training's start are still to
    come, or while another workload waits in its workspace's Kueue queue. Done (nothing to watch)
    when it runs on all nodes, ended, was already asked, is the DAG's last attempt (a planned
    restart takes an attempt of the DAG), or is a workspace job queued by the Airflow pool
    (`kueue`: Kueue queues workspace jobs; None: `[sat] k8s_kueue`).
    """
    if job.elastic is None or not job.distributed:
        return Growth(True, "not an elastic job")
    if plan.attempt >= job.max_attempts():
        return Growth(True, f"attempt {plan.attempt} is the last one: there is no attempt to grow back in")
    if job.workspace is not None and not (KubernetesSettings.from_sat_config().kueue if kueue is None else kueue):
        return Growth(True, f"workspace {job.workspace}'s jobs queue in the Airflow pool {pool_name(job.workspace)}, "
                            "whose waiting tasks this watch cannot see, so it does not grow back (with Kueue it "
                            "grows when no other workload waits in the workspace's queue: [sat] k8s_kueue)")
    ranks = read_attempt_ranks(client, namespace, job, run_id, plan.attempt)
    if ranks is None:
        return Growth(False, "rank 0 has not decided how many ranks the attempt runs")
    if ranks >= job.nodes:
        return Growth(True, f"attempt {plan.attempt} runs on all {job.nodes} nodes")
    pods = _attempt_pods(client, namespace, job, run_id, plan.attempt)
    if len(pods) < ranks:
        return Growth(False, f"{len(pods)} of the attempt's {ranks} pod(s) exist")
    if any(((p.metadata.annotations or {}).get(names.ANNOTATION_PLANNED_RESTART)) for p in pods):
        return Growth(True, "the attempt was already asked to stop for a planned restart")
    if any(p.metadata.deletion_timestamp or (p.status.phase if p.status else None) in ("Succeeded", "Failed")
           for p in pods):
        return Growth(True, f"attempt {plan.attempt} has ended")
    if not all(_training_started(p) for p in pods):
        return Growth(False, "the attempt's training has not started on every pod")
    if job.workspace is not None:
        waiting = workspace_queue_waiting(client, namespace, job.workspace)
        if waiting.done or waiting.count != 0:  # someone waits, or the count is unknown: not now
            return Growth(waiting.done, waiting.why)
    readmitted = [n for n in plan.exclude_nodes if n in released and n not in quarantined]
    excluded = [n for n in plan.exclude_nodes if n not in readmitted] + [n for n in quarantined
                                                                         if n not in plan.exclude_nodes]
    try:
        assessment = cluster_capacity(job, run_id, plan.model_copy(update={"exclude_nodes": excluded}),
                                      client=client, log=log)
    except CapacityForbidden as exc:
        return Growth(True, f"cannot count the healthy nodes ({exc}): the attempt runs on {ranks} to its end")
    if assessment is None:
        return Growth(False, "the Kubernetes API did not answer")
    held = {p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name}
    free = [n for n in assessment.fitting if n not in held]
    grow = grow_back(job, ranks, free, readmitted)
    if grow is None:
        return Growth(False, f"no room to grow from {ranks} of {job.nodes} nodes: {assessment.summary()}")
    return Growth(True, grow.why, grow, tuple(p.metadata.name for p in pods))


class QueueLook(NamedTuple):
    """What a workspace's Kueue LocalQueue says: `count` workloads waiting (None: unknown); `done`: never ask again."""

    count: int | None
    why: str
    done: bool = False


def workspace_queue_waiting(client: Any, namespace: str, workspace: str) -> QueueLook:
    """The workloads waiting in the workspace's LocalQueue (`status.pendingWorkloads`), the room's first claimants.

    A workspace's ClusterQueue serves this one namespace (`workspace.workspace_manifests`), so its
    LocalQueue's count is the whole queue's. Read with `get` on `localqueues` in the namespace, no
    cluster-wide grant. Refused (401/403) or missing (404): `done`, said why; anything else:
    unknown, asked again at the next look.
    """
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    name = local_queue_name(workspace)
    group, version = KUEUE_API.split("/")
    try:
        queue = CustomObjectsApi(client.api_client).get_namespaced_custom_object(
            group, version, namespace, "localqueues", name)
    except ApiException as exc:
        if exc.status in (401, 403, 404):
            return QueueLook(None, f"cannot read workspace {workspace}'s Kueue LocalQueue {namespace}/{name} "
                                   f"({exc.status} {exc.reason}): the attempt runs on its nodes to its end", True)
        return QueueLook(None, f"the Kubernetes API did not answer for LocalQueue {namespace}/{name} ({exc.status})")
    except (HTTPError, OSError) as exc:
        return QueueLook(None, f"the Kubernetes API did not answer for LocalQueue {namespace}/{name} "
                               f"({type(exc).__name__})")
    pending = ((queue or {}).get("status") or {}).get("pendingWorkloads")
    count = pending if isinstance(pending, int) and pending > 0 else 0  # absent (not counted yet): nobody
    if count:
        return QueueLook(count, f"{count} workload(s) wait in workspace {workspace}'s queue (LocalQueue "
                                f"{namespace}/{name}): the room that frees is theirs first")
    return QueueLook(0, f"no workload waits in workspace {workspace}'s queue")


def request_growth(client: Any, namespace: str, attempt: int, growth: Growth, *, log: Log = print) -> list[str]:
    """Ask the attempt's pods (`growth.pods`) to stop for their final checkpoint: the `sat.ai/planned-restart`
    annotation, which each pod's PID 1 reads through the downward API; the pods patched."""
    grow = growth.grow
    body = {"metadata": {"annotations": {names.ANNOTATION_PLANNED_RESTART: grow.why,
                                         names.ANNOTATION_READMITTED: ",".join(grow.readmitted)}}}
    for name in growth.pods:
        client.patch_namespaced_pod(name, namespace, body)
    log(f"[sat] elastic: {grow.why}: asked the {len(growth.pods)} pod(s) of attempt {attempt} to stop at their "
        f"final checkpoint; the next attempt runs on {grow.nodes} nodes (a planned restart, not a failover)")
    return list(growth.pods)


def _attempt_pods(client: Any, namespace: str, job: TrainingJob, run_id: str, attempt: int) -> list[Any]:
    """The attempt's pods (by its label, as classify and cleanup find them)."""
    selector = names.attempt_label_selector(job, run_id, attempt)
    return list(client.list_namespaced_pod(namespace, label_selector=selector).items)


def _training_started(pod: Any) -> bool:
    """The pod runs and its main container has started (its startupProbe, the engine's first step, passed)."""
    status = pod.status
    if status is None or status.phase != "Running":
        return False
    return any(c.started for c in status.container_statuses or ())
