"""A workspace job's failover on Kubernetes waits for healthy room in its workspace, and its status says so.

The failover attempt's pods select the workspace's nodes and avoid the nodes that failed
(`pods._scheduling`), so with too few healthy, free nodes they would sit Pending while the
job said Running. Before it creates them, the launch asks the cluster the same question as
the Spot capacity check (`capacity.cluster_capacity`, on the pod as it would be submitted:
the workspace's selector and taint, the exclusions, the requests) until `job.nodes` nodes
fit, recording `Pending - failoverinprogress` with the answer, or fails at
`[sat] workspace_wait_seconds` with it. A connection that may not list nodes skips the
wait (the pods then wait Pending, as without a workspace).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sat_tasks.backends.kubernetes.capacity import CapacityForbidden, cluster_capacity
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.errors import JobStopped
from sat_tasks.spec import TrainingJob


class WorkspaceFailoverTimeout(JobStopped):
    """The workspace had too few healthy nodes for the failover until `[sat] workspace_wait_seconds` ran out."""


def needs_workspace_wait(job: TrainingJob, plan: Plan) -> bool:
    """Only a failover attempt of a workspace job waits here (the first attempt queues in Kueue or the pool)."""
    return job.workspace is not None and plan.attempt > 1 and plan.failovers > 0


def await_workspace_nodes(
    job: TrainingJob,
    run_id: str,
    plan: Plan,
    *,
    client: Any,
    history: StatusHistory | None,
    deadline_seconds: float,
    poll_seconds: float = 15.0,
    log: Log = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    release_warm: Callable[[str, int, Log, Any], list[str]] | None = None,
) -> bool:
    """Wait until the failover fits the workspace's healthy nodes; True when it waited at all.

    `history` None: wait without recording (the ranks other than 0). Raises
    WorkspaceFailoverTimeout (status Failed, recorded) past `deadline_seconds`. The first time
    there is no room, the workspace's warm placeholders are released (`release_warm`, default
    `warm.release_for_capacity`) and the room looked at again before waiting.
    """
    if not needs_workspace_wait(job, plan):
        return False
    deadline = clock() + deadline_seconds
    last_reason = None
    released_warm = False
    while True:
        try:
            assessment = cluster_capacity(job, run_id, plan,
                                          client=client, log=log)
        except CapacityForbidden as exc:
            log(f"[sat] workspace {job.workspace}: cannot check its nodes ({exc}); launching without waiting")
            return last_reason is not None
        if assessment is not None and assessment.available:
            if last_reason is not None:
                log(f"[sat] workspace {job.workspace}: room for the failover again ({assessment.summary()})")
            return last_reason is not None
        found = assessment.summary() if assessment is not None else "the Kubernetes API did not answer"
        reason = (f"failover of attempt {plan.attempt} waits for healthy nodes in workspace {job.workspace} "
                  f"(excluded: {', '.join(plan.exclude_nodes) or 'none'}): {found}")
        if last_reason is None and not released_warm:  # no room: the workspace's warm placeholders go first
            released_warm = True
            try:
                if (release_warm or _release_warm)(job.workspace, job.nodes, log, client):
                    continue  # look again at once: the freed nodes may be all it needed
            except Exception as exc:  # noqa: BLE001 - no warm state to free: wait as before
                log(f"[sat] warm pool: could not release the workspace's warm placeholders: {exc}")
        if reason != last_reason:
            last_reason = reason
            log(f"[sat] {reason}")
            if history is not None:
                history.record(JobStatus.FAILOVER_IN_PROGRESS, reason, attempt=plan.attempt, task="launch")
        if clock() >= deadline:
            why = f"waited {deadline_seconds:.0f}s ([sat] workspace_wait_seconds): {reason}"
            if history is not None:
                history.record(JobStatus.FAILED, why, attempt=plan.attempt, task="launch")
            raise WorkspaceFailoverTimeout(why)
        sleep(poll_seconds)


def _release_warm(workspace: str, nodes: int, log: Log, client: Any) -> list[str]:
    from sat_tasks.backends.kubernetes.warm import release_for_capacity

    return release_for_capacity(workspace, nodes, log, client=client)
