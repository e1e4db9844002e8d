"""A running job survives the service: `make down` / `make up` mid-run, then its launch task killed, under the scheduler.

Slow (two starts of the whole stack: 12-16 min on the shared 2-core machine, load 15-50): `make test-slow`.
tests/sat_tasks/backends/local/test_interrupted_attempt.py covers the same paths in one
process, fast; this one shows Airflow doing its part: the scheduler runs the interrupted
`launch` again after a restart (its on_kill asked for a reschedule, or the orphan reset), and
retries it once after its task process was SIGKILLed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import requests
import yaml

from sat_tasks.io.local_s3 import free_port
from sat_tasks.io.run_layout import results_prefix
from sat_tasks.service.secrets import SECRETS_FILE
from sat_tasks.service.stack import ServiceStack, processes_of
from tests.support.paths import REPO

BUCKET = "sat-demo"
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = REPO / "build" / "screenshots"
JOB = "svc-restart"
STEPS = 300  # 0.2 s each: the training the killed task leaves must outlast the retry's start (~30-60 s here)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _spec() -> dict:
    return {
        "name": JOB, "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "storage": {"script_url": f"s3://{BUCKET}/scripts/fake_train.py"},
        "data": {"source": f"s3://{BUCKET}/datasets/tiny-corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python fake_train.py", "startup_timeout_seconds": 300,
        "env": {"FAKE_STEPS": str(STEPS), "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.2"},
    }


def _stack(root: Path, port: int, storage_dir: Path) -> ServiceStack:
    return ServiceStack(home=root / "home", port=port, storage_port=free_port(), storage_dir=storage_dir,
                        jobs_dir=root / "jobs", work_dir=root / "work",
                        extra_env={"AIRFLOW__SAT__WORKSPACES_DIR": str(root / "workspaces"),
                                   "AIRFLOW__SAT__FINAL_CHECKPOINT_GRACE_SECONDS": "20",
                                   "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                                   "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10"},
                        log=lambda _line: None)


def _api(stack: ServiceStack) -> requests.Session:
    password = json.loads((stack.home / SECRETS_FILE).read_text())["admin_password"]
    token = requests.post(f"{stack.url}/auth/token", json={"username": "admin", "password": password},
                          timeout=30).json()["access_token"]
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def _until(what: str, ready, deadline_s: float, poll: float = 1.0):
    deadline = time.monotonic() + deadline_s
    while True:
        found = ready()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def _progress(work: Path) -> dict:
    for path in work.rglob("output/concurrent_checkpoint/progress.json"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
    return {}


def _history(stack: ServiceStack, run_id: str) -> list[dict]:
    key = results_prefix(f"s3://{BUCKET}/results/", JOB, JOB, run_id)[len(f"s3://{BUCKET}/"):] + "status.json"
    try:
        return json.loads(stack.storage.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    except Exception:  # noqa: BLE001 - not written yet
        return []


def _finished(api: requests.Session, stack: ServiceStack, run_id: str) -> dict | None:
    run = api.get(f"{stack.url}/api/v2/dags/{JOB}/dagRuns/{run_id}", timeout=30).json()
    return run if run["state"] in ("success", "failed") else None


def _launch_task_pid(work: Path) -> int:
    """The `launch` task process: the parent of the training's process group leader (the runner's `bash -c`)."""
    noted = json.loads(next(work.rglob("attempts/attempt-1.procs.json")).read_text())
    with open(f"/proc/{noted['pgid']}/stat", encoding="ascii") as handle:
        return int(handle.read().rpartition(")")[2].split()[1])


def _the_job_page_inside_airflow_says_so(stack: ServiceStack, run_id: str, resumed_at: int) -> None:
    """What a person sees afterwards: the job page in Airflow's navigation (the embedded view, Debian's chromium)
    tells both interruptions in its status history, with the checkpoint it resumed from, and no failover."""
    from urllib.parse import quote

    from playwright.sync_api import sync_playwright

    password = json.loads((stack.home / SECRETS_FILE).read_text())["admin_password"]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"{stack.url}/auth/login")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
            page.goto(f"{stack.url}/plugin/training-jobs/sat/jobs/{JOB}/runs/{quote(run_id, safe='')}")
            frame = page.frame_locator("iframe")  # the view inside Airflow's navigation
            history = frame.locator("table", has=frame.locator("th", has_text="Reason"))
            history.get_by_text("interrupted by a service restart").first.wait_for()
            text = history.inner_text()
            assert f"resumed from checkpoint-{resumed_at} (not a failover: none spent)" in text, text
            assert "its launch task died" in text and "failoverinprogress" not in text.lower().replace(" ", ""), text
            history.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "29-restart-resumed-inside-airflow.png"))
        finally:
            browser.close()


def test_a_running_job_resumes_after_make_down_and_up_and_after_its_task_is_killed(tmp_path):
    root = tmp_path
    (root / "jobs").mkdir()
    (root / "jobs" / f"{JOB}.yaml").write_text(yaml.safe_dump(_spec()))
    port, storage_dir = free_port(), root / "object-storage"
    stack = _stack(root, port, storage_dir)
    stack.start()
    try:
        stack.storage.client().upload_file(str(REPO / "tests" / "e2e" / "scripts" / "fake_train.py"), BUCKET,
                                           "scripts/fake_train.py")
        api = _api(stack)
        _until("the job's DAG", lambda: api.get(f"{stack.url}/api/v2/dags/{JOB}", timeout=30).ok, 300)
        answer = api.post(f"{stack.url}/api/v2/dags/{JOB}/dagRuns", json={"logical_date": None}, timeout=30)
        assert answer.ok, answer.text
        run_id = answer.json()["dag_run_id"]
        _until("a committed checkpoint", lambda: (_progress(root / "work").get("last_committed_step") or 0) >= 10,
               600)
        stack.stop()  # `make down` mid-run
        at_stop = _progress(root / "work")
        assert at_stop["step"] < STEPS and processes_of(stack.home) == []

        stack = _stack(root, port, storage_dir)  # `make up`
        stack.start()
        restart = _until("the resume after the restart", lambda: next(
            (e for e in _history(stack, run_id) if "interrupted by a service restart" in e["reason"]), None), 600)
        assert restart["reason"].endswith(
            f"; resumed from checkpoint-{at_stop['last_committed_step']} (not a failover: none spent)")
        resumed_at = at_stop["last_committed_step"]
        _until("progress after the resume", lambda: (_progress(root / "work").get("last_committed_step") or 0)
               >= resumed_at + 5, 600)
        os.kill(_launch_task_pid(root / "work"), signal.SIGKILL)  # the task process alone dies

        api = _api(stack)
        run = _until("the end of the run", lambda: _finished(api, stack, run_id), 900, poll=3)
        history = _history(stack, run_id)
        reasons = [e["reason"] for e in history]
        assert run["state"] == "success", reasons
        assert history[-1]["status"] == "Completed"
        assert any("its launch task died" in r and "process(es) of it stopped" in r for r in reasons), reasons
        assert not any(e["status"] == "Pending - failoverinprogress" for e in history), reasons
        assert {e["attempt"] for e in history if e["attempt"] is not None} == {1}  # one attempt, resumed twice
        final = _progress(root / "work")
        # never back to step 0 (a fresh start would commit 5, 10, ... again after the later ones)
        assert final["step"] == STEPS and final["committed_steps"] == sorted(final["committed_steps"])
        _the_job_page_inside_airflow_says_so(stack, run_id, resumed_at)
    finally:
        stack.stop()
        shutil.rmtree(root / "work", ignore_errors=True)
