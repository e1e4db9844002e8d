"""A burst of 50 submissions through the REST API under `make up`'s defaults, the DAG processor killed mid-burst (issue 48).

`sat up` as `make up` runs it (no --db: its private PostgreSQL; the embedded registry where it is installed; the
local pool and Airflow's concurrency as sized at start; `[sat] local_runtime` as shipped), on free loopback ports in a
temporary home. Fifty runs of the generic `sat_training_job` DAG, each the project's smallest job
(tests/e2e/scripts/fake_train.py: 20 steps of 0.05 s, a checkpoint every 5), are triggered at once through the
official client (`apache-airflow-client`) from as many threads as its connection pool takes, and every HTTP status
is recorded. Once the first answers are in, the DAG processor is killed (SIGKILL to its process group, as the OOM
killer ends it) while the rest of the burst is still being answered and scheduled; `sat up` logs its restart. Then
every run must reach a final state: no answer was a 5xx (the submissions and the polls after them), every run that
was accepted exists and ended Completed, the DAG processor was restarted once, the service is still up, and the
scheduler, slowed by the burst, never took itself for dead (at Airflow's 30 s `scheduler_health_check_threshold` it
did, twice in a run, and reset its own running tasks, a launch among them: `service.concurrency.scheduler_env`).

Before PostgreSQL became `make up`'s default and the components were supervised (issue 48.2), 20-30 submissions at
once on SQLite took the service down 3 times of 3.

Slow (`make test-slow`, not `make test`): fifty runs of a handful of task processes each, on the two cores of CI,
take 10-25 minutes. Needs PostgreSQL's server (`make system-deps`).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import urllib3

from sat_tasks.config import PROJECT_ROOT
from sat_tasks.io.local_s3 import DEMO_BUCKET, free_port, state_file_name
from sat_tasks.service.postgres import cluster_dir
from sat_tasks.service.secrets import load_or_create
from sat_tasks.service.stack import processes_of
from tests.e2e.test_service import _fast_spec, _token, _wait_for_dags
from tests.e2e.test_service_supervision import _component_pid, _until
from tests.support.paths import REPO

RUNS = 50
THREADS = 16  # the client's connection pool is sized to match: none of them waits for a connection
KILL_AFTER = 10  # answers in before the DAG processor is killed: the rest of the burst is still in flight
DEADLINE = 3600  # seconds all fifty runs together may take on a busy 2-core machine (a bound, not a wait)
FINAL = ("success", "failed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE + 1500)]  # the start and the stop come on top

RESTARTED = re.compile(r"\[sat\] restarted the dag-processor \(pid (\d+), restart 1\)")
EXITED = re.compile(r"\[sat\] the dag-processor exited with status -9 \(1 in the last \d+s\): restarting it[^\n]*")


@pytest.fixture
def service(tmp_path):
    """`sat up` with `make up`'s defaults in a temporary home; `sat down` after the test (it must stop everything)."""
    home, port = tmp_path / "home", free_port()
    storage = tmp_path / "object-storage"
    # The smallest job's script, kept as the embedded Object Storage keeps objects: `sat up` restores it at start.
    (storage / DEMO_BUCKET).mkdir(parents=True)
    shutil.copy(REPO / "tests" / "e2e" / "scripts" / "fake_train.py",
                storage / DEMO_BUCKET / state_file_name("scripts/fake_train.py"))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "SAT_PORT": str(port), "SAT_STORAGE_PORT": str(free_port()),
           "SAT_STORAGE_DIR": str(storage)}
    env.pop("SAT_DB", None)  # the default, as `make up` runs it
    sat = str(Path(sys.executable).with_name("sat"))
    # `make up`'s work dir is the project's: the burst's runs under a job name of their own, removed afterwards
    job = f"svc-burst-{secrets.token_hex(3)}"
    work = PROJECT_ROOT / ".sat" / "work" / "sat_training_job" / job
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        up = subprocess.Popen([sat, "up"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _until("SAT is up", lambda: "SAT is up" in log.read_text() or up.poll() is not None, 900, log)
        assert up.poll() is None, log.read_text()
        assert "[sat] metadata DB: PostgreSQL" in log.read_text(), log.read_text()
        yield {"home": home, "url": f"http://127.0.0.1:{port}", "up": up, "log": log, "job": job}
    finally:
        down = subprocess.run([sat, "down"], env=env, capture_output=True, text=True, timeout=300, check=False)
        shutil.rmtree(cluster_dir(home), ignore_errors=True)  # outside the temporary home when run as root
        shutil.rmtree(work, ignore_errors=True)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr + log.read_text()[-4000:]
    assert up.wait(timeout=60) == 0, log.read_text()[-4000:]
    assert processes_of(home) == []


def burst(api, conf: dict, *, runs: int = RUNS, threads: int = THREADS, answered: threading.Event | None = None,
          after: int = KILL_AFTER) -> list[dict]:
    """Trigger `runs` runs of `sat_training_job` at once from `threads` threads; each answer: index, run id, HTTP
    status (None: no answer), seconds, error. `answered` is set once `after` answers are in.

    Also what `tests/benchmarks/bench_service.py --burst N` measures."""
    from airflow_client.client import TriggerDAGRunPostBody
    from airflow_client.client.api.dag_run_api import DagRunApi
    from airflow_client.client.exceptions import ApiException

    dag_runs, count, lock = DagRunApi(api), [0], threading.Lock()

    def submit(index: int) -> dict:
        run_id = f"burst-{index:02d}"
        began = time.monotonic()
        answer = {"index": index, "run_id": run_id, "status": None, "error": None}
        try:
            reply = dag_runs.trigger_dag_run_with_http_info("sat_training_job", TriggerDAGRunPostBody(
                dag_run_id=run_id, logical_date=None, conf=conf))
            answer["status"] = reply.status_code
        except ApiException as exc:
            answer["status"], answer["error"] = exc.status, f"{exc.reason}: {str(exc.body)[:300]}"
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # no answer at all (refused, reset): it was down
            answer["error"] = f"{type(exc).__name__}: {exc}"
        answer["seconds"] = time.monotonic() - began
        with lock:
            count[0] += 1
            if answered is not None and count[0] >= after:
                answered.set()
        return answer

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(submit, range(runs)))


def figures(answers: list[dict]) -> dict:
    """A burst's figures: how many answers of each HTTP status (None: no answer), the submission latency's p50 and
    p95 (nearest rank, seconds), and how many were server errors (a 5xx, or no answer)."""
    latencies = sorted(a["seconds"] for a in answers)

    def rank(q: float) -> float:
        return latencies[max(0, math.ceil(q * len(latencies)) - 1)]

    statuses = Counter(a["status"] for a in answers)
    return {"statuses": dict(sorted(statuses.items(), key=str)), "p50_s": rank(0.5), "p95_s": rank(0.95),
            "server_errors": sum(n for status, n in statuses.items() if status is None or status >= 500)}


def states_of(api, polls: list[int]) -> dict[str, str]:
    """The burst's runs and their Airflow states; each poll's HTTP status noted (0: no answer)."""
    from airflow_client.client.api.dag_run_api import DagRunApi
    from airflow_client.client.exceptions import ApiException

    try:
        reply = DagRunApi(api).get_dag_runs_with_http_info("sat_training_job", limit=100, order_by=["id"])
    except ApiException as exc:
        polls.append(exc.status or 0)
        return {}
    except (urllib3.exceptions.HTTPError, OSError):  # no answer: counted, and the next poll tries again
        polls.append(0)
        return {}
    polls.append(reply.status_code)
    return {run.dag_run_id: str(run.state.value if hasattr(run.state, "value") else run.state)
            for run in reply.data.dag_runs if run.dag_run_id.startswith("burst-")}


def test_a_burst_of_50_submissions_with_the_dag_processor_killed_completes_with_no_5xx(service):
    import airflow_client.client as airflow_client

    home, url, up, log = service["home"], service["url"], service["up"], service["log"]
    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.spec import parse_spec

    conf = params_from_spec(parse_spec(_fast_spec(service["job"])))
    config = airflow_client.Configuration(host=url, access_token=_token(url, load_or_create(home).admin_password))
    config.connection_pool_maxsize = THREADS
    with airflow_client.ApiClient(config) as api:
        _wait_for_dags(api, ["sat_training_job"], deadline=time.monotonic() + 600)
        processor = _until("the DAG processor's process", lambda: _component_pid(home, "dag-processor"), 120, log)

        answered = threading.Event()
        began = time.monotonic()
        answers: list[dict] = []
        submitter = threading.Thread(target=lambda: answers.extend(burst(api, conf, answered=answered)))
        submitter.start()
        assert answered.wait(timeout=600), "no answers to the burst"
        os.killpg(processor, signal.SIGKILL)
        killed = time.monotonic() - began
        submitter.join(timeout=900)
        assert not submitter.is_alive(), "the burst's submissions did not all return"
        submitted_s = time.monotonic() - began

        # The supervisor restarts the DAG processor (its log line), with a pid of its own.
        restart = _until("the DAG processor's restart", lambda: RESTARTED.search(log.read_text()), 300, log)
        assert int(restart.group(1)) != processor
        exited = EXITED.search(log.read_text())
        assert exited, log.read_text()[-4000:]

        # Every run reaches a final state (success or failed), or the deadline fails the test.
        polls: list[int] = []
        accepted = {a["run_id"] for a in answers if a["status"] == 200}
        deadline = began + DEADLINE
        states: dict[str, str] = {}
        while True:
            states = states_of(api, polls) or states
            if accepted and accepted <= {run for run, state in states.items() if state in FINAL}:
                break
            assert up.poll() is None, f"sat up exited with {up.returncode}\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, (
                f"not final within {DEADLINE}s: {sorted((r, states.get(r)) for r in accepted if states.get(r) not in FINAL)}"
                f"\n{log.read_text()[-4000:]}")
            time.sleep(5)
        final_s = time.monotonic() - began

        headers = {"Authorization": f"Bearer {_token(url, load_or_create(home).admin_password)}"}
        outcome = {}
        for run_id in sorted(accepted):
            page = requests.get(f"{url}/sat/api/jobs/sat_training_job/runs/{run_id}", headers=headers, timeout=60)
            polls.append(page.status_code)
            body = page.json() if page.status_code == 200 else {}
            history = body.get("history") or [{}]
            outcome[run_id] = {"airflow": states[run_id], "status": body.get("status"), "why": history[-1].get("reason"),
                               "attempts": [(a.get("verdict"), a.get("reason")) for a in body.get("attempts", [])]}

    statuses = [a["status"] for a in answers]
    shown = figures(answers)
    print(f"\n[burst] {RUNS} submissions from {THREADS} threads: statuses {shown['statuses']}, submission latency "
          f"p50 {shown['p50_s']:.2f}s p95 {shown['p95_s']:.2f}s, all answered at {submitted_s:.1f}s; the DAG "
          f"processor killed at {killed:.1f}s; all final at {final_s:.0f}s; {len(polls)} polls, "
          f"{sum(1 for s in polls if s >= 500)} of them 5xx; load average {os.getloadavg()}", flush=True)
    print(f"[burst] {exited.group(0)}\n[burst] {restart.group(0)}")

    def healthy():  # once the burst is over every component heartbeats within its threshold again
        try:
            answer = requests.get(f"{url}/api/v2/monitor/health", timeout=60)
        except requests.RequestException:
            return None
        polls.append(answer.status_code)
        parts = answer.json() if answer.status_code == 200 else {}
        return parts if parts and all(part.get("status") == "healthy" for part in parts.values()) else None

    health = _until("every component healthy", healthy, 300, log)

    assert shown["server_errors"] == 0, [a for a in answers if a["status"] is None or a["status"] >= 500]
    assert statuses == [200] * RUNS, [a for a in answers if a["status"] != 200]
    assert not [s for s in polls if s == 0 or s >= 500], polls
    assert sorted(accepted) == [f"burst-{i:02d}" for i in range(RUNS)]  # nothing lost: every run exists
    not_completed = {run: o for run, o in outcome.items() if (o["airflow"], o["status"]) != ("success", "Completed")}
    assert not not_completed, not_completed
    # The service is still up: `sat up` runs, the API answers, and its components heartbeat.
    assert up.poll() is None, log.read_text()[-4000:]
    assert set(health) >= {"metadatabase", "scheduler", "triggerer", "dag_processor"}, health
    assert len(RESTARTED.findall(log.read_text())) == 1, log.read_text()[-4000:]  # once: it did not keep failing
    # Nor did the slowed scheduler take itself for dead and reset its own running tasks (a launch among them).
    scheduler_log = (home / "logs" / "service" / "scheduler.log").read_text(errors="replace")
    assert "SchedulerJob instances as failed" not in scheduler_log, re.findall(r".*orphaned TaskInstances.*", scheduler_log)
