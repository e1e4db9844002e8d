"""The local launcher records the nodes an elastic attempt holds on its Running entry (ADR 0029), as numbers."""

from __future__ import annotations

import pytest

from sat_tasks.backends.local.launch import launch_attempt
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.run_summary import summarize_history
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

SPEC = {"name": "elastic-history", "job_failover": True, "nodes": 2,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        # not `python ...` (that runs under torchrun, one rank per node): as written, quick
        "command": "SAT_TEST=1 python fake_train.py"}


@pytest.fixture
def two_local_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "local-node-0,local-node-1")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "30")


def _run(spec: dict, tmp_path) -> JobRun:
    run = JobRun(parse_spec(spec).with_backend("local"), f"manual__{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    (run.code_dir / "fake_train.py").write_text("print('ran')\n")
    return run


def test_an_elastic_attempt_records_the_nodes_it_holds_and_the_shrunk_one_fewer(s3_hook, demo_bucket, tmp_path,
                                                                                 two_local_nodes):
    run = _run({**SPEC, "elastic": {"min_nodes": 1, "wait_seconds": 0}}, tmp_path)
    assert launch_attempt(run, Plan(attempt=1), lambda _m: None).exit_code == 0
    shrunk = launch_attempt(run, Plan(attempt=2, exclude_nodes=["local-node-0"], failovers=1), lambda _m: None)
    assert shrunk.nodes == ["local-node-1"]
    starts = [e for e in run.history().entries() if e.get("task") == "launch" and e["status"] == "Running"]
    assert [(e["attempt"], e["nodes_held"], e["nodes"]) for e in starts] == [(1, 2, 2), (2, 1, 2)]
    assert summarize_history(run.history().entries()).running_short_nodes == 1  # attempt 2 holds one of two


def test_a_job_without_elastic_records_no_node_counts(s3_hook, demo_bucket, tmp_path, two_local_nodes):
    """The local backend gives it one slot whatever its `nodes`: that is no shortfall, so nothing is recorded."""
    run = _run(SPEC, tmp_path)
    launch_attempt(run, Plan(attempt=1), lambda _m: None)
    (start,) = [e for e in run.history().entries() if e.get("task") == "launch" and e["status"] == "Running"]
    assert "nodes_held" not in start and "nodes" not in start
