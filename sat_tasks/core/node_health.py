"""Diagnosis across attempts, nodes and jobs, as pure rules: relocation, the three-node rule, node quarantine.

One pod cannot tell a bad node from a bad job when the classifier's verdict is ambiguous
(its reason starts with "ambiguous:"). An SRE moves the job and looks again; so does SAT
(ADR 0004, "Relocation and the node health ledger"). Call order after each attempt:

    verdict = classify(record)
    verdict = suspect_node(verdict)                      # ambiguous HARDWARE -> SUSPECT_NODE
    diagnosis = diagnose(verdict, earlier, history, ...) # relocation, then the three-node rule
    events = fault_events(diagnosis, ...)                # what the node health ledger records
    decision = decide_next(job, plan, diagnosis.verdict) # core.policy

and before placing an attempt, `quarantined(events, releases, now=..., window=...)` names the
nodes no job may run on. Nothing here reads or writes: `sat_tasks.io.node_ledger` keeps the
events in Object Storage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sat_tasks.core.handoffs import Verdict, VerdictKind

AMBIGUOUS = "ambiguous:"
RELOCATION = "relocation:"  # the reason of a verdict the relocation rule decided
ACROSS_NODES = "across nodes:"  # the reason of a verdict the three-node rule decided
NODES_FOR_INTERNAL = 3  # one signature on this many different nodes of one job is the job's own fault
LEDGER_KINDS = (VerdictKind.HARDWARE, VerdictKind.SUSPECT_NODE)
# What tells nothing of a node: a pre-emption (capacity taken away) or a planned restart to grow back (ADR 0029).
DECIDES_NOTHING = (VerdictKind.PREEMPTED, VerdictKind.PLANNED_RESTART)
CLEARED = "CLEARED"  # a ledger event: the relocation showed a suspect fault to be the job's
_COUNTED = {kind.value for kind in LEDGER_KINDS}
EVIDENCE_KEPT = 3

# Parts of a line that differ between two runs of the same failure, in the order they are replaced.
_VOLATILE = (
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\[\s*\d+\.\d+\]"), "<time>"),  # the kernel's monotonic stamp
    (re.compile(r"\bGPU-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", re.IGNORECASE), "<gpu>"),
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", re.IGNORECASE), "<uuid>"),
    (re.compile(r"\b(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]\b", re.IGNORECASE), "<pci>"),
    (re.compile(r"\bPCI:[0-9a-f:.]+", re.IGNORECASE), "PCI:<pci>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.IGNORECASE), "<addr>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<ip>"),
    (re.compile(r"^\S+:\d+:\d+ (?=\[)"), ""),  # NCCL's `host:pid:tid [rank]` prefix
    (re.compile(r"\b(pid|tid|process|pgid|ppid)([=: ]+)\d+", re.IGNORECASE), r"\1\2<n>"),
    (re.compile(r"\b\d+\.\d+\b"), "<n>"),  # sizes, durations, steps in seconds
    (re.compile(r"\b\d{4,}\b"), "<n>"),  # pids, byte counts, ports; codes (Xid 79, error 999) are shorter
)


class FaultEvent(BaseModel):
    """One HARDWARE or SUSPECT_NODE verdict against its node, as the node health ledger keeps it.

    `kind` is the verdict's (`HARDWARE`, `SUSPECT_NODE`) or `CLEARED`: the relocation showed
    that run's suspect fault was the job's (the same signature on another node), so it no
    longer counts against the node. `by`: the rule that recorded it ("classify",
    "relocation").
    """

    model_config = ConfigDict(extra="ignore")

    node: str
    at: float
    job: str
    run_id: str
    attempt: int = 0
    kind: str
    signature: str = ""
    evidence: list[str] = Field(default_factory=list)
    reason: str = ""
    by: str = "classify"


class NodeRelease(BaseModel):
    """A person lifted a node's quarantine: faults before `at` no longer count."""

    model_config = ConfigDict(extra="ignore")

    node: str
    at: float
    by: str = "unknown"
    note: str = ""


class NodeHealth(BaseModel):
    """What the ledger says of one node now: quarantined or not, and the faults that count."""

    node: str
    quarantined: bool
    since: float | None = None  # when the second job's fault came
    jobs: list[str] = Field(default_factory=list)
    faults: list[FaultEvent] = Field(default_factory=list)  # the counting ones, newest first
    released: NodeRelease | None = None  # the latest release, if any

    @property
    def summary(self) -> str:
        if not self.faults:
            return "healthy"
        kinds = ", ".join(sorted({f.kind for f in self.faults}))
        return (f"{'quarantined' if self.quarantined else 'watched'}: {len(self.faults)} fault(s) ({kinds}) "
                f"from {len(self.jobs)} job(s): {', '.join(self.jobs)}")


class Diagnosis(BaseModel):
    """The verdict after the rules across attempts, and the node the relocation blamed (if it did)."""

    verdict: Verdict
    blamed: str | None = None  # the first node of a relocation that its second attempt cleared of the job
    blamed_for: Verdict | None = None  # the suspect verdict it is blamed for
    cleared: Verdict | None = None  # a suspect verdict the relocation showed to be the job's own
    rule: str | None = None  # RELOCATION or ACROSS_NODES when one of them decided
    note: str = ""  # one line for the status history


# ---- the signature -------------------------------------------------------------------------------
def signature(verdict: Verdict) -> str:
    """The normalized deciding evidence (its first line): the same failure on two nodes gives the same text.

    Timestamps, addresses (hex, PCI, IP), GPU UUIDs, pids and long numbers are replaced and the
    node's own name removed; short numbers stay, because they are codes (Xid 79 vs Xid 48,
    CUDA error 999). Falls back to the reason when there is no evidence.
    """
    line = (verdict.evidence[0] if verdict.evidence else verdict.reason) or ""
    return normalize(line, verdict.node)


def normalize(line: str, node: str | None = None) -> str:
    """`line` without what differs between two occurrences of one failure (see `signature`)."""
    text = line.strip()
    if node:
        text = text.replace(node, "<node>")
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return re.sub(r"\s+", " ", text).strip().lower()[:240]


# ---- suspicion and relocation ------------------------------------------------------------------
def is_ambiguous(verdict: Verdict) -> bool:
    return verdict.kind is VerdictKind.HARDWARE and verdict.reason.startswith(AMBIGUOUS)


def suspect_node(verdict: Verdict) -> Verdict:
    """An ambiguous HARDWARE verdict as SUSPECT_NODE (its evidence kept); any other verdict unchanged."""
    if not is_ambiguous(verdict):
        return verdict
    where = verdict.node or "its node"
    return verdict.model_copy(update={
        "kind": VerdictKind.SUSPECT_NODE,
        "reason": (f"{verdict.reason} Suspect node {where}: one pod cannot tell the node from the job, so the job "
                   f"fails over once; the same failure on another node is the job's (INTERNAL), a clean run or "
                   f"another fault there blames {where} (relocation, ADR 0004)"),
    })


def pending_suspect(earlier: Sequence[Verdict]) -> Verdict | None:
    """The newest SUSPECT_NODE verdict no later attempt has decided yet (only pre-emptions or planned restarts came
    after it)."""
    for verdict in sorted(earlier, key=lambda v: v.attempt or 0, reverse=True):
        if verdict.kind is VerdictKind.SUSPECT_NODE:
            return verdict
        if verdict.kind not in DECIDES_NOTHING:
            return None
    return None


def diagnose(verdict: Verdict, earlier: Sequence[Verdict], history: Iterable[FaultEvent] = (), *,
             job: str, run_id: str) -> Diagnosis:
    """Apply the relocation rule, then the three-node rule, to this attempt's verdict.

    `earlier`: this run's verdicts of the attempts before this one (as stored, after these
    rules). `history`: the ledger's fault events of the job (every run; the caller bounds
    the window). Relocation: after a SUSPECT_NODE on node A, the same signature on node B is
    INTERNAL; a clean run or another fault on B blames A; a pre-emption decides nothing.
    Three nodes: HARDWARE or SUSPECT_NODE with a signature the job already failed with on
    two other nodes is INTERNAL however each attempt looked.
    """
    suspect = pending_suspect(earlier)
    if suspect is not None and verdict.node != suspect.node and verdict.kind not in DECIDES_NOTHING:
        first, second, sig = suspect.node or "?", verdict.node or "?", signature(suspect)
        if verdict.kind in LEDGER_KINDS and signature(verdict) == sig:
            reason = (f"{RELOCATION} failed the same way on {first} (attempt {suspect.attempt}) and {second} "
                      f"(attempt {verdict.attempt}): \"{sig}\"; the job's own fault, not the nodes' (ADR 0004)")
            internal = verdict.model_copy(update={"kind": VerdictKind.INTERNAL, "reason": reason})
            return Diagnosis(verdict=internal, cleared=suspect, rule=RELOCATION, note=reason)
        outcome = ("ran clean" if verdict.kind is VerdictKind.SUCCEEDED
                   else f"failed differently ({verdict.kind.value})")
        note = (f"{RELOCATION} attempt {verdict.attempt} {outcome} on {second} after attempt {suspect.attempt}'s "
                f"suspect fault on {first}: {first} is blamed (\"{sig}\")")
        blamed = verdict.model_copy(update={"reason": f"{verdict.reason}; {note}".lstrip("; ")})
        verdict = blamed
        diagnosis = Diagnosis(verdict=blamed, blamed=suspect.node, blamed_for=suspect, rule=RELOCATION, note=note)
    else:
        diagnosis = Diagnosis(verdict=verdict)
    if verdict.kind in LEDGER_KINDS and verdict.node:
        sig = signature(verdict)
        same = [e for e in history if e.job == job and e.kind in _COUNTED and e.signature == sig]
        same += [_event_of(v, job, run_id) for v in earlier if v.kind in LEDGER_KINDS and v.node and signature(v) == sig]
        nodes = sorted({e.node for e in same} | {verdict.node})
        if len(nodes) >= NODES_FOR_INTERNAL:
            reason = (f"{ACROSS_NODES} job {job} failed with one signature on {len(nodes)} different nodes "
                      f"({', '.join(nodes)}): \"{sig}\"; the job's own fault however each attempt looked (ADR 0004)")
            internal = verdict.model_copy(update={"kind": VerdictKind.INTERNAL, "reason": reason})
            return diagnosis.model_copy(update={"verdict": internal, "rule": ACROSS_NODES, "note": reason})
    return diagnosis


def _event_of(verdict: Verdict, job: str, run_id: str, at: float = 0.0) -> FaultEvent:
    return FaultEvent(node=verdict.node or "?", at=at, job=job, run_id=run_id, attempt=verdict.attempt or 0,
                      kind=verdict.kind.value, signature=signature(verdict),
                      evidence=list(verdict.evidence[:EVIDENCE_KEPT]), reason=verdict.reason)


def fault_events(diagnosis: Diagnosis, *, job: str, run_id: str, now: float) -> list[FaultEvent]:
    """What the ledger records for this diagnosis: the verdict against its node, a blame or a clearing."""
    events = []
    verdict = diagnosis.verdict
    if verdict.kind in LEDGER_KINDS and verdict.node:
        events.append(_event_of(verdict, job, run_id, now))
    if diagnosis.blamed and diagnosis.blamed_for is not None:
        blame = _event_of(diagnosis.blamed_for, job, run_id, now)
        events.append(blame.model_copy(update={"kind": VerdictKind.HARDWARE.value, "by": "relocation",
                                               "reason": diagnosis.note}))
    if diagnosis.cleared is not None and diagnosis.cleared.node:
        cleared = _event_of(diagnosis.cleared, job, run_id, now)
        events.append(cleared.model_copy(update={"kind": CLEARED, "by": "relocation", "reason": diagnosis.note}))
    return events


# ---- quarantine --------------------------------------------------------------------------------

def node_health(node: str, events: Iterable[FaultEvent], releases: Iterable[NodeRelease], *, now: float,
                window: float) -> NodeHealth:
    """Quarantined when faults of two different jobs fall within `window` seconds of `now`, after the last release.

    A fault the relocation cleared (a CLEARED event of the same run and attempt) does not count;
    one job failing twice on the node is one job.
    """
    released = max((r for r in releases if r.node == node), key=lambda r: r.at, default=None)
    start = max(now - window, released.at if released else float("-inf"))
    mine = [e for e in events if e.node == node and e.at >= start]
    cleared = {(e.run_id, e.attempt) for e in mine if e.kind == CLEARED}
    faults = sorted((e for e in mine if e.kind in _COUNTED and (e.run_id, e.attempt) not in cleared),
                    key=lambda e: e.at)
    jobs: list[str] = []
    since = None
    for fault in faults:
        if fault.job not in jobs:
            jobs.append(fault.job)
            if len(jobs) == 2:
                since = fault.at
    return NodeHealth(node=node, quarantined=len(jobs) >= 2, since=since, jobs=jobs, faults=faults[::-1],
                      released=released)


def fleet_health(events: Sequence[FaultEvent], releases: Sequence[NodeRelease], *, now: float,
                 window: float) -> list[NodeHealth]:
    """`node_health` of every node the ledger knows, quarantined first, then by name."""
    nodes = sorted({e.node for e in events} | {r.node for r in releases})
    found = [node_health(n, events, releases, now=now, window=window) for n in nodes]
    return sorted(found, key=lambda h: (not h.quarantined, h.node))


def quarantined(events: Sequence[FaultEvent], releases: Sequence[NodeRelease], *, now: float,
                window: float) -> list[str]:
    """The names of the quarantined nodes (no job is placed on them)."""
    return [h.node for h in fleet_health(events, releases, now=now, window=window) if h.quarantined]
