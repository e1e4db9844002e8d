"""The local backend records its node's labels at start (`AttemptRecord.node_labels_at_start`), as the Kubernetes backend does."""

from __future__ import annotations

import pytest

from sat_tasks.backends.local.runner import LocalAttempt, local_node_labels
from sat_tasks.core.attempt import AttemptRecord


@pytest.mark.parametrize("workspace, expected", [
    pytest.param(None, {"kubernetes.io/hostname": "local-node-1"}, id="shared-pool"),
    pytest.param("team-a", {"kubernetes.io/hostname": "local-node-1", "sat.ai/workspace": "team-a"}, id="workspace"),
])
def test_local_node_labels(workspace, expected):
    assert local_node_labels("local-node-1", workspace) == expected


def test_the_record_carries_the_labels_given_at_start(tmp_path):
    (tmp_path / "code").mkdir()
    labels = local_node_labels("n1", "team-a")
    record = LocalAttempt(
        job="labels-job", attempt=1, node="n1", command="true", env={}, cwd=tmp_path / "code",
        output_dir=tmp_path / "out", job_log=tmp_path / "job.log", node_dir=tmp_path / "nodes" / "n1",
        poll_seconds=0.05, node_labels=labels,
    ).run(lambda _m: None)
    assert record.exit_code == 0 and record.node_labels_at_start == labels
    assert record.node_labels == {}  # what is read at the end: a local node has no Node object
    assert AttemptRecord.model_validate(record.model_dump(mode="json")).node_labels_at_start == labels


def test_the_launch_task_records_the_node_it_picked(s3_hook, demo_bucket, tmp_path):
    """`launch_attempt` (the local `launch` task) passes the picked node's labels; the stored record keeps them."""
    from sat_tasks.backends.local.launch import launch_attempt
    from sat_tasks.core.handoffs import Plan
    from sat_tasks.io.run_layout import JobRun
    from sat_tasks.spec import parse_spec

    job = parse_spec({
        "name": "labels-launch", "nodes": 1, "startup_timeout_seconds": 0,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        "command": "true",
    })
    run = JobRun(job, f"manual__labels-launch-{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    record = launch_attempt(run, Plan(attempt=1), lambda _m: None)
    assert record.node_labels_at_start == {"kubernetes.io/hostname": record.node}
    assert run.load_record(1).node_labels_at_start == record.node_labels_at_start
