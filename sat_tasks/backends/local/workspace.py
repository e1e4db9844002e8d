"""Where an attempt runs on the local backend: the shared pool, or its workspace's nodes through the slot board.

A job without a workspace takes a slot on the least-loaded healthy node of `[sat] local_nodes`
(`[sat] local_node_slots` each, `backends.local.pool`), queued while all are taken. A job of a
workspace queues on the workspace's slot board (`sat_tasks.io.workspaces.SlotBoard`) for
`job.nodes` of its nodes (`<workspace>-node-<i>`, as many as the workspace has now), holds
them while the attempt runs and gives them back when it ends. While it waits its status
says why: `Pending` in the queue, `Pending - failoverinprogress` for a failover attempt
(its excluded nodes count against the workspace), until `[sat] workspace_wait_seconds`.
Either way, the nodes the node health ledger quarantined are skipped like excluded ones
(`sat_tasks.io.node_ledger`, ADR 0004) until a person releases them.
The attempt runs on the first node it holds (the local backend runs every rank of a
multi-node job on one host; the others are held so no other job gets them). An elastic job
(ADR 0029) holds `job.nodes` nodes of the shared pool too, and its failover may resume on
fewer (`HeldNodes.note` says so).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator

from sat_tasks import config
from sat_tasks.backends.local.runner import pick_node
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.core.policy import GrowBack, elastic_shrink, grow_back, shrink_reason
from sat_tasks.core.status import JobStatus
from sat_tasks.core.workspaces import Admission, workspace_nodes
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore, WorkspaceWaitTimeout


def node_pool(workspace_name: str | None) -> list[str]:
    """The nodes a job may run on: its workspace's (as many as it has now), else `[sat] local_nodes`."""
    if workspace_name is None:
        return config.local_node_pool()
    return workspace_nodes(WorkspaceStore().get(workspace_name))


def avoided_nodes(run: JobRun, plan: Plan, log: Log) -> list[str]:
    """The plan's excluded nodes (earlier failed attempts) and the nodes the node health ledger quarantined."""
    from sat_tasks.io.node_ledger import quarantined_nodes

    try:
        hook = run.hook()
    except Exception as exc:  # noqa: BLE001 - placement goes on without the ledger
        log(f"[sat] node health: no Object Storage connection ({type(exc).__name__}: {exc}); placing without it")
        return list(plan.exclude_nodes)
    quarantined = quarantined_nodes(run.job, hook, log)
    return list(plan.exclude_nodes) + [n for n in quarantined if n not in plan.exclude_nodes]


class HeldNodes(list):
    """The nodes an attempt holds (a list: the first is where its processes run), with what placement has to say.

    `note`: for an elastic failover that resumed on fewer nodes, the status history's words
    ("resumed on 1 of 2 nodes (local-node-0 excluded: HARDWARE); ..."), else "".
    """

    def __init__(self, nodes: Iterable[str], note: str = "") -> None:
        super().__init__(nodes)
        self.note = note


def _per_node(job) -> bool:
    """A multi-node job whose attempts run a container per node (container mode, ADR 0035): it holds its nodes."""
    from sat_tasks.backends.local.container_run import chosen_runtime

    return job.distributed and chosen_runtime() == "container"


#: A way to hold nodes: (slots, seconds to wait) -> (release, nodes); WorkspaceWaitTimeout past the wait.
Holder = Callable[[int, float], tuple[Callable[[], None], tuple[str, ...]]]


@contextlib.contextmanager
def attempt_nodes(run: JobRun, plan: Plan, log: Log, *, poll_seconds: float = 1.0) -> Iterator[HeldNodes]:
    """The nodes attempt `plan.attempt` runs on (first = where its processes run), held until the block ends.

    An elastic job (ADR 0029) holds `job.nodes` nodes of the shared pool (one rank each); its failover
    waits `elastic.wait_seconds` for them, then resumes on as many healthy nodes as it has, down to
    `elastic.min_nodes` (`core.policy.elastic_shrink`).
    """
    job = run.job
    exclude = avoided_nodes(run, plan, log)
    failover = plan.attempt > 1 and plan.failovers > 0

    def on_wait(answer: Admission) -> None:
        log(f"[sat] waiting for {'a local node' if job.workspace is None else 'workspace nodes'}: {answer.reason}")
        status = JobStatus.FAILOVER_IN_PROGRESS if failover or answer.lacks_healthy_nodes else JobStatus.PENDING
        run.history(log).record(status, answer.reason, attempt=plan.attempt, task="launch")

    deadline = float(config.sat_setting("workspace_wait_seconds"))
    hold = (_workspace_holder if job.workspace is not None else _pool_holder)(
        run, plan, exclude, failover, on_wait, poll_seconds, log)
    try:
        release, nodes, note = _hold_nodes(run, plan, exclude, failover, hold, deadline, log)
    except WorkspaceWaitTimeout as exc:
        run.history(log).record(JobStatus.FAILED, str(exc), attempt=plan.attempt, task="launch")
        raise
    try:
        yield HeldNodes(nodes, note)
    finally:
        release()


def _hold_nodes(run: JobRun, plan: Plan, exclude: list[str], failover: bool, hold: Holder, deadline: float,
                log: Log) -> tuple[Callable[[], None], tuple[str, ...], str]:
    """Hold the attempt's nodes: all of them, or for an elastic failover with too few healthy, fewer (and why)."""
    job = run.job
    full = job.nodes if job.workspace is not None or job.elastic is not None or _per_node(job) else 1
    if job.elastic is None or not failover:
        return (*hold(full, deadline), "")
    started = time.monotonic()
    try:
        return (*hold(full, min(job.elastic.wait_seconds, deadline)), "")
    except WorkspaceWaitTimeout as exc:
        waited = str(exc)
    healthy = [n for n in node_pool(job.workspace) if n not in exclude]
    shrink = elastic_shrink(job, len(healthy))
    left = max(deadline - (time.monotonic() - started), 0.0)
    if shrink.nodes is None:
        why = f"{shrink.why}; waiting for {full} node(s) as a job without elastic would"
        log(f"[sat] {why}")
        run.history(log).record(JobStatus.FAILOVER_IN_PROGRESS, why, attempt=plan.attempt, task="launch")
        return (*hold(full, left), "")
    log(f"[sat] elastic: {waited}; resuming on {shrink.nodes} of {job.nodes} node(s) instead")
    release, nodes = hold(shrink.nodes, left)
    quarantined = set(exclude) - set(plan.exclude_nodes)
    excluded = {n: ("quarantined by the node health ledger" if n in quarantined else "HARDWARE")
                for n in node_pool(job.workspace) if n in exclude}
    return release, nodes, shrink_reason(shrink._replace(why=f"resumed on {len(nodes)} of {job.nodes} nodes"),
                                         excluded)


def _workspace_holder(run: JobRun, plan: Plan, exclude: list[str], failover: bool,
                      on_wait: Callable[[Admission], None], poll_seconds: float, log: Log) -> Holder:
    """Holding nodes on the workspace's slot board (its warm run's node first)."""
    from sat_tasks.backends.local.warm import release_nodes_taken, warm_node_first

    job = run.job
    store, board = WorkspaceStore(), SlotBoard(job.workspace)
    prefer = warm_node_first(run, workspace_nodes(store.get(job.workspace)))  # the node a warm run kept, first

    def hold(slots: int, seconds: float) -> tuple[Callable[[], None], tuple[str, ...]]:
        ticket, nodes = board.acquire(lambda: store.get(job.workspace), job=job.name, run_id=run.run_id,
                                      attempt=plan.attempt, slots=slots, exclude=exclude,
                                      failover=failover, prefer=prefer, deadline_seconds=seconds, on_wait=on_wait,
                                      poll_seconds=poll_seconds)
        log(f"[sat] workspace {job.workspace}: attempt {plan.attempt} holds {', '.join(nodes)}")
        try:
            release_nodes_taken(job.workspace, list(nodes), job.name, log)  # the workspace needed them: warm runs go
        except Exception as exc:  # noqa: BLE001 - a warm state left over is swept at expiry; the attempt runs
            log(f"[sat] warm pool: could not release warm states on {', '.join(nodes)}: {type(exc).__name__}: {exc}")

        def release() -> None:
            board.release(ticket)
            log(f"[sat] workspace {job.workspace}: released {', '.join(nodes)}")

        return release, tuple(nodes)

    return hold


def _pool_holder(run: JobRun, plan: Plan, exclude: list[str], failover: bool,
                 on_wait: Callable[[Admission], None], poll_seconds: float, log: Log) -> Holder:
    """Holding slots on nodes of the shared pool (`backends.local.pool`)."""
    from sat_tasks.backends.local.pool import PoolBoard, node_pool_now
    from sat_tasks.backends.local.warm import warm_node_first

    pool = node_pool_now()
    pick_node(pool.nodes, exclude)  # every node excluded: NoHealthyNodeError at once, as before slots
    warm = warm_node_first(run, list(pool.nodes))
    prefer = tuple(warm[:1]) if warm != list(pool.nodes) else ()  # the node a warm run kept (the first wins ties)
    board = PoolBoard()

    def hold(slots: int, seconds: float) -> tuple[Callable[[], None], tuple[str, ...]]:
        ticket, nodes = board.acquire(node_pool_now, job=run.job.name, run_id=run.run_id, attempt=plan.attempt,
                                      slots=slots, exclude=exclude, failover=failover, prefer=prefer,
                                      deadline_seconds=seconds, on_wait=on_wait, poll_seconds=poll_seconds)
        return (lambda: board.release(ticket)), tuple(nodes)

    return hold


def growth_watch(run: JobRun, plan: Plan, nodes: list[str], log: Log) -> Callable[[], GrowBack | None] | None:
    """For an elastic attempt on fewer nodes than the job's: the runner's question "may it grow back now?".

    None when there is nothing to ask: not elastic, all nodes held, or no attempt left after this one
    (a planned restart takes an attempt of the DAG, though no failover). The answer counts nodes that
    are healthy (not quarantined; not excluded by the plan unless a person released them after this
    attempt was placed), not held by this attempt, with a free slot, while no other job waits for
    one (`core.policy.grow_back`).
    """
    job = run.job
    if job.elastic is None or len(nodes) >= job.nodes or plan.attempt >= job.max_attempts():
        return None
    since, held = time.time(), set(nodes)

    def check() -> GrowBack | None:
        from sat_tasks.io.node_ledger import NodeLedger

        ledger = NodeLedger.for_job(job, run.hook())
        released = sorted({r.node for r in ledger.releases() if r.at >= since and r.node in plan.exclude_nodes})
        quarantined = set(ledger.quarantined())
        usable = [n for n in node_pool(job.workspace) if n not in held and n not in quarantined
                  and (n not in plan.exclude_nodes or n in released)]
        return grow_back(job, len(nodes), _with_free_slot(run, usable), released)

    return check


def _with_free_slot(run: JobRun, candidates: list[str]) -> list[str]:
    """The candidates with a free slot on the job's board now; none while another run waits for one."""
    if run.job.workspace is None:
        from sat_tasks.backends.local.pool import PoolBoard, node_pool_now

        board, slots = PoolBoard(), node_pool_now().slots
    else:
        board, slots = SlotBoard(run.job.workspace), 1
    uses = board.uses()
    if any(u.state == "queued" and u.run_id != run.run_id for u in uses):
        return []
    load: dict[str, int] = {}
    for use in uses:
        for node in use.nodes:
            load[node] = load.get(node, 0) + 1
    return [n for n in candidates if load.get(n, 0) < slots]
