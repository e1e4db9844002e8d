"""Job status in the service's words, and the recorded history of its transitions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from sat_tasks.core.clock import now_utc


class JobStatus(str, Enum):
    """The status words users know from the managed service."""

    PENDING = "Pending"
    RUNNING = "Running"
    FAILOVER_IN_PROGRESS = "Pending - failoverinprogress"
    MAX_RETRIES_EXCEEDED = "Pending - maxretriesexceeded"
    IMAGE_PULL_BACKOFF = "Pending - imagepullbackoff"
    INTERNAL_ERROR = "Pending - internalerror"
    PREEMPTED = "Pending - preempted"
    FAILED = "Failed"
    COMPLETED = "Completed"
    STOPPED = "Stopped"  # a person stopped it (the reason names who)


TERMINAL = {
    JobStatus.MAX_RETRIES_EXCEEDED,
    JobStatus.IMAGE_PULL_BACKOFF,
    JobStatus.INTERNAL_ERROR,
    JobStatus.FAILED,
    JobStatus.COMPLETED,
    JobStatus.STOPPED,
}


# Airflow's DAG run ends success or failed, nothing else: success is kept for a job that completed
# (its results uploaded), so Airflow's counts, its on-success callbacks and anything waiting for
# the run's success (a sensor, an Asset consumer) see only those; every other end is failed. Why
# Airflow shows a job that did not fail as failed (the job page and `finalize`'s message say it):
AIRFLOW_FAILED_BECAUSE = {
    JobStatus.STOPPED: "Airflow shows this run as failed: a DAG run ends only as success or failed, and success "
                       "means the job completed and its results were uploaded. A stopped job did not (its committed "
                       "checkpoints stay under the run's results), as a run a person marks failed in Airflow.",
    **{status: f"Airflow shows this run as failed: it has no state for {status.value!r}. The job waits for a "
               "person (a fix, then a new run); this run of it has ended without results."
       for status in (JobStatus.MAX_RETRIES_EXCEEDED, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.INTERNAL_ERROR)},
}


def airflow_run_state(status: str | None) -> str:
    """The state the job's DAG run ends in when the job ended as `status`: `success` for Completed only, else `failed`."""
    return "success" if status == JobStatus.COMPLETED.value else "failed"


def airflow_failed_because(status: str | None) -> str | None:
    """Why Airflow shows a run that ended as `status` failed, when the status does not say it (Stopped, Pending - *)."""
    return next((why for known, why in AIRFLOW_FAILED_BECAUSE.items() if known.value == status), None)


@dataclass
class StatusChange:
    """One recorded transition.

    `nodes_held` and `nodes`: on an elastic job's attempt start (ADR 0029), the nodes the attempt
    holds and the job's node count, so what it runs short is read from numbers, not from the
    reason's words. Left out of the stored entry when unset (every other transition).
    """

    status: str
    at: str
    reason: str
    attempt: int | None = None
    task: str | None = None
    nodes_held: int | None = None
    nodes: int | None = None

    def to_entry(self) -> dict[str, Any]:
        """The stored entry: every field, less the node counts when unset."""
        entry = asdict(self)
        for name in ("nodes_held", "nodes"):
            if entry[name] is None:
                del entry[name]
        return entry


class StatusHistory:
    """The status history of one job run, persisted through a load/save pair.

    `load()` returns the list of dicts stored so far (or None); `save(list)` stores it.
    Every `record()` appends, saves and logs, so the history survives the task.
    """

    def __init__(self, load: Callable[[], list[dict] | None], save: Callable[[list[dict]], None], log=print):
        self._load = load
        self._save = save
        self._log = log

    def entries(self) -> list[dict[str, Any]]:
        """Every transition so far, oldest first."""
        return list(self._load() or [])

    def current(self) -> str | None:
        """The latest status, or None before the first."""
        entries = self.entries()
        return entries[-1]["status"] if entries else None

    def record(self, status: JobStatus, reason: str, *, attempt: int | None = None, task: str | None = None,
               nodes_held: int | None = None, nodes: int | None = None) -> None:
        """Append one transition (a repeat of the current status with the same reason is not repeated).

        `nodes_held` of `nodes`: what an elastic attempt's start holds (`StatusChange`).
        """
        entries = self.entries()
        if entries and entries[-1]["status"] == status.value and entries[-1]["reason"] == reason:
            return
        change = StatusChange(status=status.value, at=now_utc().isoformat(), reason=reason, attempt=attempt, task=task,
                              nodes_held=nodes_held, nodes=nodes)
        entries.append(change.to_entry())
        self._save(entries)
        self._log(f"[sat] job status -> {status.value}: {reason}")
