"""Attempt records from what people and clusters hand over: a pod as `kubectl get pod -o json` prints it, or a record file.

`record_from_pod` turns a Pod (a dict) with its log, events and node into an
`AttemptRecord`; the Kubernetes backend and `sat classify POD.json` both use it.
`load_record` reads a record or a pod (and optional side files) from disk: the node's
events among them only within the attempt's window (`classify.window`), as the backend
reads them.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from sat_tasks.classify.evidence import (
    as_dict,
    as_dicts,
    is_spot_label,
    spot_capacity_labels,
)
from sat_tasks.classify.window import MAX_EVENTS_PER_OBJECT, AttemptWindow
from sat_tasks.core.attempt import (
    LOG_TAIL_LINES,
    MAIN_CONTAINER_NAME,
    NODE_LOG_LINES,
    AttemptRecord,
    attempt_in_task_id,
)
from sat_tasks.core.bounded import ObjectTooLargeError, read_file, tail_file
from sat_tasks.errors import SatError

#: A log file is read from its end: at most this many bytes (a record keeps a tail anyway).
LOG_READ_BYTES = 8 * 1024 * 1024
#: Longer lines are cut (a binary log can hold megabytes without a newline).
MAX_LINE_CHARS = 4096
#: Pod annotations where the Kubernetes backend's `launch` keeps what it read of the node when
#: the attempt started: its labels (JSON), and the Karpenter NodeClaim that owned it.
NODE_LABELS_AT_START_ANNOTATION = "sat.ai/node-labels-at-start"
NODECLAIM_AT_START_ANNOTATION = "sat.ai/nodeclaim-at-start"


def _as_lines(text: list[str] | str | None, keep: int) -> list[str]:
    if text is None:
        return []
    if isinstance(text, str):
        lines = text.splitlines()
    elif isinstance(text, list):
        lines = [str(line).rstrip("\n") for line in text if line is not None]
    else:
        lines = str(text).splitlines()
    return [line.replace("\x00", "")[:MAX_LINE_CHARS] for line in lines[-keep:]]


def _int_or_none(value: Any, what: str, notes: list[str] | None) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        if notes is not None:
            notes.append(f"{what} {str(value)[:40]!r} is not a number: ignored")
        return None


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _text_labels(value: Any, what: str, notes: list[str] | None) -> dict[str, str]:
    """Labels as `AttemptRecord.node_labels` holds them: text values (JSON true/false and numbers
    as text); values that are not scalars are skipped and named in `notes`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        if notes is not None:
            notes.append(f"{what} is a {type(value).__name__}, not a mapping of labels: ignored")
        return {}
    labels: dict[str, str] = {}
    skipped: list[str] = []
    for key, item in value.items():
        if isinstance(item, bool):
            labels[str(key)] = "true" if item else "false"
        elif isinstance(item, (str, int, float)):
            labels[str(key)] = str(item)
        else:
            skipped.append(str(key)[:40])
    if skipped and notes is not None:
        named = ", ".join(map(repr, skipped[:3])) + (", ..." if len(skipped) > 3 else "")
        notes.append(f"{what}: {len(skipped)} label(s) without a text value ignored ({named})")
    return labels


def _node_labels(node: dict[str, Any], notes: list[str] | None) -> dict[str, str]:
    """The Node object's `metadata.labels` (empty when the node is gone)."""
    return _text_labels(as_dict(node.get("metadata")).get("labels"), "node metadata.labels", notes)


def _labels_at_start(pod: dict[str, Any], notes: list[str] | None) -> dict[str, str]:
    """The node labels `launch` kept on the pod when the attempt started (`NODE_LABELS_AT_START_ANNOTATION`)."""
    text = as_dict(as_dict(pod.get("metadata")).get("annotations")).get(NODE_LABELS_AT_START_ANNOTATION)
    if text is None:
        return {}
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        if notes is not None:
            notes.append(f"pod annotation {NODE_LABELS_AT_START_ANNOTATION} is not JSON: ignored")
        return {}
    return _text_labels(value, f"pod annotation {NODE_LABELS_AT_START_ANNOTATION}", notes)


def _pod_capacity_markers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The Spot/preemptible labels the pod's nodeSelector or required node affinity asks for.

    The fallback for a node object that is gone: the record has no field for the pod's
    scheduling constraints, so these go into `node_taints` as entries with a `source`, where
    `evidence.find_spot_capacity` reads them and the taint rules skip them. The node's own
    labels are `AttemptRecord.node_labels`.
    """
    labels = spot_capacity_labels()
    spec = as_dict(pod.get("spec"))
    markers: list[dict[str, Any]] = []
    for key, value in as_dict(spec.get("nodeSelector")).items():
        if is_spot_label(str(key), value, labels):
            markers.append({"key": str(key), "value": str(value), "effect": "", "source": "pod nodeSelector"})
    affinity = as_dict(as_dict(spec.get("affinity")).get("nodeAffinity"))
    required = as_dict(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in as_dicts(required.get("nodeSelectorTerms")):
        for expression in as_dicts(term.get("matchExpressions")):
            values = expression.get("values") if isinstance(expression.get("values"), list) else []
            key = str(expression.get("key") or "")
            if expression.get("operator") == "In" and len(values) == 1 and is_spot_label(key, values[0], labels):
                markers.append({"key": key, "value": str(values[0]), "effect": "", "source": "pod node affinity"})
    return markers


def _end_facts(pod: dict[str, Any]) -> dict[str, Any]:
    """What the pod says of who ended it beyond its status (`AttemptRecord.end_facts`): its deletion, and the
    `managedFields` managers (which of them wrote the DisruptionTarget condition)."""
    metadata = as_dict(pod.get("metadata"))
    facts: dict[str, Any] = {}
    if metadata.get("deletionTimestamp"):
        facts["deletion_timestamp"] = str(metadata["deletionTimestamp"])
        if metadata.get("deletionGracePeriodSeconds") is not None:
            facts["deletion_grace_seconds"] = metadata["deletionGracePeriodSeconds"]
    managers = []
    for entry in as_dicts(metadata.get("managedFields")):
        if not entry.get("manager"):
            continue
        fields = json.dumps(entry.get("fieldsV1") or {})
        managers.append({"manager": str(entry["manager"]), "operation": str(entry.get("operation") or ""),
                         "time": str(entry.get("time") or ""), "disruption": "DisruptionTarget" in fields})
    if managers:
        facts["managers"] = managers[:20]
    return facts


def _main_container_status(pod: dict[str, Any], container: str | None) -> dict[str, Any] | None:
    """The status entry of the training container: named, `base`, or the first spec'd one."""
    statuses = as_dicts(as_dict(pod.get("status")).get("containerStatuses"))
    by_name = {status.get("name"): status for status in statuses if isinstance(status.get("name"), str)}
    wanted = [container] if container else []
    wanted.append(MAIN_CONTAINER_NAME)
    wanted += [c.get("name") for c in as_dicts(as_dict(pod.get("spec")).get("containers"))]
    for name in wanted:
        if name in by_name:
            return by_name[name]
    return statuses[0] if statuses else None


def _terminated(status: dict[str, Any] | None) -> dict[str, Any] | None:
    """The current terminated state, else the last one (a restarted container)."""
    if not status:
        return None
    return (as_dict(as_dict(status.get("state")).get("terminated"))
            or as_dict(as_dict(status.get("lastState")).get("terminated")) or None)


def _labels_job_and_attempt(pod: dict[str, Any]) -> tuple[str | None, int | None]:
    labels = as_dict(as_dict(pod.get("metadata")).get("labels"))
    job = labels.get("sat.ai/job") or labels.get("sat/job") or labels.get("dag_id")
    job = job if isinstance(job, str) and job else None
    place = attempt_in_task_id(str(labels.get("task_id") or ""))
    return job, place[0] if place else None


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
    notes: list[str] | None = None,
    node_labels_at_start: dict[str, str] | None = None,
) -> AttemptRecord:
    """Build an `AttemptRecord` from a pod as `kubectl get pod NAME -o json` prints it.

    Args:
        pod: the Pod object (a dict).
        job, attempt: which Training Job attempt this pod ran.
        log: the container log (text or lines); the last `LOG_TAIL_LINES` are kept.
        node_log: kernel-log lines of the node.
        events: Event objects (or `EventList.items`) of the pod and its node.
        node: the Node object (`kubectl get node NAME -o json`) for conditions, taints and
            labels; None when it is gone (`node_labels` stays empty, the pod's nodeSelector/affinity
            on Spot labels still marks the capacity).
        progress: the engine's progress.json, when the launcher read it.
        container: the training container's name (default: `base`, else the first).
        notes: where to say what could not be read (malformed fields are skipped, never fatal).
        node_labels_at_start: the node's labels when the attempt started; None: those the
            Kubernetes backend kept on the pod (`NODE_LABELS_AT_START_ANNOTATION`), if any.
    """
    pod, node = as_dict(pod), as_dict(node)
    status = as_dict(pod.get("status"))
    spec = as_dict(pod.get("spec"))
    main = _main_container_status(pod, container)
    terminated = _terminated(main)
    running = as_dict(as_dict((main or {}).get("state")).get("running"))
    if notes is not None and not as_dicts(status.get("containerStatuses")):
        notes.append("the pod has no container statuses: no exit code or container state")

    # Pod-level reasons (Evicted, Terminated, NodeLost, UnexpectedAdmissionError, ...)
    # say more than the container's "Error"; the container states stay in the record.
    terminated = terminated or {}
    reason = _text_or_none(status.get("reason") or terminated.get("reason"))
    message = _text_or_none(status.get("message") or terminated.get("message"))

    container_states = [
        {**entry, "init": True} for entry in as_dicts(status.get("initContainerStatuses"))
    ] + as_dicts(status.get("containerStatuses"))

    image = (main or {}).get("image")
    if image is None:
        specs = as_dicts(spec.get("containers"))
        image = next((c.get("image") for c in specs if c.get("name") == (main or {}).get("name")), None)
        if image is None and specs:
            image = specs[0].get("image")

    node_status = as_dict(node.get("status"))
    event_items = as_dicts(events) if isinstance(events, list) else []
    if notes is not None and isinstance(events, list) and len(event_items) < len(events):
        notes.append(f"{len(events) - len(event_items)} event(s) are not objects: skipped")
    return AttemptRecord(
        job=job,
        attempt=attempt,
        backend="kubernetes",
        node=_text_or_none(spec.get("nodeName") or as_dict(node.get("metadata")).get("name")),
        exit_code=_int_or_none(terminated.get("exitCode"), "exitCode", notes),
        signal=_int_or_none(terminated.get("signal"), "signal", notes),
        termination_reason=reason,
        termination_message=message,
        container_states=container_states,
        pod_conditions=as_dicts(status.get("conditions")),
        events=event_items,
        node_conditions=as_dicts(node_status.get("conditions")),
        node_taints=as_dicts(as_dict(node.get("spec")).get("taints")) + _pod_capacity_markers(pod),
        node_labels=_node_labels(node, notes),
        node_labels_at_start=(_text_labels(node_labels_at_start, "node_labels_at_start", notes)
                              if node_labels_at_start is not None else _labels_at_start(pod, notes)),
        log_tail=_as_lines(log, LOG_TAIL_LINES),
        node_log=_as_lines(node_log, NODE_LOG_LINES),
        started_at=_moment(terminated.get("startedAt") or running.get("startedAt"), "startedAt", notes),
        finished_at=_moment(terminated.get("finishedAt"), "finishedAt", notes),
        progress=progress if isinstance(progress, dict) else None,
        image=_text_or_none(image),
        end_facts=_end_facts(pod),
    )


def _moment(value: Any, what: str, notes: list[str] | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        if notes is not None:
            notes.append(f"{what} {str(value)[:40]!r} is not a time: ignored")
        return None


def job_and_attempt_of_pod(pod: dict[str, Any]) -> tuple[str, int]:
    """Best guess of (job, attempt) from pod labels (`dag_id`, `task_id` attempt_N), else name/1."""
    job, attempt = _labels_job_and_attempt(pod)
    name = as_dict(pod.get("metadata")).get("name")
    return job or (name if isinstance(name, str) and name else "unknown"), attempt or 1


class UnreadableInput(SatError):
    """The file given to `sat classify` is not an attempt record or a pod; the message says what it is instead."""


def _decode(data: bytes) -> str:
    """Text from bytes in whatever encoding they came: UTF-16/32 by BOM, else UTF-8 with replacements."""
    for bom, codec in ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
                       (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"), (b"\xef\xbb\xbf", "utf-8-sig")):
        if data.startswith(bom):
            return data.decode(codec, errors="replace")
    return data.decode("utf-8", errors="replace")


def _read_bytes(path: str, limit: int | None) -> tuple[bytes, int]:
    """The file's bytes (its last `limit` bytes when given) and its size."""
    if path == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        return (data[-limit:] if limit else data), len(data)
    if limit:
        return tail_file(path, limit)
    data = read_file(path)  # a record whole, within MAX_JSON_BYTES (ObjectTooLargeError)
    return data, len(data)


def _read_text(path: str, *, limit: int | None = None, notes: list[str] | None = None) -> str:
    try:
        data, size = _read_bytes(path, limit)
    except OSError as error:
        raise UnreadableInput(f"cannot read {path}: {error.strerror or error}") from error
    except ObjectTooLargeError as error:
        raise UnreadableInput(str(error)) from error
    text = _decode(data)
    if notes is not None:
        if limit and size > limit:
            notes.append(f"{path} is {size // (1024 * 1024)} MiB: read only its last {limit // (1024 * 1024)} MiB")
        if "\ufffd" in text:
            notes.append(f"{path} is not valid UTF-8 (binary or another encoding): unreadable bytes replaced")
        if "\x00" in text:
            notes.append(f"{path} holds NUL bytes (binary): removed")
    return text.replace("\x00", "")


def _read_json(path: str) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise UnreadableInput(f"{path} is not JSON: {error.msg} at line {error.lineno}") from error


def _read_side_json(path: str, what: str, notes: list[str]) -> Any:
    """A side file (events, node): unreadable ones are noted and skipped, not fatal."""
    try:
        return _read_json(path)
    except UnreadableInput as error:
        notes.append(f"{what} not read: {error}")
        return None


def _is_pod(data: dict[str, Any]) -> bool:
    return data.get("kind") == "Pod" or ("apiVersion" in data and "status" in data and "spec" in data)


def load_record(path: str, *, log: str | None = None, node_log: str | None = None,
                events: str | None = None, node: str | None = None,
                node_events: str | None = None) -> AttemptRecord:
    """Read an attempt record or a raw pod JSON (plus optional side files) from disk."""
    return load_record_with_notes(path, log=log, node_log=node_log, events=events, node=node,
                                  node_events=node_events)[0]


def _read_events_file(path: str, what: str, notes: list[str]) -> list[dict[str, Any]] | None:
    """An events file (`kubectl get events -o json`: an EventList, or a list of events); None when unusable."""
    raw = _read_side_json(path, what, notes)
    items = raw.get("items", []) if isinstance(raw, dict) else raw
    if items is not None and not isinstance(items, list):
        notes.append(f"{what}: not a list of events: skipped")
        return None
    return items


def _node_events_in_window(items: list[Any], window: AttemptWindow, notes: list[str]) -> list[dict[str, Any]]:
    """The node's events within the attempt's window, at most `MAX_EVENTS_PER_OBJECT` (the newest), as the backend reads them."""
    events = as_dicts(items)
    if len(events) < len(items):
        notes.append(f"node events: {len(items) - len(events)} event(s) are not objects: skipped")
    kept, _outside, over = window.select(events, MAX_EVENTS_PER_OBJECT)
    if over:
        notes.append(f"node events: {len(kept) + over} in the attempt's window, read only the newest {len(kept)}")
    return kept


def load_record_with_notes(path: str, *, log: str | None = None, node_log: str | None = None,
                           events: str | None = None, node: str | None = None,
                           node_events: str | None = None) -> tuple[AttemptRecord, list[str]]:
    """`load_record`, and what could not be read: malformed parts are skipped and named, never fatal.

    `node_events` (the node's, NodeClaim's or Kueue Workload's events) are read only within
    the attempt's window: the pod's start and end, else the record's `started_at` /
    `finished_at` (`classify.window.AttemptWindow`); they join the pod's events.

    Raises `UnreadableInput` only when the main file is not JSON, not an object, or neither
    a pod nor (after dropping its malformed fields) an attempt record.
    """
    notes: list[str] = []
    data = _read_json(path)
    if not isinstance(data, dict):
        raise UnreadableInput(f"{path} holds a JSON {type(data).__name__}, not an attempt record or a pod")
    log_text = _read_text(log, limit=LOG_READ_BYTES, notes=notes) if log else None
    node_log_text = _read_text(node_log, limit=LOG_READ_BYTES, notes=notes) if node_log else None
    event_items = _read_events_file(events, "events", notes) if events else None
    node_event_items = _read_events_file(node_events, "node events", notes) if node_events else None
    node_object = _read_side_json(node, "node", notes) if node else None
    if node_object is not None and not isinstance(node_object, dict):
        notes.append("node: not a Node object: skipped")
        node_object = None
    if _is_pod(data):
        job, attempt = job_and_attempt_of_pod(data)
        if node_event_items is not None:
            event_items = (event_items or []) + _node_events_in_window(node_event_items, AttemptWindow.of_pod(data),
                                                                       notes)
        record = record_from_pod(data, job=job, attempt=attempt, log=log_text, node_log=node_log_text,
                                 events=event_items, node=node_object, notes=notes)
        return record, notes
    record = _validate_record(path, data, notes)
    updates: dict[str, Any] = {}
    if log_text is not None:
        updates["log_tail"] = _as_lines(log_text, LOG_TAIL_LINES)
    if node_log_text is not None:
        updates["node_log"] = _as_lines(node_log_text, NODE_LOG_LINES)
    if event_items is not None:
        updates["events"] = as_dicts(event_items)
    if node_event_items is not None:
        window = AttemptWindow.around(record.started_at, record.finished_at)
        updates["events"] = updates.get("events", record.events) + _node_events_in_window(node_event_items, window,
                                                                                          notes)
    if node_object is not None:
        updates["node_conditions"] = as_dicts(as_dict(node_object.get("status")).get("conditions"))
        updates["node_taints"] = as_dicts(as_dict(node_object.get("spec")).get("taints"))
        updates["node_labels"] = _node_labels(node_object, notes)
    return (record.model_copy(update=updates) if updates else record), notes


_REQUIRED_RECORD_FIELDS = ("job", "attempt", "backend")


def _validate_record(path: str, data: dict[str, Any], notes: list[str]) -> AttemptRecord:
    """An AttemptRecord from `data`; malformed optional fields are dropped (and noted) and it is tried again."""
    data = dict(data)
    for field in ("node_labels", "node_labels_at_start"):
        if isinstance(data.get(field), dict):
            data[field] = _text_labels(data[field], f"record field {field!r}", notes)
    for _ in range(len(data) + 1):
        try:
            return AttemptRecord.model_validate(data)
        except ValidationError as error:
            bad = {str(e["loc"][0]) for e in error.errors() if e.get("loc")}
            droppable = bad & set(data) - set(_REQUIRED_RECORD_FIELDS)
            if not droppable:
                first = str(error).splitlines()
                detail = " ".join(first[1:3]).strip() if len(first) > 1 else str(error)
                raise UnreadableInput(f"{path} is neither a pod nor a valid attempt record: {detail}") from error
            for field in sorted(droppable):
                notes.append(f"record field {field!r} is malformed: ignored")
                data.pop(field)
    raise UnreadableInput(f"{path} is neither a pod nor a valid attempt record")
