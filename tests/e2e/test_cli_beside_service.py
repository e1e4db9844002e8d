"""Operator commands run beside the running service, in its Airflow home, as a person's shell runs them (issue 45.3).

One light deployment for the module (SQLite, no DAGs, free loopback ports, a temporary home):
`sat nodes ls`, `sat nodes release NODE`, `sat warm-pool list` and `sat report s3://...` run as
subprocesses with nothing but `AIRFLOW_HOME` from Airflow's variables, and reach the
deployment's Object Storage with its keys (`service.stack.running_env`), as its components do.
Without a deployment they say so in one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sat_tasks.io.local_s3 import free_port
from sat_tasks.service.secrets import SECRETS_FILE
from sat_tasks.service.stack import ServiceStack
from tests.support.paths import REPO

BUCKET = "sat-demo"
LEDGER = f"s3://{BUCKET}/cli-ledger/"
WARM = f"s3://{BUCKET}/cli-warm/"
RESULTS = f"s3://{BUCKET}/results/sat_training_job/cli-job/manual__1/"
NODE = "node-7"
COMMAND_TIMEOUT = 300  # seconds one command may take on a busy 2-core machine (a bound, not a wait)
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The stack as `sat up` starts it, light: SQLite, an empty DAG folder, the ledger and warm pool under roots of
    their own (SAT settings the CLI must take from the deployment too)."""
    root = tmp_path_factory.mktemp("cli-beside")
    (root / "dags").mkdir()
    (root / "jobs").mkdir()
    stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=root / "object-storage", dags_folder=root / "dags", jobs_dir=root / "jobs",
                         work_dir=root / "work", db="sqlite",
                         extra_env={"AIRFLOW__SAT__WORKSPACES_DIR": str(root / "workspaces"),
                                    "AIRFLOW__SAT__NODE_LEDGER_URI": LEDGER, "AIRFLOW__SAT__WARM_POOL_URI": WARM,
                                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30"},
                         log=lambda _line: None)
    stack.start(timeout=600)
    try:
        _seed(stack)
        yield stack
    finally:
        stack.stop(grace=30)


def _seed(stack: ServiceStack) -> None:
    """A node with faults of two jobs (quarantined), a warm state, and a run's metrics, in the deployment's storage."""
    from sat_tasks.core.node_health import FaultEvent
    from sat_tasks.core.warm_pool import WarmState
    from sat_tasks.io.node_ledger import NodeLedger
    from sat_tasks.io.object_storage import write_json
    from sat_tasks.io.object_storage_hook import new_hook

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_SAT_OBJECT_STORAGE_CLI_TEST", json.dumps(stack.storage.connection()))
        hook = new_hook("sat_object_storage_cli_test")
        ledger = NodeLedger(hook, [LEDGER])
        now = time.time()
        for n, job in enumerate(("job-a", "job-b")):
            ledger.record(FaultEvent(node=NODE, at=now - 60 + n, job=job, run_id=f"manual__{n}", attempt=1,
                                     kind="HARDWARE", signature="Xid 79", reason="GPU fell off the bus"))
        write_json(hook, f"{WARM}-/warm-job.json", WarmState(
            job="warm-job", backend="local", run_id="manual__9", kept_at=now, expires_at=now + 3600,
            spec_hash="h", data_source=f"s3://{BUCKET}/datasets/tiny-corpus/").model_dump(mode="json"))
        lines = [{"time": now + i, "series": "training", "step": i, "loss": 2.0 - i / 10} for i in range(1, 4)]
        hook.load_string("".join(json.dumps(line) + "\n" for line in lines),
                         key=RESULTS[len(f"s3://{BUCKET}/"):] + "metrics/attempt-1/node-a/training.jsonl",
                         bucket_name=BUCKET, replace=True)


def _shell_env(home: Path) -> dict[str, str]:
    """A person's shell in the clone: no Airflow variables but the home the deployment uses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(home)
    return env


def _sat(home: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sat_tasks.cli", *args], env=_shell_env(home), cwd=cwd,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)


def _secret(stack: ServiceStack) -> str:
    return json.loads((stack.home / SECRETS_FILE).read_text())["object_storage_secret"]


def test_sat_nodes_ls_and_release_reach_the_deployments_ledger(deployment):
    listed = _sat(deployment.home, "nodes", "ls")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"{NODE}  quarantined" in listed.stdout and "job-a" in listed.stdout and "job-b" in listed.stdout
    assert "1 quarantined node(s)" in listed.stdout, listed.stdout
    as_json = _sat(deployment.home, "nodes", "ls", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert [(n["node"], n["quarantined"]) for n in json.loads(as_json.stdout)["nodes"]] == [(NODE, True)]
    released = _sat(deployment.home, "nodes", "release", NODE, "--note", "reseated the GPU")
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"released {NODE}" in released.stdout
    after = _sat(deployment.home, "nodes", "ls")
    assert after.returncode == 0 and "0 quarantined node(s)" in after.stdout, after.stdout + after.stderr
    assert "reseated the GPU" in after.stdout
    for out in (listed, as_json, released, after):
        assert "Traceback" not in out.stderr and _secret(deployment) not in out.stdout + out.stderr


def test_sat_warm_pool_list_reads_the_deployments_warm_pool(deployment):
    listed = _sat(deployment.home, "warm-pool", "list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "warm-job" in listed.stdout and "run manual__9" in listed.stdout and "1 warm state(s)" in listed.stdout
    assert "Traceback" not in listed.stderr and _secret(deployment) not in listed.stdout + listed.stderr


def test_sat_report_renders_a_run_in_the_deployments_storage(deployment, tmp_path):
    page = tmp_path / "report.html"
    made = _sat(deployment.home, "report", RESULTS, "-o", str(page))
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"wrote {page} (1 series file(s), 0 problem(s))" in made.stdout
    assert "cli-job / manual__1" in page.read_text(encoding="utf-8")
    assert "Traceback" not in made.stderr and _secret(deployment) not in made.stdout + made.stderr


@pytest.mark.parametrize("args", [("nodes", "ls"), ("nodes", "release", NODE), ("warm-pool", "list"),
                                  ("report", RESULTS)], ids=lambda args: " ".join(args[:2]))
def test_without_a_deployment_each_says_so_in_one_line(tmp_path, args):
    done = _sat(tmp_path / "home", *args, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no `sat up` runs in" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"sat {args[0]}")
