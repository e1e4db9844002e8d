"""The node ledger counts only what SAT read (issue 43 item 5, ADR 0004): a job that prints an Xid line
quarantines nothing; the same line in the node's kernel log counts against the node."""

from __future__ import annotations

import uuid

import pytest

from sat_tasks.classify import classify, node_evidence
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import VerdictKind
from sat_tasks.io.node_ledger import NodeLedger, diagnose_attempt
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec
from tests.support.ledger import fresh_ledger_root

BUCKET = "ledger-observed-tests"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.fixture
def root(s3_hook, monkeypatch) -> str:
    return fresh_ledger_root(s3_hook, monkeypatch, BUCKET)


def make_run(name: str) -> JobRun:
    job = parse_spec({"name": name, "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                      "data": {"source": f"s3://{BUCKET}/data/"},
                      "results": {"destination": f"s3://{BUCKET}/results/"},
                      "command": "python train.py", "job_failover": True})
    return JobRun(job, f"manual__2026-12-0{uuid.uuid4().int % 9 + 1}T08:00:00+00:00")


def record(**fields) -> AttemptRecord:
    return AttemptRecord(**{"job": "j", "attempt": 1, "backend": "kubernetes", "node": "gpu-1", "exit_code": 1,
                            **fields})


def test_node_evidence_is_what_sat_read_not_what_the_job_printed():
    printed = record(log_tail=[XID79])
    read = record(node_log=[XID79])
    assert classify(printed).kind is classify(read).kind is VerdictKind.HARDWARE  # the job's verdict stands
    assert node_evidence(printed) == [] and node_evidence(read) == [XID79]
    lost = record(exit_code=None, node_conditions=[{"type": "Ready", "status": "Unknown"}])
    assert node_evidence(lost)  # SAT saw the node go


@pytest.mark.parametrize(("where", "recorded"), [("log_tail", False), ("node_log", True)])
def test_a_printed_xid_quarantines_nothing(s3_hook, root, where, recorded):
    run = make_run(f"printed-{uuid.uuid4().hex[:6]}")
    attempt = record(job=run.job.name, **{where: [XID79]})
    run.store_record(attempt)
    lines: list[str] = []
    verdict = diagnose_attempt(run, classify(attempt).model_copy(update={"attempt": 1, "node": "gpu-1"}),
                               lines.append)
    assert verdict.kind is VerdictKind.HARDWARE  # the failover still happens: the job's own evidence
    events = NodeLedger(s3_hook, [root]).events()
    assert bool(events) is recorded, events
    if not recorded:
        assert any("rests only on what the training printed" in line for line in lines), lines
