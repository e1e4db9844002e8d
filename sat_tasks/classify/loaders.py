"""Attempt records from what people and clusters hand over: a pod as `kubectl get pod -o json` prints it, or a record file.

`record_from_pod` turns a Pod (a dict) with its log, events and node into an
`AttemptRecord`; the Kubernetes backend and `sat classify POD.json` both use it.
`load_record` reads a record or a pod (and optional side files) from disk.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from sat_tasks.core.attempt import (
    LOG_TAIL_LINES,
    MAIN_CONTAINER_NAME,
    NODE_LOG_LINES,
    AttemptRecord,
)
from sat_tasks.errors import SatError

_ATTEMPT_IN_TASK_ID = re.compile(r"attempt_(\d+)")


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


class UnreadableInput(SatError):
    """The file given to `sat classify` is not an attempt record or a pod; the message says what it is instead."""


def _read_text(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise UnreadableInput(f"cannot read {path}: {error.strerror or error}") from error


def _read_json(path: str) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise UnreadableInput(f"{path} is not JSON: {error.msg} at line {error.lineno}") from error


def _is_pod(data: dict[str, Any]) -> bool:
    return data.get("kind") == "Pod" or ("apiVersion" in data and "status" in data and "spec" in data)


def load_record(path: str, *, log: str | None = None, node_log: str | None = None,
                events: str | None = None, node: str | None = None) -> AttemptRecord:
    """Read an attempt record or a raw pod JSON (plus optional side files) from disk."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UnreadableInput(f"{path} holds a JSON {type(data).__name__}, not an attempt record or a pod")
    log_text = _read_text(log) if log else None
    node_log_text = _read_text(node_log) if node_log else None
    event_items = None
    if events:
        raw = _read_json(events)
        event_items = raw.get("items", []) if isinstance(raw, dict) else raw
    node_object = _read_json(node) if node else None
    if _is_pod(data):
        job, attempt = job_and_attempt_of_pod(data)
        return record_from_pod(data, job=job, attempt=attempt, log=log_text, node_log=node_log_text,
                               events=event_items, node=node_object)
    try:
        record = AttemptRecord.model_validate(data)
    except ValueError as error:
        first = str(error).splitlines()
        detail = " ".join(first[1:3]).strip() if len(first) > 1 else str(error)
        raise UnreadableInput(f"{path} is neither a pod nor a valid attempt record: {detail}") from error
    updates: dict[str, Any] = {}
    if log_text is not None:
        updates["log_tail"] = log_text.splitlines()
    if node_log_text is not None:
        updates["node_log"] = node_log_text.splitlines()
    if event_items is not None:
        updates["events"] = event_items
    if node_object is not None:
        updates["node_conditions"] = node_object.get("status", {}).get("conditions", [])
        updates["node_taints"] = node_object.get("spec", {}).get("taints", [])
    return record.model_copy(update=updates) if updates else record
