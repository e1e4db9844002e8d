"""The classifier: weigh an attempt's evidence into one Verdict (hardware, preempted, image, internal, succeeded).

Call order: build an `AttemptRecord` (local backend, or `record_from_pod`), then
`classify(record) -> Verdict` (or `explain(record)` for the findings and steps behind it). The rules and their precedence are in
docs/adr/0004-failure-classification.md; in short:

0. WHO ENDED IT — decided first, from the record's structured fields (`classify.ended`):
   the process itself, the kubelet or the runtime, a controller through the API, the node,
   or something outside unnamed. An interruption from outside (a controller, an unnamed
   SIGTERM/SIGKILL/SIGHUP or no exit status, a node its owner reclaimed) with no evidence of a
   fault is PREEMPTED, its reason starting with "interrupted:": resumed without blame (no
   failover, no ledger entry). A lost node is HARDWARE only when it was not reclaimed.
1. PREEMPTED  — a Spot notice, scheduler or Kueue preemption, graceful node shutdown,
   a Spot interruption taint/event, Karpenter's disruption or a cloud notice of an
   attempt killed from outside; or, on Spot/preemptible capacity (node labels, the
   labels at the attempt's start, taints, the pod's node selector, `[sat]
   spot_node_labels`), a node that went away with no device fault. Outranks everything
   (a preempted peer makes the other ranks log network errors).
2. HARDWARE   — hardware Xids, "fallen off the bus", CUDA errors that name the device
   or the node (`rules.CUDA_ERRORS`), uncorrectable ECC, PCIe AER, machine checks,
   NIC/IB link loss, NCCL/gloo network errors, a hang (heartbeat timeout, a collective
   or peer timeout), node NotReady / problem conditions, pressure evictions. Outranks
   exit codes and tracebacks.
3. IMAGE_PULL — the container never ran and its image could not be pulled.
4. SUCCEEDED  — exit code 0 and no evidence of kinds 1-2 that can outrank a clean
   exit (network noise at shutdown and node snapshots cannot).
5. INTERNAL   — OOM, tracebacks, bad arguments, application Xids, CUDA errors of the
   job's code or image, a collective mismatch between ranks, exit codes 1-127.
   Peer symptoms (NCCL watchdog timeouts, remote errors) yield to any INTERNAL
   evidence: a rank's own exception outranks its peers' timeouts.
   Ambiguous evidence (a CUDA status that is a bad device or a bad kernel, NCCL "unhandled
   cuda error", Xid 68) counts only when nothing decisive is left; its reason starts with
   "ambiguous:" and `core.node_health` makes it SUSPECT_NODE (relocation).
6. By exit status alone: crash signals (SIGSEGV, SIGBUS, SIGABRT, ...) and exit codes →
   INTERNAL; an outside kill or no exit status reaches step 0's interruption.

The classifier is pure Python (no Airflow, no Kubernetes client) and never raises on
odd input: missing fields just mean less evidence.
"""

from __future__ import annotations

import signal as signal_module
from dataclasses import dataclass, field

from sat_tasks.classify.ended import INTERRUPTED, Ender, WhoEnded, who_ended
from sat_tasks.classify.evidence import (
    Finding,
    as_dict,
    as_dicts,
    describe_state,
    exit_signal,
    find_spot_capacity,
    find_torchrun_signal,
    gather,
    killed_from_outside,
    signal_name,
)
from sat_tasks.classify.rules import (
    EXTERNAL_KILL_SIGNALS,
    HW,
    INT,
    PEER_STOP,
    PEER_STOP_REASON,
)
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Verdict, VerdictKind


def _verdict(kind: VerdictKind, findings: list[Finding], limit: int = 8) -> Verdict:
    evidence: list[str] = []
    for finding in findings:
        if finding.evidence not in evidence:
            evidence.append(finding.evidence)
    return Verdict(kind=kind, evidence=evidence[:limit], reason=findings[0].reason)


def _exit_line(record: AttemptRecord) -> str:
    for status in as_dicts(record.container_states):
        if status.get("init"):
            continue
        for key in ("state", "lastState"):
            terminated = as_dict(as_dict(status.get(key)).get("terminated"))
            if terminated and terminated.get("exitCode") == record.exit_code:
                return describe_state(status.get("name", "?"), "terminated", terminated)
    text = f"exit code {record.exit_code}"
    if record.signal:
        text += f" (signal {record.signal} {signal_name(record.signal)})"
    if record.termination_reason:
        text += f", reason {record.termination_reason}"
    return text


@dataclass
class Explanation:
    """Why `classify` decided as it did: every finding, and each precedence step it weighed.

    `findings`: every piece of evidence the rules produced (matched rules), in gathering order.
    `steps`: (step, outcome) for each precedence step in the order `_weigh` considered them; the
    last one decided. `verdict`: the verdict `classify` returns. `who`: who ended the process
    (`classify.ended`), decided before any finding is weighed.
    """

    verdict: Verdict | None = None
    findings: list[Finding] = field(default_factory=list)
    steps: list[tuple[str, str]] = field(default_factory=list)
    who: WhoEnded | None = None

    def step(self, name: str, outcome: str) -> None:
        self.steps.append((name, outcome))


def classify(record: AttemptRecord) -> Verdict:
    """Classify one attempt. Never raises on incomplete records; see the module doc.

    The verdict names the attempt, its node and its last committed checkpoint (the record's
    progress), so that `decide_next` needs nothing else.
    """
    return explain(record).verdict  # type: ignore[return-value]


def explain(record: AttemptRecord) -> Explanation:
    """`classify`, with the findings and the precedence steps that led to the verdict (`sat classify --explain`)."""
    why = Explanation()
    verdict = _weigh(record, why)
    why.verdict = verdict.model_copy(update={"attempt": record.attempt, "node": record.node,
                                             "last_committed_step": record.last_committed_step})
    return why


def node_evidence(record: AttemptRecord) -> list[str]:
    """What SAT itself read that counts against the attempt's node (ADR 0004, "observed, not printed").

    The lines of the hardware findings (decisive or ambiguous) that came from the node's kernel log,
    its conditions and taints, events, the runtime's container states and the launcher's own flags;
    and, when the node itself ended the attempt, how SAT saw it go. Empty when the verdict rests on
    what the training printed alone (an Xid line in its own log, an NCCL error it printed): the node
    ledger then records nothing against the node, whatever the verdict (`io.node_ledger`).
    """
    why = explain(record)
    lines = [f.evidence for f in why.findings if f.kind is HW and f.observed and not f.peer_symptom]
    if why.who is not None and why.who.who is Ender.NODE and why.who.reclaimed is None:
        lines += list(why.who.evidence[1:])
    return list(dict.fromkeys(lines))


def _kinds(findings: list[Finding]) -> str:
    return ", ".join(f"{len([f for f in findings if f.kind is kind])} {kind.value}"
                     for kind in VerdictKind if any(f.kind is kind for f in findings)) or "none"


def _weigh(record: AttemptRecord, why: Explanation) -> Verdict:
    """The verdict from the record's evidence, by the precedence of the module doc."""
    who = why.who = who_ended(record)
    why.step("0 who ended it", who.line())
    found = gather(record)
    why.findings = found
    findings = [f for f in found if not f.ambiguous]
    ambiguous = [f for f in found if f.ambiguous]
    by_kind = {kind: [f for f in findings if f.kind is kind] for kind in VerdictKind}
    clean_exit = record.exit_code == 0 and not record.signal

    if by_kind[VerdictKind.PREEMPTED]:
        why.step("1 PREEMPTED", "decided: a preemption outranks everything (a preempted peer makes the other "
                                "ranks log network errors)")
        return _verdict(VerdictKind.PREEMPTED, by_kind[VerdictKind.PREEMPTED])
    why.step("1 PREEMPTED", "no preemption evidence")
    interrupted = _interrupted(record, who, found)
    if interrupted is not None:
        why.step("1a interrupted", f"decided: ended from outside by {who.line()}, and nothing shows a fault")
        return interrupted
    why.step("1a interrupted", _why_not_interrupted(who, found))
    spot = find_spot_capacity(record)
    hardware = [f for f in by_kind[HW] if f.beats_success or not clean_exit]
    if spot:
        reclaimed = _reclaimed_spot_node(spot, hardware)
        if reclaimed is not None:
            why.step("1b Spot node lost", f"decided: {spot}, and the node went away with no device fault")
            return reclaimed
        why.step("1b Spot node lost", f"{spot}, but the node did not go away, or a device on it failed first")
    if hardware and all(f.peer_symptom for f in hardware) and by_kind[INT]:
        # A rank's own error outranks its peers' timeouts and remote errors that followed it.
        why.step("2 HARDWARE", f"{len(hardware)} finding(s), all peer symptoms (timeouts, remote errors)")
        why.step("5 INTERNAL", "decided: the job's own error outranks the peer symptoms that followed it")
        own = _verdict(INT, by_kind[INT] + hardware)
        return own.model_copy(update={"reason": f"{own.reason} (the NCCL timeouts/remote errors of the other "
                                                "ranks followed it)"})
    if hardware:
        # Strongest first: device-level evidence before network noise and snapshots.
        hardware.sort(key=lambda f: not f.beats_success)
        why.step("2 HARDWARE", "decided: hardware evidence outranks exit codes and tracebacks"
                 + (" (peer symptoms only, and no error of the job's own)" if all(f.peer_symptom for f in hardware)
                    else ""))
        return _verdict(HW, hardware)
    skipped = len(by_kind[HW]) - len(hardware)
    why.step("2 HARDWARE", "no hardware evidence" if not skipped else
             f"{skipped} finding(s) that cannot outrank a clean exit (shutdown noise, snapshots)")
    if by_kind[VerdictKind.IMAGE_PULL] and record.exit_code is None:
        why.step("3 IMAGE_PULL", "decided: the container never ran and its image could not be pulled")
        return _verdict(VerdictKind.IMAGE_PULL, by_kind[VerdictKind.IMAGE_PULL])
    why.step("3 IMAGE_PULL", "no image evidence" if not by_kind[VerdictKind.IMAGE_PULL] else
             "image evidence, but the container ran (it has an exit status)")
    if clean_exit:
        why.step("4 SUCCEEDED", "decided: exit code 0 and nothing that outranks a clean exit")
        return Verdict.of(VerdictKind.SUCCEEDED, [_exit_line(record)], "the training exited with code 0")
    why.step("4 SUCCEEDED", f"not a clean exit (exit code {record.exit_code})")
    if by_kind[INT]:
        why.step("5 INTERNAL", "decided: the job's own error (exception, OOM, bad arguments, application Xid)")
        verdict = _verdict(INT, by_kind[INT])
        if record.exit_code is not None and _exit_line(record) not in verdict.evidence:
            verdict = verdict.model_copy(update={"evidence": [*verdict.evidence, _exit_line(record)]})
        return verdict
    why.step("5 INTERNAL", "no error of the job's own")
    if ambiguous:
        why.step("5b ambiguous", f"decided: only ambiguous evidence is left ({_kinds(ambiguous)}); its reason says "
                                 "why it chose")
        verdict = _verdict(ambiguous[0].kind, [f for f in ambiguous if f.kind is ambiguous[0].kind])
        return verdict.model_copy(update={"evidence": [*verdict.evidence, _exit_line(record)][:8]})
    why.step("5b ambiguous", "no ambiguous evidence")
    if spot and killed_from_outside(record):
        why.step("6 exit status", f"decided: killed from outside on Spot capacity ({spot})")
        return Verdict.of(VerdictKind.PREEMPTED, [_exit_line(record), spot],
                          f"the node was Spot/preemptible capacity ({spot}) and the attempt was killed from "
                          "outside with no other evidence: a reclaim (ADR 0004)")
    verdict = _classify_by_exit_status(record)
    why.step("6 exit status", f"decided by how the process ended: {verdict.reason}")
    return verdict


#: Findings that describe the interruption itself (who ended it), not a fault of the node or the job.
_INTERRUPTION_RULES = ("disruption-target:", "pod-termination", "node-condition:Ready", "node-down-taint",
                       "event:NodeNotReady", "event:TaintManagerEviction", "event:NodeLost", "event:Rebooted",
                       "event:Evict", "event:Preempt", "event:Delet")


#: What the surviving ranks' NCCL/gloo transports log when the job is torn down around them.
_TEARDOWN_NETWORK = ("nccl-network", "infiniband-transport", "gloo-network", "nccl-system-error", "collective-timeout")


def fault_evidence(found: list[Finding], who: WhoEnded | None = None) -> list[Finding]:
    """The findings that show a fault of the node (a device, the kernel, a hang, a problem condition):
    not the interruption itself, not a peer's or the network's symptom. When a controller or the node's
    owner ended it, the transports' teardown noise (network lines that cannot outrank a clean exit) is
    not a fault either."""
    teardown = who is not None and (who.who is Ender.CONTROLLER or who.reclaimed is not None)
    return [f for f in found if f.kind is HW and not f.peer_symptom
            and (not f.node_loss or f.rule == "karpenter-disruption")
            and not any(f.rule.startswith(prefix) for prefix in _INTERRUPTION_RULES)
            and not (teardown and not f.beats_success and f.rule in _TEARDOWN_NETWORK)]


def _may_be_interrupted(who: WhoEnded) -> bool:
    if not who.outside or who.node_fault:
        return False
    return who.who in (Ender.CONTROLLER, Ender.OUTSIDE) or (who.who is Ender.NODE and who.reclaimed is not None)


def _why_not_interrupted(who: WhoEnded, found: list[Finding]) -> str:
    if not who.outside:
        return f"not an interruption: {who.who.value} ended it"
    if who.node_fault:
        return "the controller acted on a node fault"
    if who.who is Ender.NODE and who.reclaimed is None:
        return "the node was lost and nothing shows it was reclaimed"
    if who.who is Ender.RUNTIME:
        return "the kubelet or the runtime ended it (decided by what it says)"
    faults = fault_evidence(found, who)
    if faults:
        return f"an interruption, but {len(faults)} finding(s) show a fault ({faults[0].rule or faults[0].reason})"
    return "an interruption, but the job's own error came first"


def _interrupted(record: AttemptRecord, who: WhoEnded, found: list[Finding]) -> Verdict | None:
    """An interruption from outside with no evidence of a fault: PREEMPTED, "interrupted:" (ADR 0004)."""
    if not _may_be_interrupted(who) or fault_evidence(found, who):
        return None
    if record.exit_code is None and any(f.kind is VerdictKind.IMAGE_PULL for f in found):
        return None  # the container never ran: nothing was interrupted
    if any(f.ambiguous and f.kind is VerdictKind.PREEMPTED for f in found):
        return None  # a weak sign of a queue's eviction (Kueue's PodsReadyTimeout) is weighed at its own step
    if who.who is Ender.OUTSIDE and any(f.kind is HW and f.node_loss for f in found):
        return None  # the node went away (NodeLost, a node-failure eviction): a reclaim only on Spot (step 1b)
    own = [f for f in found if f.kind is INT and (who.who is not Ender.CONTROLLER or f.rule != "last-exception")]
    if own:
        return None  # the job's own error came first (a kernel OOM kill, its own storage limit): it decides
    peer_stop = next((line for line in reversed(record.log_tail) if PEER_STOP.search(line)), None)
    child_signal, child_line = find_torchrun_signal(list(record.log_tail))
    number = exit_signal(record) or child_signal
    if who.who is Ender.OUTSIDE:
        how = (f"killed by {signal_name(number)} from outside" if number is not None
               else "ended without an exit status")
        if peer_stop is not None:
            how = f"{PEER_STOP_REASON} ({how})"
    else:
        how = f"ended from outside by {who.who.value} ({who.by})"
    reclaimed = f"; reclaimed: {who.reclaimed}" if who.reclaimed else ""
    first = [who.reclaimed] if who.reclaimed and who.who is Ender.NODE else []  # what made the loss a reclaim
    evidence = list(dict.fromkeys([*first, _exit_line(record), *who.evidence[1:], *([child_line] if child_line else []),
                                   *([peer_stop] if peer_stop else []), *([who.reclaimed] if who.reclaimed else []),
                                   *(f.evidence for f in found if f.kind is not INT)]))[:8]
    return Verdict.of(VerdictKind.PREEMPTED, evidence,
                      f"{INTERRUPTED} {how}{reclaimed}, with no evidence of a fault: resumed without blame (no "
                      "failover spent, no ledger entry; ADR 0004)")


def _reclaimed_spot_node(spot: str, hardware: list[Finding]) -> Verdict | None:
    """On Spot capacity a lost node is a reclaim, unless a device on it failed first."""
    lost = [f for f in hardware if f.node_loss]
    device = [f for f in hardware if f.beats_success and not f.node_loss]
    if not lost or device:
        return None
    evidence = [spot] + [f.evidence for f in lost] + [f.evidence for f in hardware if not f.node_loss]
    return Verdict.of(VerdictKind.PREEMPTED, evidence[:8],
                      f"the node was Spot/preemptible capacity ({spot}) and went away: {lost[0].reason} "
                      "(a reclaim, not a hardware fault)")


def _classify_by_exit_status(record: AttemptRecord) -> Verdict:
    """No decisive evidence: decide from how the process ended."""
    child_signal, child_line = find_torchrun_signal(list(record.log_tail))
    number = exit_signal(record) or child_signal
    evidence = [_exit_line(record)] + ([child_line] if child_signal and child_line else [])
    if number is not None:
        name = signal_name(number)
        if number == signal_module.SIGTERM:
            peer_stop = next((line for line in reversed(record.log_tail) if PEER_STOP.search(line)), None)
            if peer_stop is not None:
                return Verdict.of(HW, evidence + [peer_stop], f"{PEER_STOP_REASON} (its node's notice, see ADR 0004)")
        if number in EXTERNAL_KILL_SIGNALS:
            return Verdict.of(HW, evidence, f"killed by {name} from outside with no sign of a user error "
                                             "(treated as a node-side kill, see ADR 0004)")
        return Verdict.of(INT, evidence, f"the training process ended with {name} and no hardware evidence")
    if record.exit_code is None:
        return Verdict.of(HW, ["no exit status recorded for the attempt"],
                          "the attempt ended without an exit status (node or runtime lost)")
    return Verdict.of(INT, evidence, f"the training exited with code {record.exit_code} and no hardware evidence")


