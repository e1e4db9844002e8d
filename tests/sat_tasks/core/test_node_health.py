"""Diagnosis across attempts, nodes and jobs: the signature, relocation, the three-node rule, quarantine, release."""

from __future__ import annotations

import pytest

from sat_tasks.core.handoffs import Action, Plan, Verdict, VerdictKind
from sat_tasks.core.node_health import (
    ACROSS_NODES,
    CLEARED,
    RELOCATION,
    FaultEvent,
    NodeRelease,
    diagnose,
    fault_events,
    node_health,
    normalize,
    quarantined,
    signature,
    suspect_node,
)
from sat_tasks.core.policy import decide_next
from sat_tasks.core.status import JobStatus
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

HW, SUSPECT, INT, OK, PRE = (VerdictKind.HARDWARE, VerdictKind.SUSPECT_NODE, VerdictKind.INTERNAL,
                             VerdictKind.SUCCEEDED, VerdictKind.PREEMPTED)
NOW, DAY = 1_800_000_000.0, 86_400.0
XID68 = "[{stamp}] NVRM: Xid (PCI:0000:{bus}:00): 68, pid={pid}, name=python, NVDEC0 Exception"
NCCL = "{host}:{pid}:{tid} [0] NCCL WARN Cuda failure 999 'unknown error'"


def verdict(kind: VerdictKind, node: str, attempt: int, line: str = "", reason: str = "") -> Verdict:
    return Verdict(kind=kind, evidence=[line] if line else [], reason=reason or kind.value.lower(), node=node,
                   attempt=attempt, last_committed_step=10)


def ambiguous(node: str, attempt: int, pid: int = 4242, stamp: str = " 4417.123456", bus: str = "3b") -> Verdict:
    return verdict(HW, node, attempt, XID68.format(stamp=stamp, bus=bus, pid=pid),
                   reason="ambiguous: Xid 68 on PCI:0000:3b:00: NVDEC exception. Chose HARDWARE: ...")


def event(node: str, job: str, at: float, *, kind: str = "HARDWARE", run: str = "r1", attempt: int = 1,
          sig: str = "xid 79") -> FaultEvent:
    return FaultEvent(node=node, at=at, job=job, run_id=run, attempt=attempt, kind=kind, signature=sig)


# ---- the signature ------------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b", "same"), [
    pytest.param(XID68.format(stamp=" 4417.123456", bus="3b", pid=4242), XID68.format(stamp="  12.5", bus="af", pid=7),
                 True, id="xid-stamp-pci-pid-differ"),
    pytest.param(NCCL.format(host="node-a", pid=12345, tid=12399), NCCL.format(host="node-b", pid=777, tid=778),
                 True, id="nccl-host-pid-tid-differ"),
    pytest.param("2026-12-01T08:00:01Z CUDA error: unknown error at 0x7f3a2c001000",
                 "2026-12-02T09:11:59.123+00:00 CUDA error: unknown error at 0x7f00deadbeef", True,
                 id="timestamps-and-addresses"),
    pytest.param("GPU-3f1e2d4c-1111-2222-3333-444455556666 is lost", "GPU-aaaaaaaa-1111-2222-3333-444455556666 is lost",
                 True, id="gpu-uuids"),
    pytest.param(XID68.format(stamp="1.0", bus="3b", pid=1).replace(" 68,", " 79,"),
                 XID68.format(stamp="1.0", bus="3b", pid=1), False, id="xid-numbers-are-codes"),
    pytest.param("Cuda failure 999 'unknown error'", "Cuda failure 700 'an illegal memory access'", False,
                 id="cuda-codes-differ"),
])
def test_the_signature_keeps_what_a_failure_is_and_drops_where_and_when(a, b, same):
    assert (normalize(a, "node-a") == normalize(b, "node-b")) is same


def test_the_signature_is_the_first_evidence_line_without_its_node():
    v = verdict(HW, "gpu-7", 1, "gpu-7 kernel: NVRM: Xid 79, GPU has fallen off the bus")
    assert signature(v) == "<node> kernel: nvrm: xid 79, gpu has fallen off the bus"
    assert signature(verdict(HW, "gpu-7", 1, reason="no evidence at all")) == "no evidence at all"


# ---- suspicion ---------------------------------------------------------------------------------
def test_an_ambiguous_hardware_verdict_becomes_suspect_node_with_its_evidence():
    suspect = suspect_node(ambiguous("node-a", 1))
    assert suspect.kind is SUSPECT and suspect.evidence == ambiguous("node-a", 1).evidence
    assert suspect.reason.startswith("ambiguous:") and "Suspect node node-a" in suspect.reason
    decisive = verdict(HW, "node-a", 1, "Xid 79", reason="Xid 79: fallen off the bus")
    assert suspect_node(decisive) is decisive


# ---- relocation --------------------------------------------------------------------------------
@pytest.mark.parametrize(("second", "kind", "blamed", "rule"), [
    pytest.param(ambiguous("node-b", 2, pid=9, stamp="  88.1", bus="af"), INT, None, RELOCATION,
                 id="same-signature-elsewhere-is-internal"),
    pytest.param(verdict(OK, "node-b", 2), OK, "node-a", RELOCATION, id="clean-run-blames-first-node"),
    pytest.param(verdict(HW, "node-b", 2, "NVRM: Xid 79, GPU has fallen off the bus"), HW, "node-a", RELOCATION,
                 id="different-fault-blames-first-node"),
    pytest.param(verdict(INT, "node-b", 2, "KeyError: 'labels'"), INT, "node-a", RELOCATION,
                 id="own-error-elsewhere-blames-first-node"),
    pytest.param(verdict(PRE, "node-b", 2, "spot notice"), PRE, None, None, id="preemption-decides-nothing"),
])
def test_relocation_decides_after_the_second_node(second, kind, blamed, rule):
    first = suspect_node(ambiguous("node-a", 1))
    diagnosis = diagnose(suspect_node(second), [first], job="j", run_id="r1")
    assert (diagnosis.verdict.kind, diagnosis.blamed, diagnosis.rule) == (kind, blamed, rule)
    if kind is INT and blamed is None:
        assert diagnosis.verdict.reason.startswith(RELOCATION)
        assert "failed the same way on node-a (attempt 1) and node-b (attempt 2)" in diagnosis.verdict.reason
        assert diagnosis.cleared == first
    if blamed:
        assert "node-a is blamed" in diagnosis.verdict.reason


def test_a_suspicion_waits_through_preemptions_and_ends_with_the_next_verdict():
    first = suspect_node(ambiguous("node-a", 1))
    preempted = verdict(PRE, "node-b", 2)
    after = diagnose(verdict(OK, "node-c", 3), [first, preempted], job="j", run_id="r1")
    assert after.blamed == "node-a"
    decided = verdict(INT, "node-b", 2, "KeyError")
    later = diagnose(ambiguous("node-c", 3), [first, decided], job="j", run_id="r1")
    assert later.rule is None and later.verdict.kind is HW  # attempt 2 already decided attempt 1's suspicion


def test_the_three_node_rule_makes_one_signature_internal_however_the_attempts_looked():
    line = "NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129"
    a, b = verdict(HW, "node-a", 1, line), verdict(HW, "node-b", 2, line)
    third = diagnose(verdict(HW, "node-c", 3, line), [a, b], job="j", run_id="r1")
    assert third.verdict.kind is INT and third.rule == ACROSS_NODES
    assert "3 different nodes (node-a, node-b, node-c)" in third.verdict.reason
    # Two nodes are not enough, nor three nodes with different signatures, nor another job's faults.
    assert diagnose(verdict(HW, "node-b", 2, line), [a], job="j", run_id="r1").verdict.kind is HW
    other = verdict(HW, "node-c", 3, "NVRM: Xid 79, GPU has fallen off the bus")
    assert diagnose(other, [a, b], job="j", run_id="r1").verdict.kind is HW
    foreign = [event("node-a", "other-job", NOW, sig=signature(a)), event("node-b", "other-job", NOW, sig=signature(a))]
    assert diagnose(verdict(HW, "node-c", 1, line), [], foreign, job="j", run_id="r2").verdict.kind is HW
    # Across runs of the same job, from the ledger.
    mine = [e.model_copy(update={"job": "j"}) for e in foreign]
    assert diagnose(verdict(HW, "node-c", 1, line), [], mine, job="j", run_id="r2").verdict.kind is INT


def test_fault_events_record_the_verdict_a_blame_and_a_clearing():
    first = suspect_node(ambiguous("node-a", 1))
    recorded = fault_events(diagnose(first, [], job="j", run_id="r1"), job="j", run_id="r1", now=NOW)
    assert [(e.node, e.kind, e.attempt) for e in recorded] == [("node-a", "SUSPECT_NODE", 1)]
    clean = diagnose(verdict(OK, "node-b", 2), [first], job="j", run_id="r1")
    blamed = fault_events(clean, job="j", run_id="r1", now=NOW)
    assert [(e.node, e.kind, e.by) for e in blamed] == [("node-a", "HARDWARE", "relocation")]
    same = diagnose(suspect_node(ambiguous("node-b", 2, pid=1)), [first], job="j", run_id="r1")
    assert [(e.node, e.kind) for e in fault_events(same, job="j", run_id="r1", now=NOW)] == [("node-a", CLEARED)]
    assert fault_events(diagnose(verdict(INT, "node-a", 1, "KeyError"), [], job="j", run_id="r1"),
                        job="j", run_id="r1", now=NOW) == []


# ---- quarantine and release ----------------------------------------------------------------------
@pytest.mark.parametrize(("events", "quarantine"), [
    pytest.param([event("n1", "job-a", NOW - 100), event("n1", "job-b", NOW - 50)], True, id="two-jobs-in-window"),
    pytest.param([event("n1", "job-a", NOW - 100, run="r1"), event("n1", "job-a", NOW - 50, run="r2")], False,
                 id="one-job-twice"),
    pytest.param([event("n1", "job-a", NOW - DAY - 1), event("n1", "job-b", NOW - 50)], False,
                 id="first-fault-outside-window"),
    pytest.param([event("n1", "job-a", NOW - 100), event("n2", "job-b", NOW - 50)], False, id="two-nodes"),
    pytest.param([event("n1", "job-a", NOW - 100, kind="SUSPECT_NODE"), event("n1", "job-b", NOW - 50)], True,
                 id="a-suspect-counts"),
    pytest.param([event("n1", "job-a", NOW - 100, kind="SUSPECT_NODE"), event("n1", "job-a", NOW - 90, kind=CLEARED),
                  event("n1", "job-b", NOW - 50)], False, id="a-cleared-suspect-does-not"),
])
def test_a_node_is_quarantined_by_faults_of_two_jobs_within_the_window(events, quarantine):
    health = node_health("n1", events, [], now=NOW, window=DAY)
    assert health.quarantined is quarantine
    if quarantine:
        assert health.since == NOW - 50 and health.jobs == ["job-a", "job-b"]


def test_a_release_lifts_the_quarantine_until_two_jobs_fault_again():
    events = [event("n1", "job-a", NOW - 100), event("n1", "job-b", NOW - 50)]
    assert quarantined(events, [], now=NOW, window=DAY) == ["n1"]
    release = NodeRelease(node="n1", at=NOW - 10, by="sre")
    assert quarantined(events, [release], now=NOW, window=DAY) == []
    health = node_health("n1", events, [release], now=NOW, window=DAY)
    assert health.faults == [] and health.released == release and health.summary == "healthy"
    again = [*events, event("n1", "job-c", NOW - 5), event("n1", "job-a", NOW - 1)]
    assert quarantined(again, [release], now=NOW, window=DAY) == ["n1"]


# ---- the policy ----------------------------------------------------------------------------------
def test_a_suspect_node_fails_over_once_and_the_status_says_why():
    job = parse_spec(BASE)
    suspect = suspect_node(ambiguous("node-a", 1))
    decision = decide_next(job, Plan(attempt=1), suspect, now=NOW)
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == ["node-a"]
    assert decision.why.startswith("suspect node node-a: ") and "relocating once" in decision.why
    stopped = decide_next(parse_spec({**BASE, "job_failover": False}), Plan(attempt=1), suspect, now=NOW)
    assert stopped.status is JobStatus.FAILED and "no relocation" in stopped.why
    internal = diagnose(suspect_node(ambiguous("node-b", 2, pid=3)), [suspect], job="j", run_id="r").verdict
    final = decide_next(job, Plan(attempt=2, failovers=1, exclude_nodes=["node-a"]), internal, now=NOW)
    assert final.status is JobStatus.INTERNAL_ERROR and RELOCATION in final.why and "node-a" in final.why


def test_a_suspicion_waits_through_a_planned_restart_as_through_a_preemption():
    first = suspect_node(ambiguous("node-a", 1))
    grown = Verdict(kind=VerdictKind.PLANNED_RESTART, reason="planned restart to grow back", attempt=2, node="node-b")
    after = diagnose(verdict(OK, "node-c", 3), [first, grown], job="j", run_id="r1")
    assert after.blamed == "node-a"  # the restart decided nothing of node-a
