"""The local backend places no attempt on a quarantined node (the shared pool and a workspace's slot board)."""

from __future__ import annotations

import time
import uuid

import pytest

from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.node_health import FaultEvent
from sat_tasks.io.node_ledger import NodeLedger
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.workspaces import WorkspaceStore
from sat_tasks.spec import parse_spec

BUCKET = "placement-tests"


@pytest.fixture
def ledger(s3_hook, monkeypatch, tmp_path) -> NodeLedger:
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    root = f"s3://{BUCKET}/ledger-{uuid.uuid4().hex[:8]}/"
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", root)
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    return NodeLedger(s3_hook, [root])


def quarantine(ledger: NodeLedger, node: str) -> None:
    now = time.time()
    for job, ago in (("job-a", 100), ("job-b", 50)):
        ledger.record(FaultEvent(node=node, at=now - ago, job=job, run_id="r1", kind="HARDWARE", signature="xid 79"))


def run_of(**fields) -> JobRun:
    job = parse_spec({"name": "placed-job", "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                      "data": {"source": f"s3://{BUCKET}/data/"}, "results": {"destination": f"s3://{BUCKET}/results/"},
                      "command": "python train.py", **fields})
    return JobRun(job, "manual__2026-12-01T08:00:00+00:00")


def test_the_shared_pool_skips_a_quarantined_node_until_it_is_released(ledger):
    quarantine(ledger, "local-node-0")
    lines: list[str] = []
    with attempt_nodes(run_of(), Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["local-node-1"]
    assert any("not placing on quarantined node(s) local-node-0" in line for line in lines)
    with attempt_nodes(run_of(), Plan(attempt=2, exclude_nodes=["local-node-1"]), lines.append) as nodes:
        assert nodes == ["local-node-2"]  # a failover skips both
    ledger.release("local-node-0", by="sre")
    with attempt_nodes(run_of(), Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["local-node-0"]


def test_the_slot_board_skips_a_quarantined_workspace_node(ledger):
    WorkspaceStore().create({"name": "team-q", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2099-12-31"}})
    quarantine(ledger, "team-q-node-0")
    lines: list[str] = []
    with attempt_nodes(run_of(workspace="team-q"), Plan(attempt=1), lines.append, poll_seconds=0.05) as nodes:
        assert nodes == ["team-q-node-1"]
