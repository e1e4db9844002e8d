"""Under `make up`, the demo job runs in its image: a deployment in container mode, the demo through the REST API.

One deployment for the module, as `make up` starts it (the shipped airflow.cfg's
`local_runtime = auto` is `container` where podman is installed; here it is said outright, and
host mode is forbidden, so no attempt can quietly run on the host). The demo job (its spec with
half the steps: CPU time on 2 cores) is triggered with the official client; its injected GPU
fault fails it over to another node, it resumes from its last committed checkpoint in a new
container and Completes. Each attempt reports the image and the digest it ran, the job's log
says so, and the Training Jobs view shows the digest on the job's page.

Needs the training image in the project's store (`make image`, which `make test` runs first).
"""

from __future__ import annotations

import re
import shutil
import time

import pytest
import requests
import yaml

from sat_tasks.backends.local.container_run import local_image_digest
from sat_tasks.backends.local.containers import podman_installed
from sat_tasks.io.local_s3 import free_port
from sat_tasks.service.stack import ServiceStack
from tests.e2e.test_service import (
    _password,
    _report,
    _retrying,
    _token,
    _wait_for_dags,
    _wait_for_run,
)
from tests.support.paths import REPO

IMAGE = "registry.sat.local/sat/training:0.1.0"
JOB = "tiny-llama-container"
SPOT = "tiny-llama-spot-container"  # the Spot example, preempted at step 50 (SIGTERM to its container)
DEADLINE = 1200  # seconds the demo may take on a busy 2-core machine (a bound, not a wait)
pytestmark = [pytest.mark.timeout(DEADLINE + 600),
              pytest.mark.skipif(not podman_installed(), reason="podman/runc not installed: `make system-deps`")]


@pytest.fixture(scope="module")
def image_digest() -> str:
    digest = local_image_digest(IMAGE)
    if digest is None:
        pytest.fail(f"{IMAGE} is not in the project's image store: `make image` builds it (make test runs it)")
    return digest


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, image_digest):
    root = tmp_path_factory.mktemp("service-container")
    jobs = root / "jobs"
    jobs.mkdir()
    spec = yaml.safe_load((REPO / "include" / "jobs" / "tiny-llama-demo.yaml").read_text())
    spec["name"] = JOB
    spec["command"] = spec["command"].replace("--max_steps 160", "--max_steps 80")
    assert "--max_steps 80" in spec["command"] and spec["image"]["url"] == IMAGE
    (jobs / f"{JOB}.yaml").write_text(yaml.safe_dump(spec))
    spot = yaml.safe_load((REPO / "include" / "jobs" / "tiny-llama-spot.yaml").read_text())
    spot["name"] = SPOT
    spot["command"] = spot["command"].replace("--max_steps 120", "--max_steps 80")
    assert "--max_steps 80" in spot["command"] and spot["faults"] == [{"kind": "preemption", "attempt": 1,
                                                                        "at_step": 50}]
    (jobs / f"{SPOT}.yaml").write_text(yaml.safe_dump(spot))
    stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=root / "object-storage", jobs_dir=jobs, work_dir=root / "work",
                         extra_env={"AIRFLOW__SAT__LOCAL_RUNTIME": "container",
                                    "AIRFLOW__SAT__LOCAL_HOST_MODE": "forbidden",
                                    "AIRFLOW__SAT__WORKSPACES_DIR": str(root / "workspaces"),
                                    "AIRFLOW__SAT__FINAL_CHECKPOINT_GRACE_SECONDS": "20",
                                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
                                    "PYTHONPATH": str(REPO)},
                         log=lambda _line: None)
    stack.start()
    yield stack
    stack.stop()
    shutil.rmtree(root / "work", ignore_errors=True)


@pytest.fixture(scope="module")
def runs(deployment):
    import airflow_client.client as airflow_client
    from airflow_client.client import TriggerDAGRunPostBody
    from airflow_client.client.api.dag_run_api import DagRunApi

    config = airflow_client.Configuration(host=deployment.url,
                                          access_token=_token(deployment.url, _password(deployment)))
    with airflow_client.ApiClient(config) as api:
        _wait_for_dags(api, [JOB, SPOT], deadline=time.monotonic() + 300)
        deadline = time.monotonic() + DEADLINE
        triggered = {name: _retrying(lambda name=name: DagRunApi(api).trigger_dag_run(
            name, TriggerDAGRunPostBody(logical_date=None))) for name in (JOB, SPOT)}
        return {name: _wait_for_run(api, name, run.dag_run_id, deadline=deadline) for name, run in triggered.items()}


def test_the_demo_fails_over_in_its_image_and_completes(deployment, runs, image_digest):
    demo = runs[JOB]
    report = _report(deployment, JOB, demo.dag_run_id)
    assert demo.state == "success", (demo.state, report.get("history"), report.get("attempts"))
    assert [e["status"] for e in report["history"]] == [
        "Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    first, second = report["attempts"]
    assert (first["verdict"], second["verdict"]) == ("HARDWARE", "SUCCEEDED") and first["node"] != second["node"]
    assert second["resumed_from"] == first["last_committed_step"] and report["global_step"] == 80
    for attempt in (first, second):  # each attempt ran in the image, and says which one
        assert (attempt["runtime"], attempt["image"], attempt["image_digest"]) == ("container", IMAGE, image_digest)
    token = _token(deployment.url, _password(deployment))
    log = requests.get(f"{deployment.url}/sat/api/jobs/{JOB}/runs/{demo.dag_run_id}/log",
                       headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert log.status_code == 200, log.text[:500]
    assert len(re.findall(rf"\[sat\] attempt [12] runs in image {re.escape(IMAGE)} \({image_digest}\)", log.text)) == 2
    assert "runs on this host" not in log.text


def test_the_job_page_shows_each_attempts_image_digest(deployment, runs, image_digest):
    demo = runs[JOB]
    token = _token(deployment.url, _password(deployment))
    headers = {"Authorization": f"Bearer {token}"}
    data = requests.get(f"{deployment.url}/sat/api/jobs/{JOB}/runs/{demo.dag_run_id}", headers=headers, timeout=60)
    assert data.status_code == 200, data.text[:500]
    attempts = data.json()["attempts"]
    assert [(a["runtime"], a["image_digest"]) for a in attempts] == [("container", image_digest)] * 2
    page = requests.get(f"{deployment.url}/sat/jobs/{JOB}/runs/{demo.dag_run_id}", headers=headers, timeout=60)
    cells = re.findall(r"<td class='image'>(.*?)</td>", page.text, re.DOTALL)
    assert page.status_code == 200 and len(cells) == 2, page.text[:500]
    assert all(IMAGE in cell and image_digest in cell for cell in cells), cells


def test_a_person_reads_the_digests_inside_airflows_navigation(deployment, runs, image_digest):
    demo = runs[JOB]
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_service import CHROMIUM, SCREENSHOTS, _logged_in_page

    assert demo.state == "success", demo
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = _logged_in_page(deployment, browser)
            page.goto(f"{deployment.url}/plugin/training-jobs")  # the view inside Airflow's UI, from its navigation
            frame = page.frame_locator("iframe")
            frame.get_by_role("link", name=JOB).first.click()
            frame.locator("#details").wait_for()
            frame.get_by_role("link", name="Attempts", exact=True).click()
            attempts = frame.locator("#attempts").inner_text()
            assert attempts.count(image_digest) == 2 and "HARDWARE" in attempts and "SUCCEEDED" in attempts, attempts
            frame.locator("#attempts").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "05-container-digests-in-airflow.png"))
        finally:
            browser.close()


def test_a_spot_preemption_reaches_the_container_as_sigterm_and_resumes_without_a_failover(deployment, runs):
    run = runs[SPOT]
    report = _report(deployment, SPOT, run.dag_run_id)
    assert run.state == "success", (run.state, report.get("history"), report.get("attempts"))
    assert [e["status"] for e in report["history"]] == [
        "Pending", "Running", "Pending - preempted", "Running", "Completed"]
    first, second = report["attempts"]
    assert (first["verdict"], second["verdict"]) == ("PREEMPTED", "SUCCEEDED")
    assert first["runtime"] == second["runtime"] == "container"
    # SIGTERM reached the trainer inside its container: it committed a final checkpoint at the step it was on,
    # not only the last periodic one (every 20 steps), and the next attempt resumed from it
    step = first["last_committed_step"]
    assert step >= 50 and step % 20 != 0 and second["resumed_from"] == step and report["global_step"] == 80
    token = _token(deployment.url, _password(deployment))
    log = requests.get(f"{deployment.url}/sat/api/jobs/{SPOT}/runs/{run.dag_run_id}/log",
                       headers={"Authorization": f"Bearer {token}"}, timeout=60).text
    assert "SIGTERM received" in log and f"final checkpoint checkpoint-{step} committed" in log, log[-3000:]
    assert f"Resuming from checkpoint-{step}" in log
    assert "failover" not in " ".join(e.get("reason") or "" for e in report["history"])  # none spent
