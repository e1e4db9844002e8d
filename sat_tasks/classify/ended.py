"""Who ended the process: decided from the record's structured fields before any text is read (ADR 0004).

Four answers (`Ender`), and one for what the record cannot say:

- **the process itself**: it exited with a status of its own (a code, or a crash signal);
- **the kubelet or the container runtime**: an OOM kill, an eviction for node pressure, a
  probe's kill, the pod's active deadline;
- **a controller through the API**: a deletion (`deletionTimestamp`), the eviction API, the
  scheduler's or a queue's preemption, any controller's `DisruptionTarget` condition, an
  event of a component other than the kubelet and the node controllers that names a
  disruption, a `managedFields` manager that wrote the disruption;
- **the node**: Ready False or Unknown, the Node object gone (its labels at the attempt's start
  still say what it was), the pod garbage-collected or evicted by the taint manager for it.
  A node a controller (an autoscaler, Karpenter, a provider's notice) took away, or Spot
  capacity, was *reclaimed*: its loss is not a fault.
- **from outside, unnamed**: SIGTERM/SIGKILL/SIGHUP, or no exit status, with none of the above.

Families, not lists: a `DisruptionTarget` reason is read by what it names (the kubelet, the
node's garbage collection or taints; anything else is a controller), an event by its source
component and whether its words name a disruption, so a controller nobody listed is still a
controller. The classifier (`classifier._weigh`) weighs the answer first: an interruption from
outside with no evidence of a fault is PREEMPTED, its reason starting with "interrupted:".
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sat_tasks.classify.evidence import (
    as_dict,
    as_dicts,
    exit_signal,
    find_spot_capacity,
    find_torchrun_signal,
    signal_name,
)
from sat_tasks.classify.rules import (
    BY_KUBELET,
    BY_NODE,
    CONTROLLER_REASONS,
    DISRUPTION_WORDS,
    EXTERNAL_KILL_SIGNALS,
    KUBE_SCHEDULER,
    KUBELET,
    NODE_CONTROLLERS,
    NODE_DOWN_TAINTS,
    NODE_FAULT_WORDS,
    NODE_REASONS,
    NOT_A_DISRUPTION,
    PEER_STOP,
    RECLAIM_TAINT,
    RUNTIME_REASONS,
    SHUTDOWN_WORDS,
)
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import INTERRUPTED  # noqa: F401 - re-exported: the "interrupted:" prefix lives here too


class Ender(str, Enum):
    """Who ended the attempt's process."""

    PROCESS = "the process itself"
    RUNTIME = "the kubelet or the container runtime"
    CONTROLLER = "a controller through the API"
    NODE = "the node"
    OUTSIDE = "something outside the process, unnamed"


@dataclass(frozen=True)
class WhoEnded:
    """The answer: who, named how, on what evidence; `outside`: not the process's own end;
    `reclaimed`: why a lost or interrupted node was taken away by its owner (None: not known to be)."""

    who: Ender
    by: str
    evidence: tuple[str, ...] = ()
    outside: bool = False
    reclaimed: str | None = None
    node_fault: bool = False  # a controller acted because the node was broken
    notes: tuple[str, ...] = field(default=())

    def line(self) -> str:
        """One line for `sat classify --explain` and the verdict's reason."""
        text = f"{self.who.value} ({self.by})"
        if self.reclaimed:
            text += f"; reclaimed: {self.reclaimed}"
        if self.node_fault:
            text += "; the controller acted on a node fault"
        return text


def _source(event: dict[str, Any]) -> str:
    source = as_dict(event.get("source"))
    for part in (source.get("component"), event.get("reportingController"), event.get("reportingComponent")):
        if part:
            return str(part)
    return ""


def _event_line(event: dict[str, Any]) -> str:
    involved = as_dict(event.get("involvedObject") or event.get("regarding"))
    about = f"{involved.get('kind')}/{involved.get('name')} " if involved.get("kind") else ""
    message = str(event.get("message") or event.get("note") or "").strip()
    source = _source(event)
    by = f" (from {source})" if source else ""
    return f"event {about}{event.get('reason')}{by}: {message}"


def _is_node_event(event: dict[str, Any]) -> bool:
    kind = str(as_dict(event.get("involvedObject") or event.get("regarding")).get("kind") or "")
    return kind in {"Node", "NodeClaim", "Machine"}


def _exit_status(record: AttemptRecord) -> tuple[int | None, str]:
    """The signal that ended it (its own or torchrun's child's) and how the record says so."""
    number = exit_signal(record)
    if number is not None:
        return number, f"exit code {record.exit_code}" + (f", signal {number} ({signal_name(number)})")
    child, line = find_torchrun_signal(list(record.log_tail))
    if child is not None:
        return child, f"exit code {record.exit_code}; torchrun: {line.strip() if line else signal_name(child)}"
    return None, f"exit code {record.exit_code}"


def _from_outside(record: AttemptRecord) -> tuple[bool, str]:
    number, how = _exit_status(record)
    if record.exit_code is None and number is None:
        return True, "no exit status recorded"
    if number in EXTERNAL_KILL_SIGNALS or number == signal_module.SIGINT:
        return True, how
    if any(PEER_STOP.search(line) for line in record.log_tail[-200:]):
        return True, f"{how}; the engine: another rank received SIGTERM"
    return False, how


def _disruption_conditions(record: AttemptRecord) -> list[tuple[Ender, str, str, bool]]:
    """(who, by, line, node_fault) for each DisruptionTarget=True condition, whatever its reason."""
    found = []
    for condition in as_dicts(record.pod_conditions):
        if condition.get("type") != "DisruptionTarget" or str(condition.get("status")) != "True":
            continue
        reason, message = str(condition.get("reason") or ""), str(condition.get("message") or "")
        line = f"pod condition DisruptionTarget=True reason={reason or '-'}" + (f": {message}" if message else "")
        if BY_KUBELET.search(reason):
            who = Ender.NODE if SHUTDOWN_WORDS.search(message) else Ender.RUNTIME
            found.append((who, f"the kubelet: {reason}", line, False))
        elif BY_NODE.search(reason):
            found.append((Ender.NODE, f"the node's loss: {reason}", line, True))
        else:
            found.append((Ender.CONTROLLER, reason or "DisruptionTarget", line, bool(NODE_FAULT_WORDS.search(message))))
    return found


def _managers(record: AttemptRecord) -> list[str]:
    """The `managedFields` managers that wrote the pod's disruption (not the kubelet)."""
    managers = as_dicts(as_dict(record.end_facts).get("managers"))
    return [str(m.get("manager")) for m in managers
            if m.get("disruption") and m.get("manager") and not KUBELET.search(str(m.get("manager")))]


def _controller_events(record: AttemptRecord) -> list[tuple[str, str, bool, bool]]:
    """(component, line, on the node, node_fault) for events of a component other than the kubelet and
    the node controllers whose reason or message names a disruption."""
    found = []
    for event in as_dicts(record.events):
        source = _source(event)
        reason = str(event.get("reason") or "")
        message = str(event.get("message") or event.get("note") or "")
        if KUBELET.search(source) or NODE_CONTROLLERS.search(source) or reason == "Killing":
            continue  # the kubelet carries out a deletion or a probe's kill; the node lifecycle is `_node_down`
        if not source and not re.search(r"preempt", f"{reason} {message}", re.IGNORECASE):
            # without a source (`kubectl get events` prints none), an eviction or a kill may be the kubelet's: not
            # read as a controller unless its words name a preemption (Volcano's "Pod is evicted, because of preempt")
            continue
        if NOT_A_DISRUPTION.search(reason) and not NODE_FAULT_WORDS.search(reason):
            continue
        if not (DISRUPTION_WORDS.search(reason) or (source and DISRUPTION_WORDS.search(message))):
            continue
        if KUBE_SCHEDULER.search(source) and not re.search(r"preempt", f"{reason} {message}", re.IGNORECASE):
            continue  # the kube-scheduler speaks of a disruption only when it preempts
        fault = bool(NODE_FAULT_WORDS.search(f"{reason} {message}"))
        found.append((source or "an unnamed component", _event_line(event), _is_node_event(event), fault))
    return found


def _node_down(record: AttemptRecord) -> list[str]:
    """How the record shows that the node went away: Ready False/Unknown, down taints, the Node gone."""
    lines = []
    for condition in as_dicts(record.node_conditions):
        if condition.get("type") == "Ready" and str(condition.get("status")) in {"False", "Unknown"}:
            lines.append(f"node condition Ready={condition.get('status')}"
                         + (f" reason={condition['reason']}" if condition.get("reason") else ""))
    for taint in as_dicts(record.node_taints):
        if str(taint.get("key") or "") in NODE_DOWN_TAINTS:
            lines.append(f"node taint {taint.get('key')}:{taint.get('effect') or ''}")
    for event in as_dicts(record.events):
        source = _source(event)
        reason = str(event.get("reason") or "")
        if reason in {"NodeNotReady", "NodeLost", "RemovingNode", "DeletingNode", "Rebooted"} or (
                NODE_CONTROLLERS.search(source) and reason in {"TaintManagerEviction", "DeletingAllPods"}):
            lines.append(_event_line(event))
    facts = as_dict(record.end_facts)
    if facts.get("node_gone") is True:
        lines.append("the Node object was gone when the attempt ended")
    elif (facts.get("node_gone") is None and record.node and not record.node_labels and not record.node_conditions
          and record.node_labels_at_start):
        # inferred only where the backend did not say: the local runner says `node_gone: False` (a local node's
        # labels are not read at the end, and its record is never gone; an outside SIGTERM there is no lost node)
        lines.append("the Node object was gone when the attempt ended (only its labels at the attempt's start are "
                     "known)")
    reason = record.termination_reason or ""
    if NODE_REASONS.search(reason):
        lines.append(f"termination reason {reason}" + (f": {record.termination_message}"
                                                       if record.termination_message else ""))
    return lines


def _reclaim(record: AttemptRecord, controller_events: list[tuple[str, str, bool, bool]]) -> str | None:
    """Why the node was taken away by its owner: Spot capacity, a controller's taint or event on it."""
    spot = find_spot_capacity(record)
    if spot:
        return spot
    for taint in as_dicts(record.node_taints):
        key = str(taint.get("key") or "")
        if taint.get("source") or key in NODE_DOWN_TAINTS:
            continue
        if RECLAIM_TAINT.search(key):
            return f"node taint {key}={taint.get('value') or ''}"
    for component, line, on_node, fault in controller_events:
        if on_node and not fault:
            return f"{component} took the node away: {line}"
    return None


def who_ended(record: AttemptRecord) -> WhoEnded:
    """Who ended the attempt's process, from the record's structured fields (no log text but torchrun's
    signal line and the engine's peer-stop line, which are how the process's own status is known)."""
    facts = as_dict(record.end_facts)
    outside, how = _from_outside(record)
    disruptions = _disruption_conditions(record)
    controller_events = _controller_events(record)
    node_down = _node_down(record)
    reclaimed = _reclaim(record, controller_events)
    reason = record.termination_reason or ""
    told = str(facts.get("who") or "").lower()
    if told in {e.name.lower() for e in Ender}:
        return WhoEnded(Ender[told.upper()], f"the backend says so: {facts.get('by') or told}", (how,),
                        outside=told != "process", reclaimed=reclaimed)

    # The kubelet or the runtime: an OOM kill, an eviction for pressure, a deadline (also when the exit is 137).
    if RUNTIME_REASONS.search(reason) and not (reason == "Evicted" and disruptions
                                               and disruptions[0][0] is Ender.CONTROLLER):
        return WhoEnded(Ender.RUNTIME, f"the kubelet: {reason}", (f"termination reason {reason}", how),
                        outside=True)
    for status in as_dicts(record.container_states):
        for key in ("state", "lastState"):
            terminated = as_dict(as_dict(status.get(key)).get("terminated"))
            if terminated.get("reason") == "OOMKilled" and not status.get("init"):
                return WhoEnded(Ender.RUNTIME, "the runtime: OOMKilled", ("container terminated OOMKilled", how),
                                outside=True)
    if not outside:
        return WhoEnded(Ender.PROCESS, how, (how,), outside=False)

    evidence = [how]
    # A controller through the API: its DisruptionTarget, a deletion, its events, the manager that wrote it.
    controllers = [d for d in disruptions if d[0] is Ender.CONTROLLER]
    managers = _managers(record)
    deleted = facts.get("deletion_timestamp")
    pod_events = [e for e in controller_events if not e[2]]
    if controllers or CONTROLLER_REASONS.search(reason) or pod_events or (deleted and not node_down):
        names = list(dict.fromkeys(managers + [e[0] for e in pod_events]
                                   + [d[1] for d in controllers]))
        if CONTROLLER_REASONS.search(reason):
            names.append(f"termination reason {reason}")
        if deleted:
            evidence.append(f"pod deletionTimestamp {deleted}")
        evidence += [d[2] for d in controllers] + [e[1] for e in pod_events]
        fault = any(d[3] for d in controllers) or any(e[3] for e in pod_events)
        return WhoEnded(Ender.CONTROLLER, ", ".join(names) or "a client of the API (deleted the pod)",
                        tuple(evidence), outside=True, reclaimed=reclaimed, node_fault=fault)
    # The kubelet (pressure eviction, graceful shutdown) by its DisruptionTarget.
    kubelet = [d for d in disruptions if d[0] is Ender.RUNTIME]
    if kubelet:
        return WhoEnded(Ender.RUNTIME, kubelet[0][1], (kubelet[0][2], how), outside=True)
    # The node: down, gone, its pods collected, shut down.
    nodes = [d for d in disruptions if d[0] is Ender.NODE]
    if nodes or node_down:
        lines = [d[2] for d in nodes] + node_down
        node_events = [e for e in controller_events if e[2]]
        fault = any(e[3] for e in node_events)
        if not reclaimed and any(SHUTDOWN_WORDS.search(line) for line in lines):
            reclaimed = "graceful node shutdown (the node's owner shut it down)"
        return WhoEnded(Ender.NODE, "; ".join(dict.fromkeys([d[1] for d in nodes] + node_down[:1])),
                        tuple(evidence + lines), outside=True, reclaimed=None if fault else reclaimed,
                        node_fault=fault)
    node_events = [e for e in controller_events if e[2]]
    if node_events:
        component, line, _on_node, fault = node_events[0]
        return WhoEnded(Ender.CONTROLLER, f"{component}, on the node", (how, line), outside=True,
                        reclaimed=None if fault else reclaimed, node_fault=fault)
    return WhoEnded(Ender.OUTSIDE, how, (how,), outside=True, reclaimed=reclaimed)
