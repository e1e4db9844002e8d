"""Failure classifier: tell hardware faults, preemptions, image and user errors apart.

Call order: build an `AttemptRecord` (local backend, or `record_from_pod`), then
`classify(record) -> Verdict`. The rules and their precedence are in
docs/adr/0004-failure-classification.md; in short:

1. PREEMPTED  — a Spot notice, scheduler preemption, graceful node shutdown, or a
   Spot interruption taint/event. Outranks everything (a preempted peer makes the
   other ranks log network errors).
2. HARDWARE   — hardware Xids, "fallen off the bus", uncorrectable ECC, machine
   checks, NCCL/gloo network errors, a hang (heartbeat timeout, collective
   timeout), node NotReady / problem conditions, evictions and other pod
   disruptions. Outranks exit codes and tracebacks.
3. IMAGE_PULL — the container never ran and its image could not be pulled.
4. SUCCEEDED  — exit code 0 and no evidence of kinds 1-2 that can outrank a clean
   exit (network noise at shutdown and node snapshots cannot).
5. INTERNAL   — OOM, tracebacks, bad arguments, application Xids, exit codes 1-127.
6. By exit status alone: killed by SIGKILL/SIGTERM/SIGHUP from outside with no other
   evidence → HARDWARE; crash signals (SIGSEGV, SIGBUS, SIGABRT, ...) → INTERNAL;
   no exit status at all → HARDWARE (the attempt was lost).

The classifier is pure Python (no Airflow, no Kubernetes client) and never raises on
odd input: missing fields just mean less evidence.
"""

from __future__ import annotations

import argparse
import json
import re
import signal as signal_module
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from sat_tasks.attempt import AttemptRecord, job_and_attempt_of_pod, record_from_pod

__all__ = [
    "VerdictKind",
    "Verdict",
    "classify",
    "load_record",
    "UnreadableInput",
    "register_cli",
    "run_classify_cli",
    "HARDWARE_XIDS",
    "APPLICATION_XIDS",
    "NOT_A_NODE_FAULT_XIDS",
]


class VerdictKind(str, Enum):
    """What happened to an attempt, as far as the next step of the DAG cares."""

    SUCCEEDED = "SUCCEEDED"
    HARDWARE = "HARDWARE"
    PREEMPTED = "PREEMPTED"
    INTERNAL = "INTERNAL"
    IMAGE_PULL = "IMAGE_PULL"


@dataclass(frozen=True)
class Verdict:
    """The classifier's answer: a kind, the evidence lines that decided it, and why."""

    kind: VerdictKind
    evidence: list[str]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "evidence": list(self.evidence), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(
            kind=VerdictKind(data["kind"]), evidence=list(data.get("evidence", [])), reason=data.get("reason", "")
        )


@dataclass(frozen=True)
class _Finding:
    """One piece of evidence: which kind it points to, the line, and a short reason.

    `beats_success` is False for evidence that must not turn a clean exit 0 into a
    failure: NCCL/gloo teardown noise and node-condition snapshots taken afterwards.
    """

    kind: VerdictKind
    evidence: str
    reason: str
    beats_success: bool = True


# --------------------------------------------------------------------------- catalog

#: NVIDIA Xids that mean the node (GPU, NVLink, GSP, memory) is at fault → fail over.
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit (uncorrectable) ECC error",
    62: "GPU internal micro-controller halt",
    64: "ECC page retirement / row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    136: "hardware fault (NVIDIA Xid catalog)",
    140: "unrecovered ECC error",
    143: "hardware fault (NVIDIA Xid catalog)",
    **{xid: "NVLink fault" for xid in range(144, 151)},
}
#: Xids caused by the application (bad kernel, illegal address, ...) → the user's bug.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception (application fault)",
    31: "GPU memory page fault (application fault)",
    43: "GPU stopped processing after an application fault",
    45: "preemptive cleanup after an earlier error",
}
#: Xids that are logged but do not make the node faulty (corrected/contained ECC events).
NOT_A_NODE_FAULT_XIDS: dict[int, str] = {
    63: "ECC page retirement / row remapping recorded",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
_XID_RECOVERY_ACTION = 154  # GPU recovery action changed; a fault unless the action is "None"

_XID_LINE = re.compile(r"\bxid\b(?:\s+error)?\s*(?:\(([^)]*)\))?\s*[:=]?\s*(\d{1,3})\b", re.IGNORECASE)

# Lines as they come from `kubectl logs --timestamps`, torchrun and PyTorch rank prefixes.
_LINE_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\dT[\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+)?(?:\[(?:rank|default)\d+\]:\s?)?")


@dataclass(frozen=True)
class _TextRule:
    pattern: re.Pattern[str]
    kind: VerdictKind
    reason: str
    beats_success: bool = True


def _rule(pattern: str, kind: VerdictKind, reason: str, *, beats_success: bool = True) -> _TextRule:
    return _TextRule(re.compile(pattern, re.IGNORECASE), kind, reason, beats_success)


_HW, _INT = VerdictKind.HARDWARE, VerdictKind.INTERNAL

#: Line rules applied to the container log, the node's kernel log and event messages.
_TEXT_RULES: tuple[_TextRule, ...] = (
    _rule(r"fallen off the bus", _HW, "GPU has fallen off the bus"),
    _rule(r"\bGPU is lost\b|NVML_ERROR_GPU_IS_LOST", _HW, "GPU is lost"),
    _rule(r"uncorrectable ECC error encountered|\buncorrectable\b.*\bECC\b|\bECC\b.*\buncorrectable\b"
          r"|double bit error|\bDBE\b|uncontained ECC", _HW, "uncorrectable ECC error"),
    _rule(r"\[Hardware Error\].*(uncorrected|fatal)|EDAC .*\bUE\b", _HW, "uncorrected machine check / memory error"),
    _rule(r"Memory failure: 0x[0-9a-f]+", _HW, "host memory failure (hwpoison)"),
    _rule(r"RmInitAdapter failed", _HW, "GPU failed to initialize"),
    _rule(r"Driver/library version mismatch", _HW, "NVIDIA driver/library mismatch on the node"),
    _rule(r"I/O error, dev \w+|Remounting filesystem read-only", _HW, "node disk I/O error", beats_success=False),
    _rule(r"NCCL WARN NET/(IB|Socket|OFI|Plugin)\b(?!.*No device found)", _HW, "NCCL network error",
          beats_success=False),
    _rule(r"remote process exited or there was a network error|\bncclRemoteError\b", _HW,
          "NCCL remote error (a peer or the network failed)", beats_success=False),
    _rule(r"IBV_WC_RETRY_EXC_ERR|transport retry counter exceeded|ibv_poll_cq error", _HW,
          "InfiniBand transport error", beats_success=False),
    _rule(r"gloo.*(Connection (reset|closed) by peer|Connection refused|Read error|Timed out)"
          r"|Gloo connectFullMesh failed", _HW, "gloo network error (a peer or the network failed)",
          beats_success=False),
    _rule(r"Watchdog caught collective operation timeout|collective operation timeout", _HW,
          "a collective operation hung (NCCL watchdog timeout)", beats_success=False),
    _rule(r"CUDA out of memory|OutOfMemoryError", _INT, "out of GPU memory"),
    _rule(r"Out of memory: Killed process|Memory cgroup out of memory|oom-kill:", _INT,
          "out of host memory (kernel OOM killer)"),
    _rule(r"insufficient shared memory|Unexpected bus error encountered in worker", _INT,
          "shared memory (/dev/shm) too small for the data loader"),
    _rule(r"error: (unrecognized arguments|the following arguments are required|argument \S+: invalid)", _INT,
          "bad command-line arguments"),
    _rule(r"can't open file .*No such file or directory|command not found|executable file not found"
          r"|exec format error", _INT, "the command cannot be run"),
    _rule(r"\bncclInvalidUsage\b|\bncclInvalidArgument\b", _INT, "invalid use of NCCL"),
)

_NCCL_SYSTEM_ERROR = re.compile(r"\bncclSystemError\b|unhandled system error", re.IGNORECASE)
_SOCKET_ERROR = re.compile(
    r"Connection reset by peer|Connection refused|Broken pipe|Connection timed out|No route to host"
    r"|Software caused connection abort|Network is unreachable|Connection closed by remote peer",
    re.IGNORECASE,
)
_SHM_ERROR = re.compile(r"shared memory|/dev/shm|No space left on device", re.IGNORECASE)
_NCCL_FRAME = re.compile(r"libnccl\S*\.so|ncclProxy|\bnccl[A-Z]\w*\(", re.IGNORECASE)
_SEGFAULT = re.compile(r"Segmentation fault|SIGSEGV|signal 11\b", re.IGNORECASE)
# How torchrun says a signal ended the run. A child killed by a signal (`exitcode : -9`,
# `Signal 9 (SIGKILL) received by PID`); a child that exited 128+n after handling signal n
# (`exitcode : 143`: the checkpoint engine exits so after its final checkpoint, also when
# another rank got the SIGTERM); torchrun itself stopped by a signal (torch >= 2.x:
# `SignalException: Process <pid> got signal: 15`).
_TORCHRUN_SIGNAL = re.compile(
    r"Signal (\d+) \((SIG\w+)\) received by PID|exitcode\s*:\s*-(\d+)"
    r"|SignalException: Process \d+ got signal: (\d+)|exitcode\s*:\s*(129|1[3-8]\d|19[0-2])\b"
)
# The checkpoint engine's line on a rank that stopped because another rank got SIGTERM, and
# the verdict's reason for such a rank (k8s_launch.combine_rank_records ranks it last).
_PEER_STOP = re.compile(r"\[Concurrent Checkpoint\] another rank received SIG(?:TERM|INT)")
PEER_STOP_REASON = "stopped with the other ranks after another rank received SIGTERM"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# torchrun's summary of a failed child, and its own reaction to a signal: not a cause.
_WRAPPER_EXCEPTIONS = ("ChildFailedError", "SignalException")

# Kubernetes words.
_IMAGE_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ErrImageInspect",
    "ImageInspectError", "RegistryUnavailable", "ErrRegistryUnavailable",
})
_INTERNAL_WAITING_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_INTERNAL_TERMINATION_REASONS = frozenset({"OOMKilled", "ContainerCannotRun", "StartError", "DeadlineExceeded"})
_HARDWARE_TERMINATION_REASONS = frozenset({"Evicted", "NodeLost", "UnexpectedAdmissionError", "NodeAffinity"})
_PREEMPTED_TERMINATION_REASONS = frozenset({"Preempted", "Preempting", "Shutdown", "Terminated", "NodeShutdown"})
_SHUTDOWN_MESSAGE = re.compile(r"node shutdown|shutting down|imminent node shutdown", re.IGNORECASE)
_SPOT_WORDS = re.compile(r"\bspot\b|spot.?interrupt|preempt", re.IGNORECASE)
_PREEMPTING_DISRUPTIONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
_IMAGE_EVENT_MESSAGE = re.compile(
    r"Failed to pull image|Back-off pulling image|ErrImagePull|ImagePullBackOff|InvalidImageName"
    r"|pull access denied|manifest unknown|\b(401|403|404)\b.*(Unauthorized|Forbidden|Not Found)",
    re.IGNORECASE,
)
_PRESSURE_CONDITIONS = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure"})
_SPOT_TAINT = re.compile(r"spot-itn|spot-?interrupt|impending-node-termination|preempt", re.IGNORECASE)
_NODE_DOWN_TAINTS = frozenset({
    "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready", "node.kubernetes.io/out-of-service",
})

_EXTERNAL_KILL_SIGNALS = frozenset({signal_module.SIGKILL, signal_module.SIGTERM, signal_module.SIGHUP})

#: Kernel-log lines timestamped this long before the attempt started are stale.
NODE_LOG_SLACK_BEFORE = timedelta(seconds=60)
#: ...and this long after it ended are about something else.
NODE_LOG_SLACK_AFTER = timedelta(minutes=5)
_ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)(?:[.,]\d+)?(Z|[+-]\d\d:?\d\d)")


# ------------------------------------------------------------------------- helpers

def _strip(line: str) -> str:
    return _LINE_PREFIX.sub("", line, count=1).rstrip()


def _signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _exit_signal(record: AttemptRecord) -> int | None:
    """The signal that ended the main process: explicit, negative exit code, or 128+N."""
    if record.signal:
        return record.signal
    code = record.exit_code
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code <= 128 + 64:
        return code - 128
    return None


def _line_time(line: str) -> datetime | None:
    match = _ISO_STAMP.search(line[:64])
    if not match:
        return None
    stamp, zone = match.groups()
    zone = "+00:00" if zone == "Z" else (zone if ":" in zone else f"{zone[:3]}:{zone[3:]}")
    try:
        return datetime.fromisoformat(f"{stamp.replace(' ', 'T')}{zone}")
    except ValueError:
        return None


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


def _node_log_in_window(record: AttemptRecord) -> list[str]:
    """Kernel-log lines that may belong to this attempt.

    Lines with an ISO-8601 timestamp (dmesg --time-format=iso, journalctl -o short-iso)
    outside [started_at - 60 s, finished_at + 5 min] are dropped: an Xid from before a
    reboot is not this attempt's fault. Lines without a parseable timestamp are kept.
    """
    started, finished = _aware(record.started_at), _aware(record.finished_at)
    if started is None and finished is None:
        return list(record.node_log)
    kept = []
    for line in record.node_log:
        moment = _line_time(line)
        if moment is not None:
            if started is not None and moment < started - NODE_LOG_SLACK_BEFORE:
                continue
            if finished is not None and moment > finished + NODE_LOG_SLACK_AFTER:
                continue
        kept.append(line)
    return kept


def _describe_state(name: str, kind: str, state: dict[str, Any]) -> str:
    reason = state.get("reason") or "-"
    if kind == "terminated":
        text = f'container "{name}" terminated: reason={reason}, exitCode={state.get("exitCode")}'
        if state.get("signal"):
            text += f", signal={state['signal']}"
    else:
        text = f'container "{name}" {kind}: reason={reason}'
    if state.get("message"):
        text += f": {str(state['message']).strip()}"
    return text


def _describe_condition(prefix: str, condition: dict[str, Any]) -> str:
    text = f"{prefix} condition {condition.get('type')}={condition.get('status')}"
    if condition.get("reason"):
        text += f" reason={condition['reason']}"
    if condition.get("message"):
        text += f": {str(condition['message']).strip()}"
    return text


def _describe_event(event: dict[str, Any]) -> str:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    about = f"{involved.get('kind')}/{involved.get('name')} " if involved.get("kind") else ""
    message = event.get("message") or event.get("note") or ""
    return f"event {about}{event.get('type') or 'Normal'} {event.get('reason')}: {str(message).strip()}"


# ----------------------------------------------------------------------- gatherers

def _find_flags(record: AttemptRecord) -> Iterator[_Finding]:
    if record.preemption_notice:
        yield _Finding(VerdictKind.PREEMPTED, "preemption notice: Spot SIGTERM notice delivered to the attempt",
                       "the Spot capacity was reclaimed (notice delivered)")
    if record.heartbeat_timeout:
        step = (record.progress or {}).get("step")
        where = f" at step {step}" if step is not None else ""
        yield _Finding(VerdictKind.HARDWARE, f"heartbeat timeout: training stopped making progress{where}",
                       "training hung (no progress before the heartbeat timeout)")


def _recovery_action_needed(line: str) -> bool:
    """Xid 154 names the recovery action the GPU now needs; `to 0x0 (None)` clears it."""
    target = re.search(r"\bto (0x[0-9a-f]+)", line, re.IGNORECASE)
    if target:
        return int(target.group(1), 16) != 0
    return bool(re.search(r"reboot|reset|drain", line, re.IGNORECASE))


def _find_xids(lines: Iterable[str], describe=lambda line: line) -> Iterator[_Finding]:
    for line in lines:
        match = _XID_LINE.search(line)
        if not match:
            continue
        xid, where = int(match.group(2)), match.group(1)
        on = f" on {where}" if where else ""
        if xid in HARDWARE_XIDS:
            yield _Finding(_HW, describe(line), f"Xid {xid}{on}: {HARDWARE_XIDS[xid]}")
        elif xid in APPLICATION_XIDS:
            yield _Finding(_INT, describe(line), f"Xid {xid}{on}: {APPLICATION_XIDS[xid]}")
        elif xid == _XID_RECOVERY_ACTION and _recovery_action_needed(line):
            yield _Finding(_HW, describe(line), f"Xid 154{on}: the driver asks for a GPU reset or node reboot")
        # 63/92/94 and unknown Xids are not evidence of a node fault on their own.


def _find_text(lines: Iterable[str], describe=lambda line: line) -> Iterator[_Finding]:
    for line in lines:
        for rule in _TEXT_RULES:
            if rule.pattern.search(line):
                yield _Finding(rule.kind, describe(line), rule.reason, rule.beats_success)
                break


def _find_nccl_system_errors(lines: list[str]) -> Iterator[_Finding]:
    """`ncclSystemError` is the network when sockets fail, config when /dev/shm is too small."""
    system = [line for line in lines if _NCCL_SYSTEM_ERROR.search(line)]
    if not system:
        return
    sockets = [line for line in lines if _SOCKET_ERROR.search(line)]
    shm = [line for line in lines if _SHM_ERROR.search(line)]
    if sockets:
        for line in (system[0], sockets[0]):
            yield _Finding(_HW, line, "NCCL system error on a socket (network)", beats_success=False)
    elif shm:
        for line in (system[0], shm[0]):
            yield _Finding(_INT, line, "NCCL could not set up shared memory (/dev/shm too small)")


def _find_nccl_segfault(record: AttemptRecord, lines: list[str]) -> Iterator[_Finding]:
    """A segfault whose stack is inside NCCL is the transport, not the user's code."""
    segfault = _exit_signal(record) == signal_module.SIGSEGV or any(_SEGFAULT.search(line) for line in lines)
    frames = [line for line in lines if _NCCL_FRAME.search(line)]
    if segfault and frames:
        seg_lines = [line for line in lines if _SEGFAULT.search(line)]
        for line in (seg_lines[:1] + frames[:1]):
            yield _Finding(_HW, line, "segmentation fault inside NCCL (network transport)")


def _last_exception(lines: list[str]) -> str | None:
    """The verbatim line naming the last exception of the last Python traceback."""
    found, in_traceback = None, False
    for line in lines:
        text = _strip(line)
        if text.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if not in_traceback or not text or text[0].isspace():
            continue
        in_traceback = False
        match = _EXCEPTION_LINE.match(text)
        if match and match.group(1).rsplit(".", 1)[-1] in _WRAPPER_EXCEPTIONS:
            continue
        found = line
    return found


def _find_traceback(lines: list[str]) -> Iterator[_Finding]:
    line = _last_exception(lines)
    if line is not None:
        name = (_EXCEPTION_LINE.match(_strip(line)) or [None, "an exception"])[1]
        yield _Finding(_INT, line, f"the training script raised {name}")


def _find_container_states(record: AttemptRecord) -> Iterator[_Finding]:
    for status in record.container_states:
        name = status.get("name", "?")
        for key in ("state", "lastState"):
            state = status.get(key) or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting and key == "state":
                reason = waiting.get("reason")
                if reason in _IMAGE_WAITING_REASONS:
                    yield _Finding(VerdictKind.IMAGE_PULL, _describe_state(name, "waiting", waiting),
                                   f"the image could not be pulled ({reason})")
                elif reason in _INTERNAL_WAITING_REASONS:
                    yield _Finding(_INT, _describe_state(name, "waiting", waiting),
                                   f"the container could not be created ({reason})")
            if terminated and terminated.get("reason") in _INTERNAL_TERMINATION_REASONS:
                reason = terminated["reason"]
                why = "out of memory (OOMKilled)" if reason == "OOMKilled" else f"the container failed ({reason})"
                yield _Finding(_INT, _describe_state(name, "terminated", terminated), why)


def _find_termination(record: AttemptRecord) -> Iterator[_Finding]:
    reason = record.termination_reason
    if not reason:
        return
    seen = {
        ((status.get(key) or {}).get("terminated") or {}).get("reason")
        for status in record.container_states for key in ("state", "lastState")
    }
    message = (record.termination_message or "").strip()
    line = f"termination reason {reason}" + (f": {message}" if message else "")
    if reason in _PREEMPTED_TERMINATION_REASONS:
        if reason in {"Preempted", "Preempting", "NodeShutdown"} or _SHUTDOWN_MESSAGE.search(message):
            yield _Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted or its node shut down ({reason})")
    elif reason in _HARDWARE_TERMINATION_REASONS or reason.startswith("OutOf"):
        if _SPOT_WORDS.search(message):
            yield _Finding(VerdictKind.PREEMPTED, line, f"the node was reclaimed ({reason})")
        else:
            yield _Finding(_HW, line, f"the node failed the pod ({reason})")
    elif reason in _INTERNAL_TERMINATION_REASONS and reason not in seen:
        why = "out of memory (OOMKilled)" if reason == "OOMKilled" else f"the container failed ({reason})"
        yield _Finding(_INT, line, why)


def _find_pod_conditions(record: AttemptRecord) -> Iterator[_Finding]:
    """DisruptionTarget=True: preemption and node shutdown → PREEMPTED; the rest → HARDWARE."""
    for condition in record.pod_conditions:
        if condition.get("type") != "DisruptionTarget" or str(condition.get("status")) != "True":
            continue
        reason, message = condition.get("reason") or "", condition.get("message") or ""
        line = _describe_condition("pod", condition)
        if reason in _PREEMPTING_DISRUPTIONS or _SPOT_WORDS.search(message):
            yield _Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted ({reason or 'DisruptionTarget'})")
        elif reason == "TerminationByKubelet" and _SHUTDOWN_MESSAGE.search(message):
            yield _Finding(VerdictKind.PREEMPTED, line, "the node shut down (graceful node shutdown)")
        elif reason == "TerminationByKubelet":
            yield _Finding(_HW, line, "the kubelet evicted the pod (node pressure)")
        else:
            yield _Finding(_HW, line, f"the node disrupted the pod ({reason or 'DisruptionTarget'})")


def _find_node(record: AttemptRecord) -> Iterator[_Finding]:
    """Node conditions and taints are snapshots taken after the attempt: they cannot beat exit 0."""
    for condition in record.node_conditions:
        kind, status = condition.get("type"), str(condition.get("status"))
        line = _describe_condition("node", condition)
        text = f"{condition.get('reason') or ''} {condition.get('message') or ''}"
        if kind == "Ready" and status in {"False", "Unknown"}:
            yield _Finding(_HW, line, "the node is NotReady", beats_success=False)
        elif kind not in _PRESSURE_CONDITIONS and kind != "Ready" and status == "True":
            if _SPOT_WORDS.search(text):
                yield _Finding(VerdictKind.PREEMPTED, line, f"the node is being reclaimed ({kind})")
            else:
                yield _Finding(_HW, line, f"the node reports a problem ({kind})", beats_success=False)
    for taint in record.node_taints:
        key = taint.get("key") or ""
        line = f"node taint {key}={taint.get('value') or ''}:{taint.get('effect') or ''}"
        if _SPOT_TAINT.search(key):
            yield _Finding(VerdictKind.PREEMPTED, line, "the node is being reclaimed (Spot interruption)")
        elif key in _NODE_DOWN_TAINTS:
            yield _Finding(_HW, line, "the node is unreachable or not ready", beats_success=False)


def _find_events(record: AttemptRecord) -> Iterator[_Finding]:
    for event in record.events:
        reason = str(event.get("reason") or "")
        message = str(event.get("message") or event.get("note") or "")
        line = _describe_event(event)
        if reason in _IMAGE_WAITING_REASONS or (reason in {"Failed", "BackOff", "InspectFailed"}
                                                and _IMAGE_EVENT_MESSAGE.search(message)):
            yield _Finding(VerdictKind.IMAGE_PULL, line, "the image could not be pulled")
        elif reason in {"Preempted", "Preempting", "NodeShutdown", "Shutdown"} or _SPOT_WORDS.search(reason):
            yield _Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted or its node reclaimed ({reason})")
        elif reason in {"Evicted", "Evicting"}:
            yield _Finding(_HW, line, "the kubelet evicted the pod (node pressure)")
        elif reason in {"NodeNotReady", "TaintManagerEviction", "Rebooted", "NodeLost"}:
            yield _Finding(_HW, line, f"the node failed ({reason})", beats_success=False)
        elif reason in {"OOMKilling", "SystemOOM"}:
            yield _Finding(_INT, line, "out of host memory (kernel OOM killer)")
        else:
            yield from _find_xids([message], describe=lambda _m, line=line: line)
            yield from _find_text([message], describe=lambda _m, line=line: line)


def _find_torchrun_signal(lines: list[str]) -> tuple[int | None, str | None]:
    """torchrun exits 1 when a signal stopped it or a child; its log names the signal."""
    for line in reversed(lines):
        match = _TORCHRUN_SIGNAL.search(line)
        if match:
            if match.group(5):
                return int(match.group(5)) - 128, line
            return int(match.group(1) or match.group(3) or match.group(4)), line
    return None, None


def _gather(record: AttemptRecord) -> list[_Finding]:
    log, node_log = list(record.log_tail), _node_log_in_window(record)
    lines = node_log + log
    findings: list[_Finding] = []
    # Order matters only for the verdict's reason: the first finding of the winning kind.
    findings += _find_xids(lines)
    findings += _find_text(lines)
    findings += _find_nccl_system_errors(log)
    findings += _find_nccl_segfault(record, log)
    findings += _find_flags(record)
    findings += _find_pod_conditions(record)
    findings += _find_termination(record)
    findings += _find_container_states(record)
    findings += _find_events(record)
    findings += _find_node(record)
    findings += _find_traceback(log)
    return findings


# ------------------------------------------------------------------------ decision

def _verdict(kind: VerdictKind, findings: list[_Finding], limit: int = 8) -> Verdict:
    evidence: list[str] = []
    for finding in findings:
        if finding.evidence not in evidence:
            evidence.append(finding.evidence)
    return Verdict(kind=kind, evidence=evidence[:limit], reason=findings[0].reason)


def _exit_line(record: AttemptRecord) -> str:
    for status in record.container_states:
        if status.get("init"):
            continue
        for key in ("state", "lastState"):
            terminated = (status.get(key) or {}).get("terminated")
            if terminated and terminated.get("exitCode") == record.exit_code:
                return _describe_state(status.get("name", "?"), "terminated", terminated)
    text = f"exit code {record.exit_code}"
    if record.signal:
        text += f" (signal {record.signal} {_signal_name(record.signal)})"
    if record.termination_reason:
        text += f", reason {record.termination_reason}"
    return text


def classify(record: AttemptRecord) -> Verdict:
    """Classify one attempt. Never raises on incomplete records; see the module doc."""
    findings = _gather(record)
    by_kind = {kind: [f for f in findings if f.kind is kind] for kind in VerdictKind}
    clean_exit = record.exit_code == 0 and not record.signal

    if by_kind[VerdictKind.PREEMPTED]:
        return _verdict(VerdictKind.PREEMPTED, by_kind[VerdictKind.PREEMPTED])
    hardware = [f for f in by_kind[_HW] if f.beats_success or not clean_exit]
    if hardware:
        # Strongest first: device-level evidence before network noise and snapshots.
        hardware.sort(key=lambda f: not f.beats_success)
        return _verdict(_HW, hardware)
    if by_kind[VerdictKind.IMAGE_PULL] and record.exit_code is None:
        return _verdict(VerdictKind.IMAGE_PULL, by_kind[VerdictKind.IMAGE_PULL])
    if clean_exit:
        return Verdict(VerdictKind.SUCCEEDED, [_exit_line(record)], "the training exited with code 0")
    if by_kind[_INT]:
        verdict = _verdict(_INT, by_kind[_INT])
        if record.exit_code is not None and _exit_line(record) not in verdict.evidence:
            verdict.evidence.append(_exit_line(record))
        return verdict
    return _classify_by_exit_status(record)


def _classify_by_exit_status(record: AttemptRecord) -> Verdict:
    """No decisive evidence: decide from how the process ended."""
    child_signal, child_line = _find_torchrun_signal(list(record.log_tail))
    number = _exit_signal(record) or child_signal
    evidence = [_exit_line(record)] + ([child_line] if child_signal and child_line else [])
    if number is not None:
        name = _signal_name(number)
        if number == signal_module.SIGTERM:
            peer_stop = next((line for line in reversed(record.log_tail) if _PEER_STOP.search(line)), None)
            if peer_stop is not None:
                return Verdict(_HW, evidence + [peer_stop], f"{PEER_STOP_REASON} (its node's notice, see ADR 0004)")
        if number in _EXTERNAL_KILL_SIGNALS:
            return Verdict(_HW, evidence, f"killed by {name} from outside with no sign of a user error "
                                          "(treated as a node-side kill, see ADR 0004)")
        return Verdict(_INT, evidence, f"the training process ended with {name} and no hardware evidence")
    if record.exit_code is None:
        return Verdict(_HW, ["no exit status recorded for the attempt"],
                       "the attempt ended without an exit status (node or runtime lost)")
    return Verdict(_INT, evidence, f"the training exited with code {record.exit_code} and no hardware evidence")


# ----------------------------------------------------------------------------- CLI

class UnreadableInput(Exception):
    """The file given to `sat classify` is not an attempt record or a pod."""


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


def register_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `sat classify FILE [--log FILE] [--node-log FILE] [--json]`."""
    parser = subparsers.add_parser(
        "classify",
        help="classify a failed attempt as hardware, preempted, internal, image or succeeded",
        description="Classify one training attempt and print the verdict with its evidence. FILE is an "
                    "attempt record JSON or a pod as `kubectl get pod NAME -o json` prints it ('-' = stdin).",
    )
    parser.add_argument("file", metavar="FILE", help="attempt record or pod JSON")
    parser.add_argument("--log", metavar="FILE", help="the container log (`kubectl logs POD`)")
    parser.add_argument("--node-log", metavar="FILE", help="kernel-log lines of the node (dmesg, journalctl -k)")
    parser.add_argument("--events", metavar="FILE", help="events JSON (`kubectl get events -o json`)")
    parser.add_argument("--node", metavar="FILE", help="node JSON (`kubectl get node NAME -o json`)")
    parser.add_argument("--json", action="store_true", help='print {"kind": ..., "evidence": [...], "reason": ...}')
    parser.set_defaults(func=run_classify_cli)
    return parser


def run_classify_cli(args: argparse.Namespace) -> int:
    """Run `sat classify`; 0 when classified, 2 when the input cannot be read."""
    try:
        record = load_record(args.file, log=getattr(args, "log", None), node_log=getattr(args, "node_log", None),
                             events=getattr(args, "events", None), node=getattr(args, "node", None))
    except UnreadableInput as error:
        print(f"sat classify: error: {error}", file=sys.stderr)
        return 2
    verdict = classify(record)
    if getattr(args, "json", False):
        print(json.dumps(verdict.to_dict(), indent=2))
        return 0
    print(f"{verdict.kind.value}: {verdict.reason}")
    print(f"  job {record.job}, attempt {record.attempt}, node {record.node or '-'}")
    print("evidence:")
    for line in verdict.evidence:
        print(f"  {line}")
    return 0
