"""The attempt record: what one training attempt left behind, from either backend."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

__all__ = ["AttemptRecord", "record_from_pod", "job_and_attempt_of_pod", "MAIN_CONTAINER_NAME"]

#: Name KubernetesPodOperator gives the training container; preferred as the main one.
MAIN_CONTAINER_NAME = "base"
#: How many trailing lines of the container log a record keeps.
LOG_TAIL_LINES = 1000
#: How many kernel-log lines of the node a record keeps (the newest).
NODE_LOG_LINES = 2000

_ATTEMPT_IN_TASK_ID = re.compile(r"attempt_(\d+)")


class AttemptRecord(BaseModel):
    """Everything `classify` needs to know about one attempt of a Training Job.

    Built by the local backend directly, or from Kubernetes objects with
    `record_from_pod`. Round-trips through JSON with `model_dump(mode="json")` and
    `AttemptRecord.model_validate`.

    Fields:
        job: the Training Job name.
        attempt: 1-based attempt number.
        backend: `local` or `kubernetes`.
        node: the node the attempt ran on (local pool name or k8s node name).
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
        log_tail: the last lines of the container log.
        node_log: kernel-log lines of the node (e.g. NVRM Xid lines).
        started_at / finished_at: when the main process started and ended.
        progress: the engine's progress.json (`step`, `last_committed_step`).
        preemption_notice: the local backend delivered a Spot SIGTERM notice.
        heartbeat_timeout: the launcher saw training stop making progress.
        image: the training image reference.
    """

    job: str
    attempt: int = Field(ge=1)
    backend: Literal["local", "kubernetes"]
    node: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    termination_reason: str | None = None
    termination_message: str | None = None
    container_states: list[dict[str, Any]] = Field(default_factory=list)
    pod_conditions: list[dict[str, Any]] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    node_conditions: list[dict[str, Any]] = Field(default_factory=list)
    node_taints: list[dict[str, Any]] = Field(default_factory=list)
    log_tail: list[str] = Field(default_factory=list)
    node_log: list[str] = Field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: dict[str, Any] | None = None
    preemption_notice: bool = False
    heartbeat_timeout: bool = False
    image: str | None = None

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
    def last_committed_step(self) -> int | None:
        """The last step the checkpoint engine committed, from progress.json, or None."""
        if not self.progress:
            return None
        step = self.progress.get("last_committed_step")
        if step is None or isinstance(step, bool):
            return None
        try:
            return int(step)
        except (TypeError, ValueError):
            return None


def _as_lines(text: list[str] | str | None, keep: int) -> list[str]:
    if text is None:
        return []
    lines = text.splitlines() if isinstance(text, str) else [str(line).rstrip("\n") for line in text]
    return lines[-keep:]


def _main_container_status(pod: dict[str, Any], container: str | None) -> dict[str, Any] | None:
    """The status entry of the training container: named, `base`, or the first spec'd one."""
    statuses = pod.get("status", {}).get("containerStatuses") or []
    by_name = {status.get("name"): status for status in statuses}
    wanted = [container] if container else []
    wanted.append(MAIN_CONTAINER_NAME)
    wanted += [c.get("name") for c in pod.get("spec", {}).get("containers") or []]
    for name in wanted:
        if name in by_name:
            return by_name[name]
    return statuses[0] if statuses else None


def _terminated(status: dict[str, Any] | None) -> dict[str, Any] | None:
    """The current terminated state, else the last one (a restarted container)."""
    if not status:
        return None
    return (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")


def _labels_job_and_attempt(pod: dict[str, Any]) -> tuple[str | None, int | None]:
    labels = pod.get("metadata", {}).get("labels") or {}
    job = labels.get("sat.ai/job") or labels.get("sat/job") or labels.get("dag_id")
    match = _ATTEMPT_IN_TASK_ID.search(labels.get("task_id", ""))
    return job, int(match.group(1)) if match else None


def record_from_pod(
    pod: dict[str, Any],
    *,
    job: str,
    attempt: int,
    log: list[str] | str | None = None,
    node_log: list[str] | str | None = None,
    events: list[dict[str, Any]] | None = None,
    node: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
    container: str | None = None,
) -> AttemptRecord:
    """Build an `AttemptRecord` from a pod as `kubectl get pod NAME -o json` prints it.

    Args:
        pod: the Pod object (a dict).
        job, attempt: which Training Job attempt this pod ran.
        log: the container log (text or lines); the last `LOG_TAIL_LINES` are kept.
        node_log: kernel-log lines of the node.
        events: Event objects (or `EventList.items`) of the pod and its node.
        node: the Node object (`kubectl get node NAME -o json`) for conditions/taints.
        progress: the engine's progress.json, when the launcher read it.
        container: the training container's name (default: `base`, else the first).
    """
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    main = _main_container_status(pod, container)
    terminated = _terminated(main)
    running = ((main or {}).get("state") or {}).get("running")

    # Pod-level reasons (Evicted, Terminated, NodeLost, UnexpectedAdmissionError, ...)
    # say more than the container's "Error"; the container states stay in the record.
    reason = status.get("reason") or (terminated or {}).get("reason")
    message = status.get("message") or (terminated or {}).get("message")

    container_states = [
        {**entry, "init": True} for entry in status.get("initContainerStatuses") or []
    ] + list(status.get("containerStatuses") or [])

    image = (main or {}).get("image")
    if image is None:
        specs = spec.get("containers") or []
        image = next((c.get("image") for c in specs if c.get("name") == (main or {}).get("name")), None)
        if image is None and specs:
            image = specs[0].get("image")

    node_status = (node or {}).get("status") or {}
    return AttemptRecord(
        job=job,
        attempt=attempt,
        backend="kubernetes",
        node=spec.get("nodeName") or (node or {}).get("metadata", {}).get("name"),
        exit_code=(terminated or {}).get("exitCode"),
        signal=(terminated or {}).get("signal"),
        termination_reason=reason,
        termination_message=message,
        container_states=container_states,
        pod_conditions=list(status.get("conditions") or []),
        events=list(events or []),
        node_conditions=list(node_status.get("conditions") or []),
        node_taints=list(((node or {}).get("spec") or {}).get("taints") or []),
        log_tail=_as_lines(log, LOG_TAIL_LINES),
        node_log=_as_lines(node_log, NODE_LOG_LINES),
        started_at=(terminated or {}).get("startedAt") or (running or {}).get("startedAt"),
        finished_at=(terminated or {}).get("finishedAt"),
        progress=progress,
        image=image,
    )


def job_and_attempt_of_pod(pod: dict[str, Any]) -> tuple[str, int]:
    """Best guess of (job, attempt) from pod labels (`dag_id`, `task_id` attempt_N), else name/1."""
    job, attempt = _labels_job_and_attempt(pod)
    return job or pod.get("metadata", {}).get("name") or "unknown", attempt or 1
