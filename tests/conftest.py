"""Test set-up: a throwaway Airflow home and metadata DB, the embedded S3 server, marker skips."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="sat-test-airflow-"))

# Before anything imports Airflow: a private AIRFLOW_HOME, the project's config, and
# overrides for the paths that airflow.cfg derives from AIRFLOW_HOME.
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW_CONFIG"] = str(ROOT / "airflow.cfg")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__SAT__WORK_DIR"] = str(_HOME / "work")
os.environ["AIRFLOW__SAT__JOBS_DIR"] = str(ROOT / "include" / "jobs")
os.environ["AIRFLOW__SAT__BACKEND"] = "local"
# Unit and DAG tests run attempts on the host (the container runtime's own tests, and the service tests that
# run a deployment as `make up` does, choose `container`).
os.environ["AIRFLOW__SAT__LOCAL_RUNTIME"] = "host"
os.environ["AIRFLOW__SAT__FINAL_CHECKPOINT_GRACE_SECONDS"] = "20"
# The in-memory API server has no kubelet unless a test gives it one: a suspect node's probe pod stays Pending,
# and the health check gives up after this long instead of a minute (tests/sat_tasks/backends/kubernetes/test_probe.py
# holds the probe to its 60 s default).
os.environ["AIRFLOW__SAT__K8S_PROBE_START_SECONDS"] = "1"
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# The longest test files, longest first (seconds per file in CI runs 13 and 14, `--durations=0`).
# `make test` hands whole files to its workers (`--dist loadfile --no-loadscope-reorder`) in
# collection order, so these go first and the many short files fill in around them; last, one
# of them would run alone at the end.
LONGEST_FIRST = (
    "tests/e2e/test_service.py",  # ~600-800 s: the service stack, the demo job under the scheduler, a browser
    "tests/e2e/test_job_dags.py",  # ~410-690 s
    "tests/ckpt_engine/test_ckpt_multirank.py",  # ~440-500 s
    "tests/ckpt_engine/test_ckpt_hf.py",  # ~270 s
    "tests/e2e/test_demo_job.py",  # ~80-240 s
    "tests/e2e/test_node_health.py",  # ~60 s: two jobs meet a bad node (relocation, quarantine, release)
    "tests/sat_tasks/backends/local/test_runner.py",  # ~170 s
    "tests/sat_tasks/backends/local/test_deferred_launch.py",  # ~60-130 s: two dag.test() runs, detached processes
    "tests/sat_tasks/backends/kubernetes/test_launch_and_records.py",
    "tests/harness/test_user_repo.py",
    "tests/sat_tasks/backends/kubernetes/test_pods.py",
    "tests/ckpt_engine/test_ckpt_deepspeed_datastates.py",
    "tests/ckpt_engine/test_ckpt_mirror.py",
    "tests/sat_tasks/ui/test_api.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: each file's tests keep their order); gpu and k8s
    tests are reported as skipped where there is no GPU or cluster."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
    has_kube = bool(os.environ.get("KUBECONFIG"))
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_gpu = False
    for item in items:
        if "k8s" in item.keywords and not has_kube:
            item.add_marker(pytest.mark.skip(reason="needs a live cluster: set KUBECONFIG"))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


_sleep = time.sleep


def _sleep_shorter_in_dag_test(seconds: float) -> None:
    """`time.sleep`, except that Airflow's `dag.test()` loop waits 0.2 s where it waits 1 s.

    The loop sleeps 1 s whenever no task is ready to run, and each layer of an unneeded
    attempt group's skipped tasks costs such an idle turn (about 3 s per group; five groups
    when the generic DAG's first attempt is its last). Only a sleep called from that loop
    itself (`DAG.test` in airflow/sdk/definitions/dag.py) is shortened: what it schedules,
    and in which order, does not change, and every other sleep (tasks, SAT's own polls) is
    as long as asked. (0.2 s, not less: each idle turn queries the metadata DB, on the same
    two cores as the other worker.) The service e2e runs a real scheduler and is untouched.
    """
    caller = sys._getframe(1).f_code
    if caller.co_name == "test" and caller.co_filename.endswith(os.path.join("sdk", "definitions", "dag.py")):
        seconds = min(seconds, 0.2)
    _sleep(seconds)


@pytest.fixture(scope="session", autouse=True)
def _shorter_dag_test_idle_turns():
    time.sleep = _sleep_shorter_in_dag_test
    yield
    time.sleep = _sleep


@pytest.fixture(autouse=True)
def _own_node_health_ledger(monkeypatch):
    """Each test its own node health ledger (ADR 0004): the session's S3 server is shared by every test
    of a worker, and the hardware faults one test injects on `local-node-0` must not quarantine it for
    the next. A test that needs two jobs to meet in one ledger runs them inside itself."""
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", f"s3://sat-demo/_node-health/{os.urandom(6).hex()}/")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata DB in the session's Airflow home (migrated once: `sat run`'s own
    check, `ensure_metadata_db`, finds its stamp and does not migrate it a second time)."""
    from sat_tasks.cli.common import ensure_metadata_db

    ensure_metadata_db(say=lambda _line: None)
    return _HOME / "airflow.db"


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the session, exported as the sat_object_storage connection."""
    from sat_tasks.io.local_s3 import LocalS3Server

    server = LocalS3Server().start()
    previous = {k: os.environ.get(k) for k in server.connection_env()}
    os.environ.update(server.connection_env())
    yield server
    server.stop()
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def s3_hook(s3_server):
    """An S3Hook on the session's S3 server."""
    from sat_tasks.io.object_storage import object_storage_hook

    return object_storage_hook()


@pytest.fixture(scope="session")
def demo_bucket(s3_hook):
    """The demo bucket seeded with the shipped corpus and scripts."""
    from sat_tasks.io.local_s3 import DEMO_BUCKET, seed_demo_bucket

    seed_demo_bucket(s3_hook)
    return DEMO_BUCKET
