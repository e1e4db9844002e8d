"""Evidence: what each part of an attempt record says, as findings that point to a verdict kind.

`gather(record)` runs every gatherer over the record (logs, kernel log, pod and container
states, conditions, events, node) and returns the findings; `classifier.classify` weighs them.
"""

from __future__ import annotations

import re
import signal as signal_module
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sat_tasks.classify.catalogues import (
    XID_NODE_WORDS,
    XID_NONE_WORDS,
    XID_NVLINK5_UNIT_EVENT,
    XID_SEVERITY,
    XID_SEVERITY_CODES,
)
from sat_tasks.classify.rules import (
    AMBIGUOUS_RULES,
    AMBIGUOUS_XIDS,
    APPLICATION_XIDS,
    BY_NODE,
    CUDA_OUTSIDE_NCCL_ONLY,
    EXCEPTION_LINE,
    EXTERNAL_KILL_SIGNALS,
    HARDWARE_TERMINATION_REASONS,
    HARDWARE_XIDS,
    HEADERLESS_EXCEPTION,
    HW,
    IMAGE_EVENT_MESSAGE,
    IMAGE_WAITING_REASONS,
    INT,
    INTERNAL_TERMINATION_REASONS,
    INTERNAL_WAITING_REASONS,
    ISO_STAMP,
    KARPENTER_DISRUPTION_EVENTS,
    KARPENTER_DISRUPTION_REASON,
    KARPENTER_DISRUPTION_TAINTS,
    KARPENTER_UNHEALTHY,
    KUEUE_EVICTION_REASON,
    KUEUE_MESSAGE_CAUSES,
    KUEUE_NODE_EVICTIONS,
    KUEUE_PREEMPTING_EVICTIONS,
    KUEUE_PREEMPTION_MESSAGE,
    KUEUE_TERMINATION_CONDITION,
    KUEUE_WEAK_EVICTIONS,
    LINE_PREFIXES,
    LIVENESS_PROBE,
    NCCL_CUDA_FAILURE,
    NCCL_FRAME,
    NCCL_SYSTEM_ERROR,
    NODE_DOWN_TAINTS,
    NODE_FAULT_WORDS,
    NODE_LOG_SLACK_AFTER,
    NODE_LOG_SLACK_BEFORE,
    NODE_LOW_ON_RESOURCE,
    NOT_A_NODE_FAULT_XIDS,
    NVIDIA_RUNTIME,
    OOM_WITH_MEMORY_FREE,
    OWN_LIMIT_EVICTION,
    PEER_EXCEPTION_MESSAGE,
    PEER_EXCEPTIONS,
    PREEMPT_CONDITIONS,
    PREEMPTED_TERMINATION_REASONS,
    PREEMPTING_DISRUPTIONS,
    PRESSURE_CONDITIONS,
    RISK_NOTICE_CONDITIONS,
    RISK_NOTICE_EVENTS,
    RISK_NOTICE_TAINTS,
    SEGFAULT,
    SHM_ERROR,
    SHUTDOWN_MESSAGE,
    SOCKET_ERROR,
    SPOT_CAPACITY_LABELS,
    SPOT_TAINT,
    SPOT_WORDS,
    STARTUP_PROBE,
    STARTUP_REASON,
    TEXT_RULES,
    TORCHRUN_SIGNAL,
    WRAPPER_EXCEPTIONS,
    XID_LINE,
    XID_RECOVERY_ACTION,
    TextRule,
    oom_with_memory_free,
)
from sat_tasks.config import sat_setting
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import VerdictKind


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: which kind it points to, the line, and a short reason.

    `beats_success` is False for evidence that must not turn a clean exit 0 into a
    failure: NCCL/gloo teardown noise and node-condition snapshots taken afterwards.
    `node_loss`: the node (not a device on it) went away or failed the pod; on Spot capacity
    that is a preemption. `peer_symptom`: what a rank logs when another rank failed.
    `ambiguous`: weighed only when nothing decisive is left (its reason says why it chose).
    `rule`: the rule or family that produced it (`sat classify --explain`, ADR 0004).
    `observed`: SAT read it itself (the node's kernel log, node conditions, events, the
    runtime's container states, the launcher's flags); False for what the training printed
    (its log): the job's own evidence for its verdict, never a node's (ADR 0004, the ledger).
    """

    kind: VerdictKind
    evidence: str
    reason: str
    beats_success: bool = True
    node_loss: bool = False
    peer_symptom: bool = False
    ambiguous: bool = False
    rule: str = ""
    observed: bool = True


def as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a mapping, else an empty one (malformed input is less evidence, not an error)."""
    return value if isinstance(value, dict) else {}


def as_dicts(value: Any) -> list[dict[str, Any]]:
    """The mappings in `value` (a list), skipping anything else."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def strip(line: str) -> str:
    """The line without the prefixes launchers and log shippers add (`rules.LINE_PREFIXES`)."""
    text = line
    for _ in range(8):
        before = text
        for prefix in LINE_PREFIXES:
            text = prefix.sub("", text, count=1)
        if text == before:
            break
    return text.rstrip()


def spot_capacity_labels() -> dict[str, str | None]:
    """Known Spot labels plus `[sat] spot_node_labels` (`key=value` or `key`, comma-separated)."""
    labels = dict(SPOT_CAPACITY_LABELS)
    try:
        configured = sat_setting("spot_node_labels", "")
    except (KeyError, OSError, ValueError):
        configured = ""
    for item in configured.split(","):
        key, _, value = item.strip().partition("=")
        if key.strip():
            labels[key.strip()] = value.strip() or None
    return labels


def is_spot_label(key: str, value: Any, labels: dict[str, str | None] | None = None) -> bool:
    wanted = (labels if labels is not None else spot_capacity_labels()).get(key, "\0")
    if wanted == "\0":
        return False
    return wanted is None or str(value).lower() == wanted.lower()


def find_spot_capacity(record: AttemptRecord) -> str | None:
    """How the record shows that its node was Spot/preemptible capacity, or None.

    The node's labels (`node_labels`; when they are empty because the node object is gone, the
    labels the launcher read when the attempt started, `node_labels_at_start`), then node taints with a Spot key (AKS taints its Spot
    pools too), then the Spot labels the pod's nodeSelector/affinity asked for, which
    `loaders.record_from_pod` keeps as `node_taints` entries with a `source` (the record has
    no field for the pod's scheduling constraints; they matter when the node object is gone).
    """
    labels = spot_capacity_labels()
    for key, value in as_dict(record.node_labels).items():
        if is_spot_label(str(key), value, labels):
            return f"node label {key}={value}"
    if not record.node_labels:  # the node object is gone (a Spot shutdown deletes it): its labels at start
        for key, value in as_dict(record.node_labels_at_start).items():
            if is_spot_label(str(key), value, labels):
                return f"node label at the attempt's start {key}={value}"
    for taint in as_dicts(record.node_taints):
        key = str(taint.get("key") or "")
        if is_spot_label(key, taint.get("value") or "", labels):
            source = taint.get("source") or "node taint"
            return f"{source} {key}={taint.get('value') or ''}"
    return None


def signal_name(number: int) -> str:
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_signal(record: AttemptRecord) -> int | None:
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


def killed_from_outside(record: AttemptRecord) -> bool:
    """The attempt ended without an exit status, or by SIGKILL/SIGTERM/SIGHUP (its own or torchrun's child's)."""
    number = exit_signal(record) or find_torchrun_signal(list(record.log_tail))[0]
    return record.exit_code is None or number in EXTERNAL_KILL_SIGNALS


def _line_time(line: str) -> datetime | None:
    match = ISO_STAMP.search(line[:64])
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
    return moment.replace(tzinfo=UTC)


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


def describe_state(name: str, kind: str, state: dict[str, Any]) -> str:
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
    involved = as_dict(event.get("involvedObject") or event.get("regarding"))
    about = f"{involved.get('kind')}/{involved.get('name')} " if involved.get("kind") else ""
    message = event.get("message") or event.get("note") or ""
    return f"event {about}{event.get('type') or 'Normal'} {event.get('reason')}: {str(message).strip()}"


# ---- gatherers: one per kind of evidence ----------------------------------------------------

def _find_flags(record: AttemptRecord) -> Iterator[Finding]:
    if record.preemption_notice:
        yield Finding(VerdictKind.PREEMPTED, "preemption notice: Spot SIGTERM notice delivered to the attempt",
                       "the Spot capacity was reclaimed (notice delivered)", rule="attempt-flags")
    if record.heartbeat_timeout:
        step = record.progress_record.step
        where = f" at step {step}" if step is not None else ""
        yield Finding(VerdictKind.HARDWARE, f"heartbeat timeout: training stopped making progress{where}",
                       "training hung (no progress before the heartbeat timeout)", rule="attempt-flags")
    if record.startup_timeout:
        yield Finding(INT, "start-up timeout: no training step before startup_timeout_seconds ran out",
                      STARTUP_REASON, rule="attempt-flags")


def _recovery_action_needed(line: str) -> bool:
    """Xid 154 names the recovery action the GPU now needs; `to 0x0 (None)` clears it."""
    target = re.search(r"\bto (0x[0-9a-f]+)", line, re.IGNORECASE)
    if target:
        return int(target.group(1), 16) != 0
    return bool(re.search(r"reboot|reset|drain", line, re.IGNORECASE))


def find_xids(lines: Iterable[str], describe=lambda line: line, observed: bool = True) -> Iterator[Finding]:
    for finding in _find_xids(lines, describe):
        yield finding if observed else replace(finding, observed=False)


def _find_xids(lines: Iterable[str], describe) -> Iterator[Finding]:
    for line in lines:
        match = XID_LINE.search(line)
        if not match:
            continue
        xid, where = int(match.group(2)), match.group(1)
        on = f" on {where}" if where else ""
        severity = XID_SEVERITY.search(line[match.end():]) if xid in XID_SEVERITY_CODES else None
        if severity and severity.group("nonfatal"):
            # The catalog's Nonfatal rows: IGNORE (no reset), or XID_154_EVAL, whose local effect is often the
            # application's crash on that GPU (Xid 45): never over the job's own error or a clean exit.
            yield Finding(HW, describe(line), f"ambiguous: Xid {xid}{on}: an NVLink5 error its line calls "
                          f"{severity.group(0)}: the catalog's XID 144-150 decode ignores it or evaluates the Xid 154 "
                          "that follows, and some of its rows crash the application on that GPU (Xid 45). Chose "
                          "relocation (SUSPECT_NODE): the same failure on another node is the job's (ADR 0004)",
                          beats_success=False, ambiguous=True, rule=f"xid:{xid}")
        elif severity:
            yield Finding(HW, describe(line), f"Xid {xid}{on}: an NVLink5 error its line calls {severity.group(0)} "
                          "(the catalog's XID 144-150 decode: RESET_GPU)", rule=f"xid:{xid}")
        elif xid in HARDWARE_XIDS:
            yield Finding(HW, describe(line), f"Xid {xid}{on}: {HARDWARE_XIDS[xid]}", rule=f"xid:{xid}")
        elif xid in APPLICATION_XIDS and XID_NVLINK5_UNIT_EVENT.search(line, match.end()):
            # The catalog's "application" code raised by an NVLink5 unit's interrupt on a link: the link's report.
            yield Finding(HW, describe(line), f"ambiguous: Xid {xid}{on}: {APPLICATION_XIDS[xid]}, but its line is an "
                          "NVLink5 unit's interrupt on a link, not a process's access: the link may be at fault. Chose "
                          "relocation (SUSPECT_NODE): the same failure on another node is the job's (ADR 0004)",
                          beats_success=False, ambiguous=True, rule=f"xid:{xid}")
        elif xid in APPLICATION_XIDS:
            yield Finding(INT, describe(line), f"Xid {xid}{on}: {APPLICATION_XIDS[xid]}", rule=f"xid:{xid}")
        elif xid in AMBIGUOUS_XIDS:
            yield Finding(HW, describe(line), f"ambiguous: Xid {xid}{on}: {AMBIGUOUS_XIDS[xid]}. Chose relocation "
                          "(SUSPECT_NODE): the same failure on another node is the job's (ADR 0004)",
                          ambiguous=True, rule=f"xid:{xid}")
        elif xid == XID_RECOVERY_ACTION:
            if _recovery_action_needed(line):
                yield Finding(HW, describe(line), f"Xid 154{on}: the driver asks for a GPU reset or node reboot",
                              rule="xid:154")
        elif xid not in NOT_A_NODE_FAULT_XIDS:
            # A code newer than the catalogue: read by the words the driver wrote after it.
            words = line[match.end():]
            if XID_NODE_WORDS.search(words) and not XID_NONE_WORDS.search(words):
                yield Finding(HW, describe(line), f"Xid {xid}{on} (not in the catalogue): its line names an "
                              f"uncorrectable, fatal or lost condition ({XID_NODE_WORDS.search(words).group(0)})",
                              rule=f"xid:{xid}")
        # Corrected, contained, recorded or unused codes are not evidence of a node fault on their own.


def _applies(rule: TextRule, line: str) -> bool:
    """Whether `rule` matches `line`; a CUDA code NCCL reports from its own call is NCCL's rule's to decide."""
    if rule.family in CUDA_OUTSIDE_NCCL_ONLY and NCCL_CUDA_FAILURE.search(line):
        return False
    return rule.matches(line)


def first_rule(line: str) -> tuple[TextRule, bool] | None:
    """The first line rule that matches `line` (decisive rules before ambiguous ones), and whether it is ambiguous."""
    for rule in TEXT_RULES:
        if _applies(rule, line):
            return rule, False
    for rule in AMBIGUOUS_RULES:
        if _applies(rule, line):
            return rule, True
    return None


def find_text(lines: Iterable[str], describe=lambda line: line, observed: bool = True) -> Iterator[Finding]:
    for line in lines:
        if oom_with_memory_free(line):
            yield Finding(HW, describe(line), OOM_WITH_MEMORY_FREE.reason, ambiguous=True,
                          rule=OOM_WITH_MEMORY_FREE.family, observed=observed)
            continue
        found = first_rule(line)
        if found is not None:
            rule, ambiguous = found
            yield Finding(rule.kind, describe(line), rule.reason, rule.beats_success,
                          peer_symptom=rule.peer_symptom, ambiguous=ambiguous, rule=rule.family, observed=observed)


def _find_nccl_system_errors(lines: list[str]) -> Iterator[Finding]:
    """`ncclSystemError` is the network when sockets fail, config when /dev/shm is too small."""
    system = [line for line in lines if NCCL_SYSTEM_ERROR.search(line)]
    if not system:
        return
    sockets = [line for line in lines if SOCKET_ERROR.search(line)]
    shm = [line for line in lines if SHM_ERROR.search(line)]
    if sockets:
        for line in (system[0], sockets[0]):
            yield Finding(HW, line, "NCCL system error on a socket (network)", beats_success=False,
                          peer_symptom=True, rule="nccl-system-error")
    elif shm:
        for line in (system[0], shm[0]):
            yield Finding(INT, line, "NCCL could not set up shared memory (/dev/shm too small)", rule="nccl-system-error")
    else:
        yield Finding(INT, system[0], "NCCL's system call failed with no socket error and no shared-memory error "
                      "beside it: NCCL itself or its configuration in the image (a node's fault shows its own lines: "
                      "a link down, an Xid, an HCA error)", rule="nccl-system-error")


def _find_nccl_segfault(record: AttemptRecord, lines: list[str]) -> Iterator[Finding]:
    """A segfault whose stack is inside NCCL is the transport, not the user's code."""
    segfault = exit_signal(record) == signal_module.SIGSEGV or any(SEGFAULT.search(line) for line in lines)
    frames = [line for line in lines if NCCL_FRAME.search(line)]
    if segfault and frames:
        seg_lines = [line for line in lines if SEGFAULT.search(line)]
        for line in (seg_lines[:1] + frames[:1]):
            yield Finding(HW, line, "segmentation fault inside NCCL (network transport)", rule="nccl-segfault")


def _is_symptom(text: str) -> bool:
    """An exception line that names a peer's, the network's or the node's failure, not the script's.

    A line whose first matching rule points at the job (a collective mismatch, CUDA's illegal
    address, an OOM) is the script's own, whatever else it mentions.
    """
    if oom_with_memory_free(text):
        return True  # an allocation that failed with memory free: the device's as likely as the job's
    found = first_rule(text)
    if found is not None:
        return found[0].kind is not INT
    return bool(PEER_EXCEPTION_MESSAGE.search(text))


def _exception_name(text: str) -> str | None:
    match = HEADERLESS_EXCEPTION.match(text) or EXCEPTION_LINE.match(text)
    return match.group(1) if match else None


def _last_exception(lines: list[str]) -> str | None:
    """The verbatim line naming the script's last exception.

    The last exception line of the last Python traceback, else (an excerpt, assertion-only
    output, a Ray task error) the last line that looks like one. Lines are read behind the
    prefixes launchers add (`strip`). torchrun's wrappers, torch.distributed's peer errors
    and exceptions about the collective or the connection are not the script's own.
    """
    in_traceback, from_traceback, headerless = False, None, None
    for line in lines:
        text = strip(line)
        if text.startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if not text or text[0].isspace():
            continue
        name = _exception_name(text)
        is_headerless = bool(HEADERLESS_EXCEPTION.match(text))
        if not in_traceback and not is_headerless:
            continue
        was_in_traceback, in_traceback = in_traceback, False
        if name is None:
            continue
        short = name.rsplit(".", 1)[-1]
        if short in WRAPPER_EXCEPTIONS or short in PEER_EXCEPTIONS or _is_symptom(text):
            continue
        if was_in_traceback:
            from_traceback = line
        else:
            headerless = line
    return from_traceback or headerless


def _find_traceback(lines: list[str]) -> Iterator[Finding]:
    line = _last_exception(lines)
    if line is not None:
        name = _exception_name(strip(line)) or "an exception"
        yield Finding(INT, line, f"the training script raised {name}", rule="last-exception")


def _runtime_or(kind: VerdictKind, state: dict[str, Any], why: str) -> tuple[VerdictKind, str]:
    """A container that could not start because the NVIDIA runtime failed is the node's fault."""
    if NVIDIA_RUNTIME.search(str(state.get("message") or "")):
        return HW, "the NVIDIA container runtime failed on the node, so the container could not start"
    return kind, why


def _find_container_states(record: AttemptRecord) -> Iterator[Finding]:
    for status in as_dicts(record.container_states):
        name = status.get("name", "?")
        for key in ("state", "lastState"):
            state = as_dict(status.get(key))
            waiting, terminated = as_dict(state.get("waiting")), as_dict(state.get("terminated"))
            if waiting and key == "state":
                reason = waiting.get("reason")
                if reason in IMAGE_WAITING_REASONS:
                    yield Finding(VerdictKind.IMAGE_PULL, describe_state(name, "waiting", waiting),
                                   f"the image could not be pulled ({reason})", rule="container-state")
                elif reason in INTERNAL_WAITING_REASONS:
                    kind, why = _runtime_or(INT, waiting, f"the container could not be created ({reason})")
                    yield Finding(kind, describe_state(name, "waiting", waiting), why, rule="container-state")
            if terminated and terminated.get("reason") in INTERNAL_TERMINATION_REASONS:
                reason = terminated["reason"]
                why = "out of memory (OOMKilled)" if reason == "OOMKilled" else f"the container failed ({reason})"
                kind, why = _runtime_or(INT, terminated, why)
                yield Finding(kind, describe_state(name, "terminated", terminated), why, rule="container-state")


def _find_termination(record: AttemptRecord) -> Iterator[Finding]:
    reason = record.termination_reason
    if not reason:
        return
    seen = {
        as_dict(as_dict(status.get(key)).get("terminated")).get("reason")
        for status in as_dicts(record.container_states) for key in ("state", "lastState")
    }
    message = (record.termination_message or "").strip()
    line = f"termination reason {reason}" + (f": {message}" if message else "")
    if reason in PREEMPTED_TERMINATION_REASONS:
        if reason in {"Preempted", "Preempting", "NodeShutdown"} or SHUTDOWN_MESSAGE.search(message):
            yield Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted or its node shut down ({reason})", rule="pod-termination")
        else:
            yield Finding(HW, line, f"the node terminated the pod ({reason})", node_loss=True, rule="pod-termination")
    elif reason == "Evicted" and OWN_LIMIT_EVICTION.search(message):
        yield Finding(INT, line, "the pod exceeded its own ephemeral-storage limit (evicted for it)", rule="pod-termination")
    elif reason in HARDWARE_TERMINATION_REASONS or reason.startswith("OutOf"):
        if SPOT_WORDS.search(message):
            yield Finding(VerdictKind.PREEMPTED, line, f"the node was reclaimed ({reason})", rule="pod-termination")
        elif reason == "Evicted" and NODE_LOW_ON_RESOURCE.search(message):
            yield Finding(HW, line, "the node ran short of a resource and evicted the pod (node pressure)", rule="pod-termination")
        else:
            yield Finding(HW, line, f"the node failed the pod ({reason})",
                          node_loss=reason in {"NodeLost", "NodeAffinity", "Evicted"}, rule="pod-termination")
    elif reason in INTERNAL_TERMINATION_REASONS and reason not in seen:
        why = "out of memory (OOMKilled)" if reason == "OOMKilled" else f"the container failed ({reason})"
        kind, why = _runtime_or(INT, {"message": message}, why)
        yield Finding(kind, line, why, rule="pod-termination")


def _kueue_eviction(reason: str, message: str, line: str, rule: str) -> Finding | None:
    """Kueue's eviction of the pod's Workload, by its eviction reason (`rules.KUEUE_*`)."""
    match = KUEUE_EVICTION_REASON.match(reason)
    cause = match.group(1) if match else reason
    known = {*KUEUE_PREEMPTING_EVICTIONS, *KUEUE_NODE_EVICTIONS, *KUEUE_WEAK_EVICTIONS}
    if cause not in known:
        cause = next((name for pattern, name in KUEUE_MESSAGE_CAUSES if pattern.search(message)), cause)
    if cause not in known and reason in {"Evicted", "Stopped"}:
        cause = "StoppedByKueue"  # Kueue took the quota back without saying why: not the node, not the job
    if cause in KUEUE_PREEMPTING_EVICTIONS or KUEUE_PREEMPTION_MESSAGE.search(message):
        why = KUEUE_PREEMPTING_EVICTIONS.get(cause) or KUEUE_PREEMPTING_EVICTIONS["Preempted"]
        return Finding(VerdictKind.PREEMPTED, line, f"{why} ({reason}): wait for quota and resume", rule=rule)
    if cause in KUEUE_NODE_EVICTIONS:
        return Finding(HW, line, f"{KUEUE_NODE_EVICTIONS[cause]} ({reason})", node_loss=True, rule=rule)
    if cause in KUEUE_WEAK_EVICTIONS:
        return Finding(VerdictKind.PREEMPTED, line, f"ambiguous: {KUEUE_WEAK_EVICTIONS[cause]} ({reason}). Chose "
                       "PREEMPTED: a wrong resume costs one wait for capacity, a failover or a stop would blame a "
                       "node or the code without evidence (ADR 0004)", ambiguous=True, rule=rule)
    return None


def _find_pod_conditions(record: AttemptRecord) -> Iterator[Finding]:
    """DisruptionTarget=True: preemption and node shutdown → PREEMPTED; the rest → HARDWARE.

    Kueue's TerminationTarget=True: by the Workload's eviction reason (`_kueue_eviction`).
    """
    for condition in as_dicts(record.pod_conditions):
        kind = condition.get("type")
        if kind not in {"DisruptionTarget", KUEUE_TERMINATION_CONDITION} or str(condition.get("status")) != "True":
            continue
        reason, message = str(condition.get("reason") or ""), str(condition.get("message") or "")
        line = _describe_condition("pod", condition)
        if kind == KUEUE_TERMINATION_CONDITION:
            finding = _kueue_eviction(reason, message, line, "kueue-eviction")
            if finding is not None:
                yield finding
            continue
        rule = f"disruption-target:{reason or '-'}"
        if reason in PREEMPTING_DISRUPTIONS or SPOT_WORDS.search(message):
            yield Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted ({reason or 'DisruptionTarget'})",
                          rule=rule)
        elif reason == "TerminationByKubelet" and SHUTDOWN_MESSAGE.search(message):
            yield Finding(VerdictKind.PREEMPTED, line, "the node shut down (graceful node shutdown)", rule=rule)
        elif reason == "TerminationByKubelet" and OWN_LIMIT_EVICTION.search(message):
            yield Finding(INT, line, "the pod exceeded its own ephemeral-storage limit (evicted for it)", rule=rule)
        elif reason == "TerminationByKubelet":
            yield Finding(HW, line, "the kubelet evicted the pod (node pressure)", rule=rule)
        elif BY_NODE.search(reason) or NODE_FAULT_WORDS.search(message):
            yield Finding(HW, line, f"the node disrupted the pod ({reason or 'DisruptionTarget'})", node_loss=True,
                          rule=rule)
        # Any other reason is a controller's (the eviction API, a descheduler, a queue, an autoscaler): who
        # ended the process (`classify.ended`), not a fault of the node; the classifier weighs it first.


def _karpenter_disruption(reason: str, message: str, line: str, outside: bool) -> Finding | None:
    """Karpenter's voluntary disruption of the node: a reclaim by policy when it killed the attempt."""
    if KARPENTER_UNHEALTHY.search(message):
        return Finding(HW, line, "Karpenter replaced the node because it was unhealthy (node repair)",
                       beats_success=False, node_loss=True, rule="karpenter-disruption")
    if not outside:
        return None  # a node consolidated after the attempt ended on its own says nothing about it
    why = KARPENTER_DISRUPTION_REASON.search(message)
    return Finding(VerdictKind.PREEMPTED, line, f"Karpenter disrupted the node ({why.group(0) if why else reason}: "
                   "consolidation, drift or expiry) and the attempt was killed with it: a reclaim by policy, not a "
                   "fault", rule="karpenter-disruption")


def _find_node(record: AttemptRecord) -> Iterator[Finding]:
    """Node conditions and taints are snapshots taken after the attempt: they cannot beat exit 0.

    Disruption taints (Karpenter) and risk notices (AWS rebalance recommendation, scheduled
    maintenance, Azure TerminateScheduled) count only when the attempt was killed from outside:
    a node emptied and consolidated after the job ended on its own says nothing about the job.
    """
    labels = spot_capacity_labels()
    outside = killed_from_outside(record)
    for condition in as_dicts(record.node_conditions):
        kind, status = condition.get("type"), str(condition.get("status"))
        line = _describe_condition("node", condition)
        text = f"{condition.get('reason') or ''} {condition.get('message') or ''}"
        rule = f"node-condition:{kind}"
        if kind == "Ready" and status in {"False", "Unknown"}:
            yield Finding(HW, line, "the node is NotReady", beats_success=False, node_loss=True, rule=rule)
        elif kind in PREEMPT_CONDITIONS and status == "True":
            yield Finding(VerdictKind.PREEMPTED, line, f"the node is being preempted ({kind}: a Spot eviction notice)",
                          rule=rule)
        elif kind in RISK_NOTICE_CONDITIONS and status == "True":
            if outside:
                yield Finding(VerdictKind.PREEMPTED, line, f"the platform took the node away ({kind}) and the "
                              "attempt was killed with it", rule=rule)
        elif kind not in PRESSURE_CONDITIONS and kind != "Ready" and status == "True":
            if SPOT_WORDS.search(text):
                yield Finding(VerdictKind.PREEMPTED, line, f"the node is being reclaimed ({kind})", rule=rule)
            else:
                yield Finding(HW, line, f"the node reports a problem ({kind})", beats_success=False, rule=rule)
    for taint in as_dicts(record.node_taints):
        key = str(taint.get("key") or "")
        if taint.get("source") or is_spot_label(key, taint.get("value") or "", labels):
            continue  # capacity, not an interruption: see find_spot_capacity
        line = f"node taint {key}={taint.get('value') or ''}:{taint.get('effect') or ''}"
        if SPOT_TAINT.search(key):
            yield Finding(VerdictKind.PREEMPTED, line, "the node is being reclaimed (Spot interruption)",
                          rule="spot-interruption-taint")
        elif key in KARPENTER_DISRUPTION_TAINTS:
            finding = _karpenter_disruption("disrupted", str(taint.get("value") or ""), line, outside)
            if finding is not None:
                yield finding
        elif RISK_NOTICE_TAINTS.search(key):
            if outside:
                yield Finding(VerdictKind.PREEMPTED, line, "the node was drained on the cloud's notice (rebalance "
                              "recommendation or scheduled maintenance) and the attempt was killed with it",
                              rule="cloud-notice-taint")
        elif key in NODE_DOWN_TAINTS:
            yield Finding(HW, line, "the node is unreachable or not ready", beats_success=False, node_loss=True,
                          rule="node-down-taint")


def _event_source(event: dict[str, Any]) -> str:
    source = as_dict(event.get("source"))
    return " ".join(str(part) for part in (source.get("component"), event.get("reportingComponent"),
                                           event.get("reportingController")) if part)


def _find_events(record: AttemptRecord) -> Iterator[Finding]:
    outside = killed_from_outside(record)
    for event in as_dicts(record.events):
        reason = str(event.get("reason") or "")
        message = str(event.get("message") or event.get("note") or "")
        line = _describe_event(event)
        rule = f"event:{reason or '-'}"
        involved = as_dict(event.get("involvedObject") or event.get("regarding"))
        kueue = ("kueue" in _event_source(event).lower() or involved.get("kind") == "Workload"
                 or KUEUE_EVICTION_REASON.match(reason))
        if reason in IMAGE_WAITING_REASONS or (reason in {"Failed", "BackOff", "InspectFailed"}
                                                and IMAGE_EVENT_MESSAGE.search(message)):
            yield Finding(VerdictKind.IMAGE_PULL, line, "the image could not be pulled", rule=rule)
        elif kueue and (finding := _kueue_eviction(reason, message, line, rule)) is not None:
            yield finding
        elif KUEUE_PREEMPTION_MESSAGE.search(message):
            yield Finding(VerdictKind.PREEMPTED, line, f"the workload was preempted to admit another one ({reason})",
                          rule=rule)
        elif reason in {"Preempted", "Preempting", "NodeShutdown", "Shutdown", "TerminatingOnInterruption",
                        "PreemptScheduled"} or SPOT_WORDS.search(reason):
            yield Finding(VerdictKind.PREEMPTED, line, f"the pod was preempted or its node reclaimed ({reason})",
                          rule=rule)
        elif reason in KARPENTER_DISRUPTION_EVENTS or (reason in {"Evicted", "Evicting"}
                                                       and "karpenter" in _event_source(event).lower()):
            finding = _karpenter_disruption(reason, message, line, outside)
            if finding is not None:
                yield finding
        elif reason in RISK_NOTICE_EVENTS:
            if outside:
                yield Finding(VerdictKind.PREEMPTED, line, f"the cloud's notice ({reason}) was followed by the "
                              "attempt being killed from outside: the instance was taken back", rule=rule)
        elif reason in {"Evicted", "Evicting"} and OWN_LIMIT_EVICTION.search(message):
            yield Finding(INT, line, "the pod exceeded its own ephemeral-storage limit (evicted for it)", rule=rule)
        elif reason in {"Evicted", "Evicting"}:
            yield Finding(HW, line, "the kubelet evicted the pod (node pressure)", rule=rule)
        elif reason in {"NodeNotReady", "TaintManagerEviction", "Rebooted", "NodeLost"}:
            yield Finding(HW, line, f"the node failed ({reason})", beats_success=False, node_loss=True, rule=rule)
        elif STARTUP_PROBE.search(message):
            yield Finding(INT, line, STARTUP_REASON, rule=rule)
        elif LIVENESS_PROBE.search(message):
            yield Finding(HW, line, "training hung (the liveness probe saw no progress)", rule=rule)
        elif reason in {"OOMKilling", "SystemOOM"}:
            yield Finding(INT, line, "out of host memory (kernel OOM killer)", rule=rule)
        else:
            yield from find_xids([message], describe=lambda _m, line=line: line)
            yield from find_text([message], describe=lambda _m, line=line: line)


def find_torchrun_signal(lines: list[str]) -> tuple[int | None, str | None]:
    """torchrun exits 1 when a signal stopped it or a child; its log names the signal."""
    for line in reversed(lines):
        match = TORCHRUN_SIGNAL.search(line)
        if match:
            if match.group(5):
                return int(match.group(5)) - 128, line
            return int(match.group(1) or match.group(3) or match.group(4)), line
    return None, None


def gather(record: AttemptRecord) -> list[Finding]:
    log, node_log = list(record.log_tail), _node_log_in_window(record)
    findings: list[Finding] = []
    # Order matters only for the verdict's reason: the first finding of the winning kind. What the
    # training printed (its log) is the job's own evidence, never a node's (`Finding.observed`).
    findings += find_xids(node_log)
    findings += find_xids(log, observed=False)
    findings += find_text(node_log)
    findings += find_text(log, observed=False)
    findings += (replace(f, observed=False) for f in _find_nccl_system_errors(log))
    findings += (replace(f, observed=False) for f in _find_nccl_segfault(record, log))
    findings += _find_flags(record)
    findings += _find_pod_conditions(record)
    findings += _find_termination(record)
    findings += _find_container_states(record)
    findings += _find_events(record)
    findings += _find_node(record)
    findings += (replace(f, observed=False) for f in _find_traceback(log))
    return findings


