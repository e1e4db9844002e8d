"""The attempt record: what one training attempt left behind, from either backend."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ckpt_engine.contract import ProgressRecord

__all__ = [
    "LOG_TAIL_LINES", "MAIN_CONTAINER_NAME", "NODE_LOG_LINES", "AttemptRecord", "Interruption", "attempt_group_id",
    "attempt_in_task_id",
]

#: Name KubernetesPodOperator gives the training container; preferred as the main one.
MAIN_CONTAINER_NAME = "base"
#: How many trailing lines of the container log a record keeps.
LOG_TAIL_LINES = 1000
#: How many kernel-log lines of the node a record keeps (the newest).
NODE_LOG_LINES = 2000


def attempt_group_id(k: int) -> str:
    """The id of attempt k's task group in a job's DAG (`attempt_<k>`); its tasks are `attempt_<k>.<task>`."""
    return f"attempt_{k}"


def attempt_in_task_id(task_id: str) -> tuple[int, str] | None:
    """`(k, task)` for a task id `attempt_<k>.<task>` of an attempt group; None for a task outside them."""
    group, dot, task = task_id.partition(".")
    number = group.removeprefix("attempt_")
    if not dot or not task or number == group or not number.isdigit():
        return None
    return int(number), task


class AttemptRecord(BaseModel):
    """Everything `classify` needs to know about one attempt of a Training Job.

    Built by the local backend directly, or from Kubernetes objects with
    `sat_tasks.classify.loaders.record_from_pod`. Round-trips through JSON with `model_dump(mode="json")` and
    `AttemptRecord.model_validate`.

    Fields:
        job: the Training Job name.
        attempt: 1-based attempt number.
        backend: the name of the backend that ran it (`local`, `kubernetes`, any installed one).
        node: the node the attempt ran on (local pool name or k8s node name).
        nodes: every node the attempt held, `node` first (empty when only `node` is known); fewer than
            the job's `nodes` after an elastic failover resumed on fewer (ADR 0029).
        exit_code: exit status of the main process/container; negative values from
            `subprocess` mean "killed by signal -exit_code".
        signal: signal number that killed the process (local backend, or the k8s
            terminated state's `signal`).
        termination_reason: e.g. OOMKilled, Error, Completed, Evicted, Preempted.
        termination_message: the human message that goes with the reason
            (pod `status.message`, or the container's terminated `message`).
        container_states: k8s `containerStatuses` entries (name, state, lastState, ...).
        pod_conditions: k8s pod `status.conditions`.
        events: k8s events of the pod and node (each at least reason/message/type).
        node_conditions: k8s node `status.conditions`.
        node_taints: k8s node `spec.taints` (Spot interruption taints live here).
        node_labels: k8s node `metadata.labels` (Spot/preemptible capacity is read from
            them); empty when the node object is gone or unreadable, and on the local backend.
        node_labels_at_start: the node's labels as the launcher read them when the attempt
            started; kept so a node that is gone by the end (a Spot shutdown deletes it) can
            still be told Spot from on-demand. Empty when unknown.
        log_tail: the last lines of the container log.
        node_log: kernel-log lines of the node (e.g. NVRM Xid lines).
        started_at / finished_at: when the main process started and ended.
        progress: the engine's progress.json as read (`ckpt_engine.contract.ProgressRecord`'s
            fields; `progress_record` is the typed view): structured data the engine
            writes, never parsed from log text.
        preemption_notice: the local backend delivered a Spot SIGTERM notice.
        heartbeat_timeout: the launcher saw training stop making progress after it started.
        startup_timeout: the attempt never reached its first training step within the
            job's start-up deadline (`startup_timeout_seconds`).
        image: the training image reference.
        stopped_by: who asked the service to stop the job while this attempt ran (the
            launcher passed the request on as SIGTERM; the engine's final checkpoint follows).
        planned_restart: why the launcher stopped an elastic attempt on fewer nodes to grow back
            (SIGTERM, the engine's final checkpoint; ADR 0029): not a fault; its verdict is
            PLANNED_RESTART (`core.policy.grow_verdict`). None otherwise.
        readmitted_nodes: nodes the plan excluded that were released since and that the next
            attempt takes back (with `planned_restart`).
        end_facts: what SAT read of who ended the process, beyond the fields above
            (`sat_tasks.classify.ended`, ADR 0004): `deletion_timestamp` (the pod's
            `metadata.deletionTimestamp`), `managers` (the pod's `managedFields` managers:
            `manager`, `operation`, `time`, `disruption` when it wrote the DisruptionTarget
            condition), `node_gone` (the Node object was not found when the attempt ended),
            `who` (a backend that knows who ended it: `process`, `runtime`, `controller`, `node`).
            Empty in records written before it existed: the classifier then reads the rest.
    """

    job: str
    attempt: int = Field(ge=1)
    backend: str
    node: str | None = None
    nodes: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    signal: int | None = None
    termination_reason: str | None = None
    termination_message: str | None = None
    container_states: list[dict[str, Any]] = Field(default_factory=list)
    pod_conditions: list[dict[str, Any]] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    node_conditions: list[dict[str, Any]] = Field(default_factory=list)
    node_taints: list[dict[str, Any]] = Field(default_factory=list)
    node_labels: dict[str, str] = Field(default_factory=dict)
    node_labels_at_start: dict[str, str] = Field(default_factory=dict)
    log_tail: list[str] = Field(default_factory=list)
    node_log: list[str] = Field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: dict[str, Any] | None = None
    preemption_notice: bool = False
    heartbeat_timeout: bool = False
    startup_timeout: bool = False
    image: str | None = None
    stopped_by: str | None = None
    planned_restart: str | None = None
    readmitted_nodes: list[str] = Field(default_factory=list)
    end_facts: dict[str, Any] = Field(default_factory=dict)

    @field_validator("log_tail", "node_log", mode="before")
    @classmethod
    def _split_text(cls, value: Any) -> Any:
        """Accept a whole log as one string as well as a list of lines."""
        if value is None:
            return []
        if isinstance(value, str):
            return value.splitlines()
        return value

    @property
    def progress_record(self) -> ProgressRecord:
        """The engine's progress.json as the contract's record (an empty one when there is none)."""
        return ProgressRecord.from_dict(self.progress)

    @property
    def last_committed_step(self) -> int | None:
        """The last step the checkpoint engine committed, from progress.json, or None."""
        step: Any = self.progress_record.last_committed_step
        if step is None or isinstance(step, bool):
            return None
        try:
            return int(step)
        except (TypeError, ValueError):
            return None

    def with_progress(self, **changes: Any) -> AttemptRecord:
        """A copy whose progress.json has ``changes`` (ProgressRecord's field names: another name raises TypeError)."""
        dataclasses.replace(self.progress_record, **changes)  # checks the names against the contract
        return self.model_copy(update={"progress": {**(self.progress or {}), **changes}})


# progress.json keys that belong to the attempt that wrote them (the rest outlives it).
_ATTEMPT_OWN_PROGRESS = ("step", "resumed_from_step", "in_flight_step", "attempt")


def progress_of_attempt(progress: dict[str, Any] | None, attempt: int) -> dict[str, Any] | None:
    """The engine's progress.json as it concerns attempt `attempt`.

    The file outlives attempts (the run's output directory and its mirror are shared).
    Committed checkpoints stay valid (`last_committed_step`, `committed_steps`); the step,
    the resume point and the in-flight checkpoint written by another attempt (its
    `attempt` stamp differs) are not this one's and are dropped.
    """
    if not progress:
        return progress
    if ProgressRecord.from_dict(progress).attempt not in (None, attempt):
        return {k: v for k, v in progress.items() if k not in _ATTEMPT_OWN_PROGRESS}
    return progress


@dataclasses.dataclass(frozen=True)
class Interruption:
    """An attempt whose `launch` task ended before the attempt did, found when the task runs again.

    A service restart (`make down`, a crash, a host reboot: Airflow resets the orphaned task and
    runs it again) or the task process killed alone (Airflow retries it). The attempt resumes
    from `resume_step`, without spending a failover.

    Fields:
        attempt: the attempt that was interrupted (and now resumes).
        last_seen: when the interrupted try last wrote to the job log (or the engine's progress), if known.
        left_running: processes of the interrupted try found still running and stopped (a task killed alone).
        resume_step: the checkpoint the attempt resumes from (None: none was committed, it starts again).
    """

    attempt: int
    last_seen: datetime | None = None
    left_running: int = 0
    resume_step: int | None = None

    @property
    def reason(self) -> str:
        """The status history's reason and the job log's line: what happened, and from where training goes on."""
        at = self.last_seen.isoformat(timespec="seconds") if self.last_seen else "an unknown time"
        if self.left_running:
            what = (f"attempt {self.attempt} was interrupted: its launch task died (last heard from at {at}) while training went on "
                    f"({self.left_running} process(es) of it stopped)")
        else:
            what = f"attempt {self.attempt} was interrupted by a service restart at {at}"
        where = ("no checkpoint was committed, so it starts again from step 0" if self.resume_step is None
                 else "resumed from the newest committed checkpoint" if self.resume_step < 0
                 else f"resumed from checkpoint-{self.resume_step}")
        return f"{what}; {where} (not a failover: none spent)"
