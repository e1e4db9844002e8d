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
multi-node job on one host; the others are held so no other job gets them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from sat_tasks import config
from sat_tasks.backends.local.runner import pick_node
from sat_tasks.core.contracts import Log, Plan
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


@contextlib.contextmanager
def attempt_nodes(run: JobRun, plan: Plan, log: Log, *, poll_seconds: float = 1.0) -> Iterator[list[str]]:
    """The nodes attempt `plan.attempt` runs on (first = where its processes run), held until the block ends."""
    job = run.job
    exclude = avoided_nodes(run, plan, log)
    failover = plan.attempt > 1 and plan.failovers > 0

    def on_wait(answer: Admission) -> None:
        log(f"[sat] waiting for {'a local node' if job.workspace is None else 'workspace nodes'}: {answer.reason}")
        status = JobStatus.FAILOVER_IN_PROGRESS if failover or answer.lacks_healthy_nodes else JobStatus.PENDING
        run.history(log).record(status, answer.reason, attempt=plan.attempt, task="launch")

    from sat_tasks.backends.local.warm import warm_node_first

    deadline = float(config.sat_setting("workspace_wait_seconds"))
    if job.workspace is None:
        with shared_pool_slot(run, plan, exclude, failover, on_wait, deadline, poll_seconds, log) as node:
            yield [node]
        return
    store, board = WorkspaceStore(), SlotBoard(job.workspace)
    prefer = warm_node_first(run, workspace_nodes(store.get(job.workspace)))  # the node a warm run kept, first
    try:
        ticket, nodes = board.acquire(lambda: store.get(job.workspace), job=job.name, run_id=run.run_id,
                                      attempt=plan.attempt, slots=job.nodes, exclude=exclude,
                                      failover=failover, prefer=prefer, deadline_seconds=deadline, on_wait=on_wait,
                                      poll_seconds=poll_seconds)
    except WorkspaceWaitTimeout as exc:
        run.history(log).record(JobStatus.FAILED, str(exc), attempt=plan.attempt, task="launch")
        raise
    log(f"[sat] workspace {job.workspace}: attempt {plan.attempt} holds {', '.join(nodes)}")
    try:
        from sat_tasks.backends.local.warm import release_nodes_taken

        release_nodes_taken(job.workspace, list(nodes), job.name, log)  # the workspace needed them: warm runs go
    except Exception as exc:  # noqa: BLE001 - a warm state left over is swept at expiry; the attempt runs
        log(f"[sat] warm pool: could not release warm states on {', '.join(nodes)}: {type(exc).__name__}: {exc}")
    try:
        yield list(nodes)
    finally:
        board.release(ticket)
        log(f"[sat] workspace {job.workspace}: released {', '.join(nodes)}")


@contextlib.contextmanager
def shared_pool_slot(run: JobRun, plan: Plan, exclude: list[str], failover: bool,
                     on_wait: Callable[[Admission], None], deadline: float, poll_seconds: float,
                     log: Log) -> Iterator[str]:
    """A slot on a node of the shared pool (`backends.local.pool`), held until the block ends."""
    from sat_tasks.backends.local.pool import PoolBoard, node_pool_now
    from sat_tasks.backends.local.warm import warm_node_first

    pool = node_pool_now()
    pick_node(pool.nodes, exclude)  # every node excluded: NoHealthyNodeError at once, as before slots
    warm = warm_node_first(run, list(pool.nodes))
    prefer = tuple(warm[:1]) if warm != list(pool.nodes) else ()  # the node a warm run kept (the first wins ties)
    board = PoolBoard()
    try:
        ticket, (node,) = board.acquire(node_pool_now, job=run.job.name, run_id=run.run_id, attempt=plan.attempt,
                                        slots=1, exclude=exclude, failover=failover, prefer=prefer,
                                        deadline_seconds=deadline, on_wait=on_wait, poll_seconds=poll_seconds)
    except WorkspaceWaitTimeout as exc:
        run.history(log).record(JobStatus.FAILED, str(exc), attempt=plan.attempt, task="launch")
        raise
    try:
        yield node
    finally:
        board.release(ticket)
