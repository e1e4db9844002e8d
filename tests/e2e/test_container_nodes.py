"""A 2-node DDP job in container mode: two containers of SAT's training image, one per node, on the attempt's network.

Through `sat run`'s `run_job` (the job's DAG), host mode forbidden, three local nodes with one
slot each: the job holds two of them, and each attempt runs one container per node. The two
containers' torchrun agents meet on rank 0's address on the attempt's own network (gloo on CPU,
one rank per node), and both reach the run's Object Storage through their loopback. A GPU of
the first node "falls off the bus" at step 4 of attempt 1 (every rank of the attempt is
killed); attempt 2's containers run on the two nodes that did not fail, resume from the last
committed checkpoint and Complete. Each attempt's record names two containers (their ids), and
no container or network namespace of the run is left afterwards.

One attempt of a 2-node job without a fault runs in the fast suite (DDP; DeepSpeed ZeRO-2 is `slow`): 42 s
measured for the DeepSpeed one at load 2, plus the session's Object Storage and metadata DB. The failover is
`slow` (`make test-slow`): 84 s at load 2, 7 to 10 minutes on this shared 2-core machine at load 14 (two
attempts, each starting two containers that import torch and transformers: attempt 2's start phase alone
98 s). tests/sat_tasks/backends/local/test_container_nodes.py runs two nodes' containers of the Debian base
image in seconds. Needs the training image in the project's store (`make image`, which `make test` runs
first).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sat_tasks.backends.local.container_run import local_image_digest
from sat_tasks.backends.local.containers import podman, podman_installed
from sat_tasks.cli.run import run_job
from sat_tasks.spec import parse_spec, split_s3_uri

IMAGE = "registry.sat.local/sat/training:0.1.0"
SCRIPT = Path(__file__).parent / "scripts" / "elastic_ddp_train.py"
MAX_STEPS, SAVE_STEPS, FAULT_STEP = 10, 2, 4
NODES = ["local-node-0", "local-node-1", "local-node-2"]

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not podman_installed() or os.geteuid() != 0,
                       reason="podman/runc not installed (`make system-deps`) or not root"),
]


@pytest.fixture
def image() -> str:
    if local_image_digest(IMAGE) is None:
        pytest.fail(f"{IMAGE} is not in the project's image store: `make image` builds it (make test runs it)")
    return IMAGE


@pytest.fixture
def script_in_bucket(s3_hook, demo_bucket, airflow_db):
    s3_hook.load_file(filename=SCRIPT, key=f"test-scripts/{SCRIPT.name}", bucket_name=demo_bucket, replace=True)
    return f"s3://{demo_bucket}/test-scripts/{SCRIPT.name}"


@pytest.mark.slow
def test_a_two_node_ddp_job_runs_one_container_per_node_and_fails_over_to_other_nodes(
        image, script_in_bucket, s3_hook, demo_bucket, monkeypatch):
    from sat_tasks.io.run_layout import JobRun

    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "container")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_HOST_MODE", "forbidden")  # no attempt may quietly run on the host
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", ",".join(NODES))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    job = parse_spec({
        "name": "ddp-two-containers", "framework": "pytorch", "nodes": 2, "job_failover": True,
        "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "3Gi", "cpu": "1"},
        "image": {"url": image},
        "data": {"source": f"s3://{demo_bucket}/datasets/tiny-corpus/"},
        "storage": {"script_url": script_in_bucket},
        "results": {"destination": f"s3://{demo_bucket}/results/"},
        "command": (f'python {SCRIPT.name} --output_dir "$SAT_OUTPUT_DIR" --max_steps {MAX_STEPS} '
                    f"--save_steps {SAVE_STEPS} --samples 256 --step_sleep 0.2"),
        "heartbeat_timeout_seconds": 300,
        "faults": [{"kind": "hardware", "attempt": 1, "at_step": FAULT_STEP, "xid": 79}],
    })
    report = run_job(job, None, quiet=True)
    assert report is not None and report["status"] == "Completed", report and (report["history"],
                                                                               report["attempts"])
    assert report["global_step"] == MAX_STEPS
    first, second = report["attempts"]
    assert first["verdict"] == "HARDWARE" and len(first["nodes"]) == 2, first
    failed = first["node"]
    assert len(second["nodes"]) == 2 and failed not in second["nodes"], (first, second)  # other nodes
    assert second["resumed_from"] is not None and second["resumed_from"] >= SAVE_STEPS, second

    run = JobRun.of(job, "sat_training_job", report["run_id"])
    bucket, prefix = split_s3_uri(report["results"])
    log = s3_hook.read_key(prefix + "job.log", bucket_name=bucket)
    names = []
    for attempt, summary in ((1, first), (2, second)):
        record = run.load_record(attempt)
        assert record is not None
        states = record.container_states
        ids = [state["containerID"] for state in states]
        assert len(states) == 2 and all(len(i) == 64 for i in ids) and ids[0] != ids[1], states  # two containers
        assert all(state["runtime"] == "podman" and state["image"] == image for state in states), states
        assert states[1]["node"] == summary["nodes"][1], (states, summary)
        assert (f"[sat] attempt {attempt}: 2 containers, one per node, on network "
                f"sat-net-{job.name}-") in log, log[-3000:]
        names += [state["name"] for state in states]
    # the second node's output is in the one log, under its name; both ranks trained (world size 2)
    assert f"[{second['nodes'][1]}] " in log, log[-3000:]
    samples = sorted(key.rsplit("/", 1)[-1] for key in s3_hook.list_keys(
        bucket_name=bucket, prefix=prefix + "output/samples/attempt-2-rank-") or [])
    assert samples == ["attempt-2-rank-0.jsonl", "attempt-2-rank-1.jsonl"], samples
    for name in names:  # removed at each attempt's end
        assert podman(["container", "exists", name], check=False).returncode == 1
    left = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
            if f"sat-net-{job.name}".encode() in _cmdline(pid)]
    assert left == [], left  # the attempts' networks are gone with them


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize(("framework", "extra", "env"), [
    pytest.param("pytorch", "", {}, id="ddp"),
    # DeepSpeed ZeRO-2 on CPU ranks (no op builds): the ranks start through `ckpt_engine.launch` under torchrun
    pytest.param("deepspeed", " --zero_stage 2", {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}, id="deepspeed-zero2",
                 marks=pytest.mark.slow),
])
def test_a_two_node_job_runs_one_container_per_node(image, script_in_bucket, s3_hook, demo_bucket, monkeypatch,
                                                    framework, extra, env):
    """One attempt, no fault: two containers, a rank in each, one world of two; Completed."""
    from sat_tasks.io.run_layout import JobRun

    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "container")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_HOST_MODE", "forbidden")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", ",".join(NODES[:2]))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    job = parse_spec({
        "name": f"{framework}-two-containers", "framework": framework, "nodes": 2,
        "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "3Gi", "cpu": "1"},
        "image": {"url": image},
        "data": {"source": f"s3://{demo_bucket}/datasets/tiny-corpus/"},
        "storage": {"script_url": script_in_bucket},
        "results": {"destination": f"s3://{demo_bucket}/results/"},
        "command": (f'python {SCRIPT.name} --output_dir "$SAT_OUTPUT_DIR" --max_steps 4 --save_steps 2 '
                    f"--samples 256{extra}"),
        "env": env,
        "heartbeat_timeout_seconds": 300,
    })
    report = run_job(job, None, quiet=True)
    assert report is not None and report["status"] == "Completed", report and (report["history"],
                                                                               report["attempts"])
    assert report["global_step"] == 4 and len(report["attempts"]) == 1
    record = JobRun.of(job, "sat_training_job", report["run_id"]).load_record(1)
    assert record is not None and sorted(record.nodes) == NODES[:2]
    ids = [state["containerID"] for state in record.container_states]
    assert len(ids) == 2 and all(len(i) == 64 for i in ids) and ids[0] != ids[1], record.container_states
    bucket, prefix = split_s3_uri(report["results"])
    log = s3_hook.read_key(prefix + "job.log", bucket_name=bucket)
    assert f"[sat] attempt 1: 2 containers, one per node, on network sat-net-{framework}-two-containers-" in log
    keys = sorted(s3_hook.list_keys(bucket_name=bucket, prefix=prefix + "output/samples/attempt-1-rank-") or [])
    assert [key.rsplit("/", 1)[-1] for key in keys] == ["attempt-1-rank-0.jsonl", "attempt-1-rank-1.jsonl"], keys
    for key in keys:  # a rank in each container, one world of two
        first = json.loads(s3_hook.read_key(key, bucket_name=bucket).splitlines()[0])
        assert first["world"] == 2, first
