"""The node health ledger against the embedded S3 server: one object per event, releases, the classify hook."""

from __future__ import annotations

import uuid

import pytest

from sat_tasks.core.handoffs import Verdict, VerdictKind
from sat_tasks.core.node_health import FaultEvent
from sat_tasks.core.status import JobStatus
from sat_tasks.io.node_ledger import NodeLedger, diagnose_attempt, ledger_root, quarantined_nodes
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

BUCKET = "ledger-tests"
NOW, DAY = 1_800_000_000.0, 86_400.0
XID68 = "[ {t}] NVRM: Xid (PCI:0000:3b:00): 68, pid={pid}, name=python, NVDEC0 Exception"


@pytest.fixture(scope="module")
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    return BUCKET


@pytest.fixture
def root(bucket, monkeypatch) -> str:
    uri = f"s3://{bucket}/ledger-{uuid.uuid4().hex[:8]}/"
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", uri)
    return uri


def event(node: str, job: str, at: float, **fields) -> FaultEvent:
    return FaultEvent(**{"node": node, "at": at, "job": job, "run_id": "manual__2026-12-01T08:00:00+00:00",
                         "attempt": 1, "kind": "HARDWARE", "signature": "xid 79", **fields})


def make_job(name: str):
    return parse_spec({"name": name, "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                       "data": {"source": f"s3://{BUCKET}/data/"}, "results": {"destination": f"s3://{BUCKET}/results/"},
                       "command": "python train.py", "job_failover": True})


def test_each_event_is_its_own_object_and_two_jobs_quarantine_a_node(s3_hook, root):
    ledger = NodeLedger(s3_hook, [root])
    first = ledger.record(event("gpu-1", "job-a", NOW - 100))
    second = ledger.record(event("gpu-1", "job-b", NOW - 50, attempt=2))
    ledger.record(event("gpu-2", "job-a", NOW - 40))
    assert first != second and first.startswith(root + "nodes/gpu-1/events/")
    assert [e.job for e in ledger.events()] == ["job-a", "job-b", "job-a"]
    assert ledger.quarantined(now=NOW, window=DAY) == ["gpu-1"]
    health = ledger.health(now=NOW, window=DAY)
    assert [(h.node, h.quarantined) for h in health] == [("gpu-1", True), ("gpu-2", False)]
    # Events older than the window are not even read (the key carries the time).
    assert ledger.events(since=NOW - 60) == [e for e in ledger.events() if e.at >= NOW - 60]


def test_a_release_is_written_under_every_root_and_lifts_the_quarantine(s3_hook, root, bucket):
    other = f"s3://{bucket}/other-{uuid.uuid4().hex[:8]}/"
    ledger = NodeLedger(s3_hook, [root, other])
    ledger.record(event("gpu-1", "job-a", NOW - 100))
    NodeLedger(s3_hook, [other]).record(event("gpu-1", "job-b", NOW - 50))  # another destination's job
    assert ledger.quarantined(now=NOW, window=DAY) == ["gpu-1"]
    marker = ledger.release("gpu-1", by="sre", note="reseated the GPU", now=NOW - 10)
    assert marker.by == "sre"
    for where in (root, other):
        assert [r.note for r in NodeLedger(s3_hook, [where]).releases()] == ["reseated the GPU"]
    assert ledger.quarantined(now=NOW, window=DAY) == []


def test_the_default_root_is_under_the_results_destination(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", "")
    assert ledger_root(make_job("rooted")) == f"s3://{BUCKET}/results/_node-health/"


def test_placement_reads_the_quarantine_and_goes_on_without_a_ledger(s3_hook, root, monkeypatch):
    ledger = NodeLedger(s3_hook, [root])
    ledger.record(event("gpu-1", "job-a", __import__("time").time() - 100))
    ledger.record(event("gpu-1", "job-b", __import__("time").time() - 50))
    lines: list[str] = []
    assert quarantined_nodes(make_job("placed"), s3_hook, lines.append) == ["gpu-1"]
    assert "not placing on quarantined node(s) gpu-1" in lines[-1]
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", "s3://no-such-bucket-here/ledger/")
    assert quarantined_nodes(make_job("placed"), s3_hook, lines.append) == []
    assert "could not read the ledger" in lines[-1]


def test_the_classify_hook_relocates_records_and_writes_the_history(s3_hook, root):
    job = make_job(f"hook-{uuid.uuid4().hex[:6]}")
    run = JobRun(job, "manual__2026-12-01T08:00:00+00:00")
    run.history(lambda _: None).record(JobStatus.RUNNING, "attempt 1 started on node-a", attempt=1)
    lines: list[str] = []
    ambiguous = Verdict(kind=VerdictKind.HARDWARE, evidence=[XID68.format(t="4417.1", pid=4242)], node="node-a",
                        attempt=1, reason="ambiguous: Xid 68: NVDEC exception. Chose HARDWARE: ...")
    first = diagnose_attempt(run, ambiguous, lines.append)
    assert first.kind is VerdictKind.SUSPECT_NODE
    run.store_verdict(first)
    ledger = NodeLedger(s3_hook, [root])
    assert [(e.node, e.kind) for e in ledger.events()] == [("node-a", "SUSPECT_NODE")]

    clean = Verdict(kind=VerdictKind.SUCCEEDED, evidence=["exit code 0"], reason="the training exited with code 0",
                    node="node-b", attempt=2)
    second = diagnose_attempt(run, clean, lines.append)
    assert second.kind is VerdictKind.SUCCEEDED and "node-a is blamed" in second.reason
    assert [(e.node, e.kind, e.by) for e in ledger.events()][-1] == ("node-a", "HARDWARE", "relocation")
    last = run.history().entries()[-1]
    assert last["status"] == "Running" and last["reason"].startswith("relocation: attempt 2 ran clean on node-b")
    assert last["task"] == "classify"


def test_the_classify_hook_finds_the_same_failure_on_the_second_node_internal(s3_hook, root):
    job = make_job(f"same-{uuid.uuid4().hex[:6]}")
    run = JobRun(job, "manual__2026-12-01T09:00:00+00:00")
    lines: list[str] = []
    for attempt, node, pid in ((1, "node-a", 4242), (2, "node-b", 77)):
        verdict = diagnose_attempt(run, Verdict(
            kind=VerdictKind.HARDWARE, evidence=[XID68.format(t=f"{attempt}.5", pid=pid)], node=node, attempt=attempt,
            reason="ambiguous: Xid 68: NVDEC exception."), lines.append)
        run.store_verdict(verdict)
    assert verdict.kind is VerdictKind.INTERNAL
    assert "failed the same way on node-a (attempt 1) and node-b (attempt 2)" in verdict.reason
    kinds = [(e.node, e.kind) for e in NodeLedger(s3_hook, [root]).events()]
    assert kinds == [("node-a", "SUSPECT_NODE"), ("node-a", "CLEARED")]  # node-b: nothing against it
