"""A workspace job through the local `launch` (real run layout, embedded S3), and end to end (dag.test(), slow).

End to end: failover stays inside the workspace and says when it cannot.

A 1-node workspace; a 1-node job whose first attempt hits a hardware fault on the
workspace's node. The failover may not leave the workspace, and its only node is excluded:
attempt 2's status says `Pending - failoverinprogress` with why, until the wait deadline
ends the job. (That a failover takes another node of the workspace when there is one, and
waits for one another job holds, is tested on the slot board: test_store_and_queue.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sat_tasks.cli.run import run_job
from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore
from sat_tasks.spec import parse_spec

FAKE_TRAIN = Path(__file__).parents[2] / "e2e" / "scripts" / "fake_train.py"


@pytest.fixture
def workspace(s3_hook, demo_bucket, airflow_db, tmp_path, monkeypatch):
    s3_hook.load_file(filename=FAKE_TRAIN, key="test-scripts/fake_train.py", bucket_name=demo_bucket, replace=True)
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "2")
    return WorkspaceStore().create({"name": "e2e-team", "nodes": 1,
                                    "contract": {"start": "2026-01-01", "end": "2099-12-31"}})


# ~70 s of dag.test() (15 tasks) on the 2-core machine: past the workspace tests' share of `make test`;
# the pieces it wires are unit-tested (test_store_and_queue.py). `make test-slow` runs it.
@pytest.mark.slow
def test_a_failover_without_a_healthy_node_in_its_workspace_says_so_until_the_deadline(workspace):
    faults = [{"kind": "hardware", "attempt": 1, "at_step": 3, "xid": 79}]
    job = parse_spec({
        "name": "e2e-workspace", "workspace": "e2e-team", "job_failover": True, "nodes": 1,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "storage": {"script_url": "s3://sat-demo/test-scripts/fake_train.py"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": "python fake_train.py", "faults": faults, "heartbeat_timeout_seconds": 20, "max_failovers": 1,
        # 400 steps: on a loaded machine the launcher's poll may come late; the fault must still find training running
        "env": {"FAKE_STEPS": "400", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05"},
    })
    report = run_job(job, None, quiet=True)
    assert report is not None, "no job report written"
    assert [a["node"] for a in report["attempts"]] == ["e2e-team-node-0"]
    history = [(entry["status"], entry["reason"]) for entry in report["history"]]
    waiting = [reason for status, reason in history if status == "Pending - failoverinprogress"
               and "too few healthy nodes" in reason]
    assert waiting and "1 of them excluded after failed attempts (e2e-team-node-0)" in waiting[0]
    assert report["status"] == "Failed"
    assert "[sat] workspace_wait_seconds" in history[-1][1] or any(
        "[sat] workspace_wait_seconds" in reason for status, reason in history if status == "Failed")
    assert SlotBoard("e2e-team").uses() == []  # every attempt gave its node back


def test_the_local_launch_runs_on_its_workspaces_node_and_gives_it_back(s3_hook, demo_bucket, tmp_path, monkeypatch):
    """What the `launch` task calls (`launch_attempt`), with a real run layout: the node, the status, the release."""
    from sat_tasks.backends.local.launch import launch_attempt
    from sat_tasks.core.handoffs import Plan
    from sat_tasks.io.run_layout import JobRun

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    WorkspaceStore().create({"name": "launch-team", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2099-12-31"}})
    job = parse_spec({
        "name": "ws-launch", "workspace": "launch-team", "nodes": 1, "startup_timeout_seconds": 0,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        "command": 'echo "on $SAT_NODE"',
    })
    run = JobRun(job, f"manual__ws-launch-{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    record = launch_attempt(run, Plan(attempt=2, exclude_nodes=["launch-team-node-0"], failovers=1), lines.append)
    assert record.exit_code == 0 and record.node == "launch-team-node-1"
    assert "on launch-team-node-1" in lines
    assert run.history().entries()[-1]["reason"] == "attempt 2 started on launch-team-node-1"
    assert SlotBoard("launch-team").uses() == []


def test_a_workspace_job_taking_a_node_releases_another_jobs_warm_state_there(s3_hook, demo_bucket, tmp_path,
                                                                              monkeypatch):
    """The workspace needs the node: the warm run of another job kept there goes; one on a node not taken stays."""
    import time

    from sat_tasks.backends.local.launch import launch_attempt
    from sat_tasks.core.handoffs import Plan
    from sat_tasks.io import warm_pool
    from sat_tasks.io.run_layout import JobRun

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    WorkspaceStore().create({"name": "warm-team", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2099-12-31"}})

    def spec(name):
        return parse_spec({
            "name": name, "workspace": "warm-team", "nodes": 1, "startup_timeout_seconds": 0,
            "image": {"url": "registry.sat.local/sat/training:0.1.0"},
            "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
            "results": {"destination": "s3://sat-demo/results/"}, "command": 'echo "on $SAT_NODE"',
        })

    store = warm_pool.WarmPoolStore(s3_hook)
    for other, node in (("warm-other", "warm-team-node-1"), ("warm-third", "warm-team-node-0")):
        store.save(spec(other), warm_pool.WarmState(
            job=other, workspace="warm-team", backend="local", run_id="r0", kept_at=time.time(),
            expires_at=time.time() + 600, spec_hash="x", data_source="s3://sat-demo/datasets/tiny-corpus/",
            nodes=[node]))
    job = spec("warm-taker")
    run = JobRun(job, f"manual__warm-taker-{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    record = launch_attempt(run, Plan(attempt=2, exclude_nodes=["warm-team-node-0"], failovers=1), lines.append)
    assert record.exit_code == 0 and record.node == "warm-team-node-1"
    assert ("warm pool: workspace warm-team: warm-taker took warm-team-node-1; releasing warm-other's warm state"
            in lines), lines
    left = {s.job for _, s in store.states(warm_pool.warm_root(job)) if s.workspace == "warm-team"}
    assert left == {"warm-third"}
    store.delete(spec("warm-third"))
