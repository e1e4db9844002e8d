"""SAT as a service: the real components as `make up` starts them, driven through the REST API with the official client.

One deployment for the module (free loopback ports, a temporary Airflow home): the
API server, the scheduler, the DAG processor and the embedded Object Storage, with
authentication on, and its metadata DB in a private PostgreSQL cluster (`sat up --db
postgres`, issue 31.3: SQLite stays covered by tests/e2e/test_demo_job.py and `make demo`;
one run of this module, not two, fits the suite's budget). Through `apache-airflow-client`
it logs in, triggers the demo job and the generic `sat_training_job` DAG (a fast job whose
image is on a real registry with a password kept as an Airflow connection), and waits; a cron-scheduled spec and an
Asset-scheduled spec start on their own. Then it checks the status history, the
attempts and the report, that the registry password shows up nowhere, and that `sat up`
/ `sat down` restart the deployment with its secrets and its objects.

Tenancy (issue 29): a job DAG whose command is a co-tenant's probe (tests/e2e/scripts/tenancy_probe.py)
runs with the others; its log shows none of the deployment's secrets, the embedded store refuses
everything its credentials try outside its own run, and it still trains and mirrors its checkpoints. A
second person, `outsider`, whom the deployment's auth manager denies that DAG (tests/e2e/service_auth.py:
the simple auth manager's roles are global), reaches none of its runs through the API server.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from playwright.sync_api import expect

from sat_tasks.io.local_s3 import (
    LOCAL_ACCESS_KEY,
    PersistentS3Server,
    free_port,
    state_file_name,
)
from sat_tasks.service.postgres import cluster_dir
from sat_tasks.service.secrets import PASSWORDS_FILE, SECRETS_FILE, load_or_create
from sat_tasks.service.stack import ServiceStack, processes_of
from tests.support.paths import REPO

BUCKET = "sat-demo"
REGISTRY_PASSWORD = "s3cr3t-svc-REGISTRY-7c1f"
WATCHED = f"s3://{BUCKET}/datasets/watched/"
FAST_ENV = {"FAKE_STEPS": "20", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05"}
DEMO_NAME = "tiny-llama-ui"  # the demo job, created in the browser's Create Training Job form
DEMO_COMMAND = ('python train_tiny_llama.py --data_dir "$SAT_DATA_DIR" --output_dir "$SAT_OUTPUT_DIR" '
                "--max_steps 80 --save_steps 20")  # the demo's command, half its steps: CPU time on 2 cores
DEADLINE = 1200  # seconds all the runs together may take on a busy 2-core machine (a bound, not a wait)
pytestmark = pytest.mark.timeout(DEADLINE + 600)  # the deployment's start and stop come on top
# Tenancy (issue 29): the probing job's DAG, which `outsider` may not touch (tests/e2e/service_auth.py)
TENANCY = "svc-tenancy"
OUTSIDER = "outsider"
PEER = "bob"  # a person with the simple auth manager's `user` role: reads and triggers DAGs, no operator (ADR 0043)
OTHER_BUCKET = "sat-other"  # a bucket of no job of this module
OTHER_RUN = "manual__2026-01-01T00:00:00+00:00"  # another run of the probing job, planted (and a generic twin)
VICTIM = b"another run's result: not the probing job's to read or change"
PROBE_MARK = "SAT-TENANCY-PROBE "
TENANCY_STEPS = 20
# The cron job: daily, at a time a few minutes past. Airflow (catchup off) runs the latest past tick at once and
# the next one tomorrow: one scheduled run. "* * * * *" also ran at once, but then once a minute: until the
# module paused it, a second whole run (data validation, a launch) took the two cores from the demo job.
_CRON_AT = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
CRON = f"{_CRON_AT.minute} {_CRON_AT.hour} * * *"


def _fast_spec(name: str, **fields) -> dict:
    spec = {
        "name": name, "learning_type": "on-demand", "framework": "pytorch", "job_failover": False,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "storage": {"script_url": f"s3://{BUCKET}/scripts/fake_train.py"},
        "data": {"source": f"s3://{BUCKET}/datasets/tiny-corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python fake_train.py", "env": dict(FAST_ENV), "startup_timeout_seconds": 120,
    }
    spec.update(fields)
    return spec


def _tenancy_targets() -> dict[str, str]:
    """What the probe tries (its `env`): its data and scripts, another run of its job, a generic twin, a bucket."""
    from sat_tasks.io.run_layout import results_prefix

    destination = f"s3://{BUCKET}/results/"
    return {"SAT_PROBE_DATA": f"s3://{BUCKET}/datasets/tiny-corpus/", "SAT_PROBE_SCRIPTS": f"s3://{BUCKET}/scripts/",
            "SAT_PROBE_OTHER_RUN": results_prefix(destination, TENANCY, TENANCY, OTHER_RUN),
            "SAT_PROBE_TWIN_RUN": results_prefix(destination, "sat_training_job", TENANCY, OTHER_RUN),
            "SAT_PROBE_OTHER_BUCKET": OTHER_BUCKET}


def _tenancy_spec() -> dict:
    """The probe, then the tiny Llama for a few steps with the checkpoint engine (its mirror: the job's credentials)."""
    return _fast_spec(TENANCY, storage={"script_url": f"s3://{BUCKET}/scripts/"}, env=_tenancy_targets(),
                      command='python tenancy_probe.py && python train_tiny_llama.py --data_dir "$SAT_DATA_DIR" '
                              f'--output_dir "$SAT_OUTPUT_DIR" --max_steps {TENANCY_STEPS} --save_steps 10')


def _people(root: Path, home: Path) -> Path:
    """The API server's passwords file: the deployment's admin (its kept password) and `outsider` (mode 0600)."""
    kept = load_or_create(home)  # the deployment's secrets, made as `sat up` makes them (it keeps them)
    path = root / "people.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"admin": kept.admin_password, OUTSIDER: secrets.token_urlsafe(18),
                   PEER: secrets.token_urlsafe(18)}, handle)
    return path


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from tests.support.registry_server import push_test_image, start_registry

    server = start_registry(tmp_path_factory.mktemp("registry"), {"robot": REGISTRY_PASSWORD})
    push_test_image(server, "sat/train", "1.0", "robot", REGISTRY_PASSWORD)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The stack, started as `make up` starts it, on free loopback ports in a temporary home."""
    root = tmp_path_factory.mktemp("service")
    jobs = root / "jobs"
    jobs.mkdir()
    shutil.copy(REPO / "include" / "jobs" / "tiny-llama-demo.yaml", jobs)
    (jobs / "svc-cron.yaml").write_text(yaml.safe_dump(_fast_spec("svc-cron", schedule=CRON)))
    (jobs / "svc-asset.yaml").write_text(yaml.safe_dump(_fast_spec(
        "svc-asset", schedule=f"asset:{WATCHED}", data={"source": WATCHED})))
    (jobs / f"{TENANCY}.yaml").write_text(yaml.safe_dump(_tenancy_spec()))
    people = _people(root, root / "home")
    stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=root / "object-storage", jobs_dir=jobs, work_dir=root / "work", db="postgres",
                         extra_env={"AIRFLOW__SAT__WORKSPACES_DIR": str(root / "workspaces"),  # not the repo's
                                    "AIRFLOW__SAT__DATA_WATCH_INTERVAL_SECONDS": "10",
                                    # the module's five concurrent jobs and a failover's excluded node never
                                    # queue for a slot: the status histories below have no wait in them
                                    # (queueing: tests/sat_tasks/backends/local/test_pool_slots.py)
                                    "AIRFLOW__SAT__LOCAL_NODE_SLOTS": "2",
                                    "AIRFLOW__SAT__FINAL_CHECKPOINT_GRACE_SECONDS": "20",
                                    # the generic run's login is shared, not sat_registry_<its name>
                                    "AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS": "sat_registry_svc",
                                    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
                                    # a second person, denied the tenancy job's DAG: the simple auth manager
                                    # with per-DAG answers (tests/e2e/service_auth.py), imported by name
                                    "AIRFLOW__CORE__AUTH_MANAGER": "tests.e2e.service_auth.ServiceDagScopedAuthManager",
                                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,{OUTSIDER}:admin,{PEER}:user",
                                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(people),
                                    "PYTHONPATH": str(REPO)},
                         log=lambda _line: None)
    stack.start()
    client = stack.storage.client()
    for script in ("fake_train.py", "tenancy_probe.py"):
        client.upload_file(str(REPO / "tests" / "e2e" / "scripts" / script), BUCKET, f"scripts/{script}")
    # what the probe must not reach: another run of its job, a generic twin of the same name, another bucket
    for target in ("SAT_PROBE_OTHER_RUN", "SAT_PROBE_TWIN_RUN"):
        client.put_object(Bucket=BUCKET, Key=_tenancy_targets()[target][len(f"s3://{BUCKET}/"):] + "victim.txt",
                          Body=VICTIM)
    client.create_bucket(Bucket=OTHER_BUCKET)
    client.put_object(Bucket=OTHER_BUCKET, Key="victim.txt", Body=VICTIM)
    yield stack
    stack.stop()
    shutil.rmtree(cluster_dir(stack.home), ignore_errors=True)  # outside the temporary home when run as root


def _password(stack: ServiceStack) -> str:
    return json.loads((stack.home / SECRETS_FILE).read_text())["admin_password"]


def _token(url: str, password: str, username: str = "admin") -> str:
    response = requests.post(f"{url}/auth/token", json={"username": username, "password": password}, timeout=30)
    response.raise_for_status()
    return response.json()["access_token"]


@pytest.fixture(scope="module")
def api(deployment):
    """The official client, logged in as the admin with the generated password."""
    import airflow_client.client as airflow_client

    config = airflow_client.Configuration(host=deployment.url, access_token=_token(deployment.url,
                                                                                 _password(deployment)))
    with airflow_client.ApiClient(config) as client:
        yield client


def _wait_for_run(api, dag_id: str, run_id: str | None = None, *, deadline: float):
    """The run `run_id` (or the first run of `dag_id`) once it has finished; fails at `deadline` (monotonic).

    Every run counts, not only the first successful one: a failed first run is a failure.
    """
    from airflow_client.client.api.dag_run_api import DagRunApi

    runs = DagRunApi(api)
    while time.monotonic() < deadline:
        if run_id is None:
            found = runs.get_dag_runs(dag_id, limit=10, order_by=["id"]).dag_runs
            run = next((r for r in found if r.state in ("success", "failed")), None)
        else:
            run = runs.get_dag_run(dag_id, run_id)
        if run is not None and run.state in ("success", "failed"):
            return run
        time.sleep(3)
    raise AssertionError(f"{dag_id} {run_id or '(any run)'}: not finished in time")


def _wait_for_a_run(api, dag_id: str, *, deadline: float) -> None:
    """Until `dag_id` has a run, in any state; fails at `deadline` (monotonic)."""
    from airflow_client.client.api.dag_run_api import DagRunApi

    while not DagRunApi(api).get_dag_runs(dag_id, limit=1).dag_runs:
        assert time.monotonic() < deadline, f"{dag_id}: no run in time"
        time.sleep(2)


def _retrying(call, attempts: int = 3):
    """`call()`, again after a 500 "Database error": what a client does when SQLite's lock timed out.

    See sat_tasks/service/sqlite.py: with the embedded SQLite, the API server's audit-log
    write can time out on the lock under load. Only that answer is retried, and it is said.
    """
    from airflow_client.client.exceptions import ServiceException

    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ServiceException as exc:
            if "Database error" not in str(exc.body) or attempt == attempts:
                raise
            print(f"[test] the API server answered 500 Database error (SQLite lock); retry {attempt}")
            time.sleep(2)
    raise AssertionError("unreachable")


def _wait_for_dags(api, dag_ids: list[str], *, deadline: float) -> None:
    """Until the DAG processor's first pass has put every one of `dag_ids` in the DB."""
    from airflow_client.client.api.dag_api import DAGApi

    while True:
        found = {dag.dag_id for dag in DAGApi(api).get_dags(limit=100).dags}
        if set(dag_ids) <= found:
            return
        assert time.monotonic() < deadline, f"DAGs missing after the DAG processor's first pass: {set(dag_ids) - found}"
        time.sleep(2)


def _pause(api, dag_id: str) -> None:
    """Pause a scheduled DAG once it has shown what it must (a cron every minute is load on 2 cores)."""
    from airflow_client.client import DAGPatchBody
    from airflow_client.client.api.dag_api import DAGApi

    assert _retrying(lambda: DAGApi(api).patch_dag(dag_id, DAGPatchBody(is_paused=True))).is_paused


def _key_prefix(job: str, run_id: str, dag_id: str | None = None) -> str:
    """The run's results prefix as a key in BUCKET: `results/<dag_id>/<job>/<run key>/` (ADR 0024; a job DAG's id is its job's name)."""
    from sat_tasks.io.run_layout import results_prefix

    return results_prefix(f"s3://{BUCKET}/results/", dag_id or job, job, run_id)[len(f"s3://{BUCKET}/"):]


def _report(stack: ServiceStack, job: str, run_id: str, dag_id: str | None = None) -> dict:
    prefix = _key_prefix(job, run_id, dag_id)
    body = stack.storage.client().get_object(Bucket=BUCKET, Key=prefix + "report.json")["Body"].read()
    return json.loads(body)


# ---- closed to strangers ----------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/api/v2/dags"), ("GET", "/api/v2/connections"), ("GET", "/api/v2/config"),
    ("POST", "/api/v2/dags/tiny-llama-demo/dagRuns"), ("PATCH", "/api/v2/dags/tiny-llama-demo"),
])
def test_unauthenticated_calls_are_refused(deployment, method, path):
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        response = requests.request(method, deployment.url + path, json={}, headers=headers, timeout=30)
        assert response.status_code in (401, 403), (method, path, response.status_code, response.text[:200])


def test_a_wrong_password_gets_no_token(deployment):
    response = requests.post(f"{deployment.url}/auth/token", json={"username": "admin", "password": "admin"},
                             timeout=30)
    assert response.status_code in (401, 403)


def test_the_api_server_listens_on_loopback_only(deployment):
    addresses = {a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
                 if ":" not in a and not a.startswith("127.")}
    if not addresses:
        pytest.skip("this host has no address besides loopback to try")
    for address in addresses:
        for port in (deployment.port, deployment.log_server_port):  # the UI and API; the task logs (issue 45.6)
            with socket.socket() as sock:
                sock.settimeout(3)
                assert sock.connect_ex((address, port)) != 0, (address, port)


def test_the_shipped_config_never_switches_authentication_off():
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO / "airflow.cfg")
    assert parser.get("core", "simple_auth_manager_all_admins").strip().lower() == "false"
    assert parser.get("api", "host") == "127.0.0.1"


def test_secrets_are_generated_once_and_readable_by_the_owner_only(deployment):
    for name in (SECRETS_FILE, "simple_auth_manager_passwords.json"):
        assert (deployment.home / name).stat().st_mode & 0o777 == 0o600, name
    log_text = "".join(p.read_text(errors="replace") for p in deployment.logs_dir.glob("*.log"))
    assert _password(deployment) not in log_text


# ---- in a browser: Debian's chromium driven by Playwright (no browser download) -----------------------
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = REPO / "build" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: `make system-deps` installs Debian's chromium"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


# ---- jobs, triggered and scheduled ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(deployment, api, registry, browser):
    """The demo job and a job to stop, created in the browser; the generic DAG triggered through the REST API;
    the cron and the Asset jobs start on their own. Stop and Delete happen while the others run."""
    from airflow_client.client import ConnectionBody, TriggerDAGRunPostBody
    from airflow_client.client.api.connection_api import ConnectionApi
    from airflow_client.client.api.dag_run_api import DagRunApi

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.spec import parse_spec

    _retrying(lambda: ConnectionApi(api).post_connection(ConnectionBody(
        connection_id="sat_registry_svc", conn_type="generic", host=registry.host, login="robot",
        password=REGISTRY_PASSWORD, extra=json.dumps({"insecure": True}))))
    generic = parse_spec(_fast_spec("svc-generic", image={
        "url": f"{registry.host}/sat/train:1.0", "registry_conn_id": "sat_registry_svc", "insecure": True}))
    dag_runs = DagRunApi(api)
    _wait_for_dags(api, ["tiny-llama-demo", "sat_training_job", "svc-cron", "svc-asset", "sat_data_changes", TENANCY],
                   deadline=time.monotonic() + 300)
    triggered = time.monotonic()
    deadline = triggered + DEADLINE
    tenancy = _retrying(lambda: dag_runs.trigger_dag_run(TENANCY, TriggerDAGRunPostBody(logical_date=None)))
    page = _logged_in_page(deployment, browser)
    created = {"demo": _create_demo_in_the_browser(page, api, deployment, deadline)}
    form = _retrying(lambda: dag_runs.trigger_dag_run("sat_training_job", TriggerDAGRunPostBody(
        logical_date=None, conf=params_from_spec(generic))))
    # The Asset job: new data lands under the watched prefix once the watcher has its baseline.
    baseline = _wait_for_run(api, "sat_data_changes", deadline=deadline)
    assert baseline.state == "success", baseline
    storage = deployment.storage.client()
    for part in sorted((REPO / "include" / "corpus").glob("*.txt")):
        storage.upload_file(str(part), BUCKET, f"datasets/watched/{part.name}")
    _wait_for_a_run(api, "svc-asset", deadline=deadline)
    _pause(api, "sat_data_changes")  # its event is in: no more looks every 10 s (a task process each)
    created["stopped"] = _create_stop_and_delete_in_the_browser(page, api, deployment, registry, deadline)
    page.close()
    finished = {"cron": _wait_for_run(api, "svc-cron", deadline=deadline)}
    _pause(api, "svc-cron")  # not before its run has finished: a paused DAG's runs are not scheduled
    finished["asset"] = _wait_for_run(api, "svc-asset", deadline=deadline)
    finished["demo"] = _wait_for_run(api, "sat_training_job", created["demo"]["run_id"], deadline=deadline)
    finished["generic"] = _wait_for_run(api, "sat_training_job", form.dag_run_id, deadline=deadline)
    finished["tenancy"] = _wait_for_run(api, TENANCY, tenancy.dag_run_id, deadline=deadline)
    finished["seconds"] = time.monotonic() - triggered
    finished["browser"] = created
    return finished


def _logged_in_page(deployment, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    page.goto(f"{deployment.url}/auth/login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", _password(deployment))
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    return page


def _fill(page, values: dict[str, str], checks: dict[str, bool]) -> None:
    for name, value in values.items():
        page.fill(f"[name='{name}']", value)
    for name, on in checks.items():
        page.set_checked(f"[name='{name}']", on)


def _generic_runs(api) -> set[str]:
    from airflow_client.client.api.dag_run_api import DagRunApi

    return {r.dag_run_id for r in DagRunApi(api).get_dag_runs("sat_training_job", limit=100).dag_runs}


def _status_word(page) -> str:
    return page.inner_text("#status").strip()


def _create_demo_in_the_browser(page, api, deployment, deadline: float) -> dict:
    """Create Training Job: a bad name first (the rule next to the field, nothing starts), then the demo job."""
    page.goto(f"{deployment.url}/sat/jobs")
    page.get_by_role("link", name="Create Training Job").click()
    page.wait_for_url("**/sat/jobs/new")
    page.screenshot(path=str(SCREENSHOTS / "05-create-form.png"), full_page=True)
    demo = {"name": "ab", "command": DEMO_COMMAND, "storage.script_url": f"s3://{BUCKET}/scripts/train_tiny_llama.py",
            "heartbeat_timeout_seconds": "120", "tags": "team=platform\npurpose=demo",
            "advanced": json.dumps({"faults": [{"kind": "hardware", "attempt": 1, "at_step": 50, "xid": 79}]})}
    before = _generic_runs(api)
    _fill(page, demo, {"job_failover": True})
    page.get_by_role("button", name="Create Training Job").click()
    error = page.locator("#error-name")
    error.wait_for()
    bad_name = {"error": error.inner_text(), "url": page.url, "runs_after": _generic_runs(api) - before}
    page.screenshot(path=str(SCREENSHOTS / "06-create-bad-name.png"), full_page=True)
    page.fill("[name='name']", DEMO_NAME)  # everything else the person typed is still there
    page.get_by_role("button", name="Create Training Job").click()
    page.wait_for_url("**/sat/jobs/sat_training_job/runs/**")
    run_id = next(iter(_generic_runs(api) - before))
    first = _status_word(page)
    # The page follows the run: no reload by the person (expect() retries across the page's own reloads). Its first
    # tasks (validate, check the image, stage the data) take minutes on a loaded machine: the module's deadline.
    expect(page.locator("#status")).not_to_have_text(first, timeout=max(1, deadline - time.monotonic()) * 1000)
    return {"run_id": run_id, "bad_name": bad_name, "status_words": [first, _status_word(page)],
            "page_url": page.url}


def _create_stop_and_delete_in_the_browser(page, api, deployment, registry, deadline: float) -> dict:
    """A long job whose image is on the password-protected registry (login typed in the form): stop it, delete it."""
    page.goto(f"{deployment.url}/sat/jobs/new")
    before = _generic_runs(api)
    _fill(page, {"name": "svc-stop", "image.url": f"{registry.host}/sat/train:1.0", "registry_user": "robot",
                 "registry_password": REGISTRY_PASSWORD, "command": "python fake_train.py",
                 "storage.script_url": f"s3://{BUCKET}/scripts/fake_train.py",
                 "advanced": json.dumps({"env": {**FAST_ENV, "FAKE_STEPS": "100000"}, "startup_timeout_seconds": 120})},
          {"job_failover": False, "image.insecure": True})
    page.get_by_role("button", name="Create Training Job").click()
    page.wait_for_url("**/sat/jobs/sat_training_job/runs/**")
    run_id = next(iter(_generic_runs(api) - before))
    expect(page.locator("#status")).to_have_text("Running", timeout=max(1, deadline - time.monotonic()) * 1000)
    time.sleep(3)  # a few checkpoints (every 5 steps of 0.05 s)
    page.locator("#stop").click()
    page.locator("#confirm-stop").click()  # Stop asks first, as Delete does
    page.locator("#stop-notice").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "08-stop-requested.png"), full_page=True)
    expect(page.locator("#status")).to_have_text("Stopped", timeout=max(1, deadline - time.monotonic()) * 1000)
    ended = _wait_for_run(api, "sat_training_job", run_id, deadline=deadline)
    # The page reloads itself when the run's state changes: wait for that, rather than race it with a reload.
    expect(page.locator("#status")).to_have_attribute("data-run-state", "failed", timeout=60_000)
    history = page.text_content("#details")  # text_content: the tabs hide all but one section
    attempts = page.text_content("#attempts")
    page.goto(page.url.split("#")[0] + "#details")
    page.screenshot(path=str(SCREENSHOTS / "09-stopped.png"), full_page=True)
    page.locator("#delete").click()
    page.locator("#confirm-delete").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "10-delete-confirm.png"))
    page.locator("#confirm-delete").click()
    deleted = page.locator("#deleted").inner_text()
    page.goto(f"{deployment.url}/sat/jobs")
    listed = page.inner_text("table")
    return {"run_id": run_id, "state": ended.state, "history": history, "attempts": attempts, "deleted": deleted,
            "listed": listed, "in_airflow": run_id in _generic_runs(api)}


def test_the_demo_job_fails_over_resumes_and_completes_under_the_scheduler(deployment, api, runs):
    from airflow_client.client.api.task_instance_api import TaskInstanceApi

    run = runs["demo"]
    assert run.state == "success", run
    report = _report(deployment, DEMO_NAME, run.dag_run_id, "sat_training_job")  # created in the form
    assert [e["status"] for e in report["history"]] == [
        "Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    first, second = report["attempts"]
    assert (first["verdict"], second["verdict"]) == ("HARDWARE", "SUCCEEDED") and first["node"] != second["node"]
    assert second["resumed_from"] == first["last_committed_step"] and report["global_step"] == 80
    states = {t.task_id: t.state for t in TaskInstanceApi(api).get_task_instances(
        "sat_training_job", run.dag_run_id, limit=100).task_instances}
    assert states["attempt_1.launch"] == "failed" and states["attempt_2.launch"] == "success"
    assert states["finalize"] == "success" and states["cleanup_run"] == "success"
    # The task log a person opens in the UI (served by the API server) holds the verdict and its evidence.
    log = str(TaskInstanceApi(api).get_log("sat_training_job", run.dag_run_id, "attempt_1.classify", 1,
                                           full_content=True))
    assert "HARDWARE" in log and "GPU has fallen off the bus" in log, log[-2000:]


def test_the_generic_dag_runs_a_job_from_its_form(deployment, runs):
    run = runs["generic"]
    assert run.state == "success", run
    report = _report(deployment, "svc-generic", run.dag_run_id, "sat_training_job")
    assert report["status"] == "Completed" and report["global_step"] == 20


def test_a_cron_scheduled_spec_runs_without_a_trigger(deployment, runs):
    run = runs["cron"]
    assert run.run_type == "scheduled" and run.state == "success", run
    assert _report(deployment, "svc-cron", run.dag_run_id)["status"] == "Completed"


def test_an_asset_scheduled_spec_runs_when_its_data_changes(deployment, runs):
    run = runs["asset"]
    assert run.run_type == "asset_triggered" and run.state == "success", run
    assert _report(deployment, "svc-asset", run.dag_run_id)["status"] == "Completed"


def test_the_registry_password_appears_nowhere(deployment, api, runs):
    """Not in the run's conf, an XCom, a rendered field, a task log, an API response or the DB in clear."""
    from airflow_client.client.api.connection_api import ConnectionApi
    from airflow_client.client.api.task_instance_api import TaskInstanceApi
    from airflow_client.client.api.x_com_api import XComApi

    run = runs["generic"]
    seen: list[str] = [json.dumps(run.to_dict(), default=str)]
    connection = ConnectionApi(api).get_connection("sat_registry_svc")
    seen.append(json.dumps(connection.to_dict(), default=str))
    instances = TaskInstanceApi(api).get_task_instances("sat_training_job", run.dag_run_id, limit=100).task_instances
    assert "check_image" in {t.task_id for t in instances}
    for ti in instances:
        seen.append(json.dumps(ti.to_dict(), default=str))  # rendered fields included
        if ti.try_number:
            seen.append(str(TaskInstanceApi(api).get_log("sat_training_job", run.dag_run_id, ti.task_id,
                                                          ti.try_number, full_content=True)))
    for entry in XComApi(api).get_xcom_entries("sat_training_job", run.dag_run_id, "~", limit=100).xcom_entries:
        seen.append(json.dumps(entry.to_dict(), default=str))
    seen += [p.read_text(errors="replace") for p in (deployment.home / "logs").rglob("*") if p.is_file()]
    leaks = [text[max(0, text.find(REGISTRY_PASSWORD) - 80):][:200] for text in seen if REGISTRY_PASSWORD in text]
    assert leaks == []
    stored, encrypted = _metadata_db_row(deployment, "SELECT password, is_encrypted FROM connection "
                                                     "WHERE conn_id = :id", id="sat_registry_svc")
    assert encrypted and REGISTRY_PASSWORD not in stored  # Fernet-encrypted with the kept key


def test_the_metadata_db_is_postgresql_and_its_password_appears_in_no_log(deployment, runs):
    """Every run of this module went through the deployment's PostgreSQL (issue 31.3); its generated password,
    kept with the other secrets, is in no log (the components', the tasks', the server's)."""
    url = deployment.environment()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert url.startswith("postgresql+psycopg2://sat:") and "@127.0.0.1:" in url
    assert not (deployment.home / "airflow.db").exists()
    assert _metadata_db_row(deployment, "SELECT count(*) FROM dag_run WHERE state = 'success'")[0] >= 2
    password = json.loads((deployment.home / SECRETS_FILE).read_text())["db_password"]
    logs = [p for p in (deployment.home / "logs").rglob("*") if p.is_file()]
    assert any(p.name == "postgres.log" for p in logs)
    assert [p for p in logs if password in p.read_text(errors="replace")] == []


def _metadata_db_row(stack: ServiceStack, sql: str, **params):
    """One row of the deployment's metadata DB (PostgreSQL here), through the URL its components use."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(stack.environment()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as connection:
            return connection.execute(sqlalchemy.text(sql), params).one()
    finally:
        engine.dispose()


# ---- tenancy: what a Training Job sees and reaches, what a person without its DAG reaches (issue 29) ----------
def _admin_headers(deployment) -> dict[str, str]:
    return {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}


def _run_api(deployment, dag_id: str, run_id: str) -> str:
    from urllib.parse import quote

    return f"{deployment.url}/sat/api/jobs/{dag_id}/runs/{quote(run_id, safe='')}"


def _tenancy_log(deployment, runs) -> tuple[str, dict]:
    """The probing job's whole job.log, as a viewer of its DAG downloads it, and what its probe printed in it."""
    run = runs["tenancy"]
    assert run.state == "success", run
    log = requests.get(_run_api(deployment, TENANCY, run.dag_run_id) + "/log", headers=_admin_headers(deployment),
                       timeout=60)
    assert log.status_code == 200, log.text[:500]
    printed = [line.partition(PROBE_MARK)[2] for line in log.text.splitlines() if PROBE_MARK in line]
    assert len(printed) == 1, log.text[-3000:]
    return log.text, json.loads(printed[0])


def _objects(stack: ServiceStack, bucket: str, prefix: str = "") -> dict[str, str]:
    """Every object under `prefix` with its ETag, read with the service's keys."""
    pages = stack.storage.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _sha256(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def test_a_training_job_sees_none_of_the_services_secrets(deployment, api, runs):
    """Its command prints its whole environment into job.log: none of the values the components run with is there
    (the JWT secret, the Fernet key, the API secret key, the metadata DB URL and password, the Object Storage keys
    and connection, the admin password and its file's path), nor in its launch task's log, and no variable of
    theirs beyond the allow-list."""
    from sat_tasks.core.runtime_env import HOST_ENV_ALLOWED

    text, probe = _tenancy_log(deployment, runs)
    launch_log = _launch_log(api, runs["tenancy"].dag_run_id)
    assert PROBE_MARK in launch_log  # the training's output is there too
    text += launch_log
    kept = json.loads((deployment.home / SECRETS_FILE).read_text())
    component = deployment.environment()  # what the API server, the scheduler and their tasks run with
    assert (component["AIRFLOW__API_AUTH__JWT_SECRET"], component["AIRFLOW__CORE__FERNET_KEY"],
            component["AIRFLOW__API__SECRET_KEY"]) == (kept["jwt_secret"], kept["fernet_key"], kept["api_secret_key"])
    people = Path(component["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    service = {**{f"{SECRETS_FILE}: {name}": value for name, value in kept.items()},
               **{f"{people.name}: {name}": value for name, value in json.loads(people.read_text()).items()},
               "the metadata DB URL": component["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
               "the Object Storage connection": component["AIRFLOW_CONN_SAT_OBJECT_STORAGE"],
               "the Object Storage secret key": deployment.storage.secret_key,
               "the admin password file's path": str(people),
               "the default password file's path": str(deployment.home / PASSWORDS_FILE),
               "the registry password": REGISTRY_PASSWORD}
    assert all(service.values()) and deployment.storage.secret_key in service["the Object Storage connection"]
    assert deployment.storage.secret_key == kept["object_storage_secret"]  # the deployment's own, kept
    env = probe["env"]
    seen = [text, *env.values()]  # the log, and each value as the probe had it (the log holds them JSON-escaped)
    assert [name for name, value in service.items() if any(value in where for where in seen)] == []

    assert env["SAT_JOB_NAME"] == TENANCY and env["CKPT_MIRROR_URL"].endswith("/checkpoints/")  # the contract: there
    assert [name for name in env if name.upper().startswith("AIRFLOW")] == []
    # Its Object Storage keys are STS's temporary ones, not the service's (the values: digests in the log).
    assert env["AWS_ACCESS_KEY_ID"] != LOCAL_ACCESS_KEY and LOCAL_ACCESS_KEY not in env.values()
    assert env["AWS_SECRET_ACCESS_KEY"].startswith("sha256:") and env["AWS_SESSION_TOKEN"].startswith("sha256:")
    assert env["AWS_SECRET_ACCESS_KEY"] != _sha256(deployment.storage.secret_key)
    # Nothing else of the components' environment, unless allowed (runtime_env.HOST_ENV_ALLOWED), set by the
    # runtime contract to the same value, or bash's own.
    same_by_itself = {"PYTHONUNBUFFERED", "HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                      "PWD", "OLDPWD", "SHLVL", "_"}
    inherited = sorted(name for name, value in env.items() if component.get(name) == value
                       and name not in HOST_ENV_ALLOWED | same_by_itself and not name.startswith("LC_"))
    assert inherited == []


# Each with the job's own credentials, answered by the embedded store's gate (sat_tasks/io/s3_gate.py).
OWN_RUN_PROBES = ("list its data", "read its data", "write its own results", "read its own results",
                  "list its own results", "delete its own results")


def test_a_training_job_reaches_only_its_own_runs_objects(deployment, runs):
    """Allowed: its data and its own results prefix. Refused by the store (AccessDenied), and nothing of it landed:
    writing its data or scripts, reading, listing, writing, stopping, copying or deleting another run of its job or
    a generic-DAG twin of the same name, another bucket, listing the bucket or the buckets, a new bucket, STS; and,
    as the service (its key id, a made-up secret: SignatureDoesNotMatch), another run's results and moto's reset."""
    _, probe = _tenancy_log(deployment, runs)
    answers = probe["probes"]
    assert {name: answers.get(name) for name in OWN_RUN_PROBES} == dict.fromkeys(OWN_RUN_PROBES, "allowed")
    refused = {name: answer for name, answer in answers.items() if name not in OWN_RUN_PROBES}
    assert len(refused) >= 26, answers  # every probe of tenancy_probe.py ran (its own records: issue 44.5)
    sts = "get wider credentials from STS"
    assert answers[sts] in ("AccessDenied", "HTTP 403"), answers  # moto's STS error shape: a 403 without a code
    # Issue 42's co-tenant: the service's key id with a made-up secret fails the signature check (ADR 0037).
    forged = {"read another run's results as the service", "write another run's results as the service",
              "reset the store as the service"}
    assert {name: answers.get(name) for name in forged} == dict.fromkeys(forged, "SignatureDoesNotMatch")
    assert {name: answer for name, answer in refused.items() if name not in forged | {sts}} == \
        dict.fromkeys(set(refused) - forged - {sts}, "AccessDenied")

    planted = {key: etag for bucket in (BUCKET, OTHER_BUCKET) for key, etag in _objects(deployment, bucket).items()
               if "planted" in key or "tenancy-probe/" in key}
    assert planted == {}  # not written, copied, or left behind (its own probe object: deleted, as allowed)
    targets = _tenancy_targets()
    for target in ("SAT_PROBE_OTHER_RUN", "SAT_PROBE_TWIN_RUN"):
        prefix = targets[target][len(f"s3://{BUCKET}/"):]
        assert list(_objects(deployment, BUCKET, prefix)) == [prefix + "victim.txt"], target  # no stop.json, ...
        assert deployment.storage.client().get_object(Bucket=BUCKET, Key=prefix + "victim.txt")["Body"].read() \
            == VICTIM
    buckets = {b["Name"] for b in deployment.storage.client().list_buckets()["Buckets"]}
    assert OTHER_BUCKET in buckets and "sat-tenancy-planted" not in buckets
    assert list(_objects(deployment, OTHER_BUCKET)) == ["victim.txt"]


def _launch_log(api, run_id: str) -> str:
    """The tenancy job's launch task log, as the API server serves it (SAT's notes, the training's output)."""
    from airflow_client.client.api.task_instance_api import TaskInstanceApi

    answer = TaskInstanceApi(api).get_log(TENANCY, run_id, "attempt_1.launch", 1, full_content=True)
    return "\n".join(line if isinstance(line, str) else str(line.event) for line in answer.content.actual_instance)


def test_a_training_job_with_scoped_credentials_mirrors_its_checkpoints_and_completes(deployment, api, runs):
    """The same credentials carried its checkpoints to its own prefix: the engine's mirror, with manifests."""
    _tenancy_log(deployment, runs)
    run = runs["tenancy"]
    prefix = _key_prefix(TENANCY, run.dag_run_id)
    # SAT's, in the launch log: the training writes its checkpoints, metrics and outputs only (ADR 0039)
    note = f"Object Storage credentials scoped to checkpoints/, metrics/, output/ of s3://{BUCKET}/{prefix} (read-write)"
    assert note in _launch_log(api, run.dag_run_id)
    report = _report(deployment, TENANCY, run.dag_run_id)
    assert report["status"] == "Completed" and report["global_step"] == TENANCY_STEPS, report
    assert [attempt["verdict"] for attempt in report["attempts"]] == ["SUCCEEDED"]
    mirror = prefix + "checkpoints/"
    mirrored = _objects(deployment, BUCKET, mirror)
    steps = {int(m.group(1)) for key in mirrored if (m := re.match(r"checkpoint-(\d+)/", key[len(mirror):]))}
    assert {10, TENANCY_STEPS} <= steps, sorted(mirrored)
    page = requests.get(_run_api(deployment, TENANCY, run.dag_run_id), headers=_admin_headers(deployment),
                        timeout=60).json()
    newest = page["checkpoints"]["steps"][0]
    assert (newest["step"], newest["mirrored"], newest["verified"]) == (TENANCY_STEPS, True, True), newest


def _outsider_password(stack: ServiceStack, who: str = OUTSIDER) -> str:
    return json.loads((stack.home.parent / "people.json").read_text())[who]


def _view_run_routes(deployment, headers: dict[str, str]) -> list[tuple[str, str]]:
    """Every /sat route that names a run, from the API server's own description of the view (a later one counts)."""
    response = requests.get(f"{deployment.url}/sat/openapi.json", headers=headers, timeout=60)
    assert response.status_code == 200, response.text[:300]
    return [(method.upper(), "/sat" + path) for path, operations in response.json()["paths"].items()
            if "{dag_id}" in path and "{run_id}" in path for method in sorted(operations)]


def test_a_person_without_the_dags_permissions_neither_reads_nor_acts_on_its_runs(deployment, runs):
    """`outsider` (logged in through the API server like anyone) against the probing job's finished run: every /sat
    route that names a run, and Airflow's REST API for the DAG, its runs, task instances, logs and XComs, are refused
    (403); the lists do not show it; its run and its objects are as they were. The admin reads it (the routes are
    there). The same per route against a victim's run, and a twin run of the generic DAG, in process:
    tests/security/test_view_requests.py (issue 29.4)."""
    from urllib.parse import quote

    run_id = runs["tenancy"].dag_run_id
    admin = _admin_headers(deployment)
    outsider = {"Authorization": f"Bearer {_token(deployment.url, _outsider_password(deployment), OUTSIDER)}",
                "Origin": deployment.url}
    before = _objects(deployment, BUCKET, _key_prefix(TENANCY, run_id))
    assert before and requests.get(_run_api(deployment, TENANCY, run_id), headers=admin, timeout=60).status_code == 200

    run = quote(run_id, safe="")
    dag = f"/api/v2/dags/{TENANCY}"
    routes = [(method, path.replace("{dag_id}", TENANCY).replace("{run_id}", run)
               .replace("{name}", "job.log")) for method, path in _view_run_routes(deployment, admin)]
    assert len(routes) >= 12, routes  # the page, its JSON, log, files, report, stop, tags, delete, clone, re-run
    routes += [("GET", dag), ("GET", f"{dag}/details"), ("PATCH", dag), ("DELETE", dag), ("GET", f"{dag}/dagRuns"),
               ("POST", f"{dag}/dagRuns"), ("GET", f"{dag}/dagRuns/{run}"), ("PATCH", f"{dag}/dagRuns/{run}"),
               ("DELETE", f"{dag}/dagRuns/{run}"), ("POST", f"{dag}/dagRuns/{run}/clear"),
               ("GET", f"{dag}/dagRuns/{run}/taskInstances"), ("POST", f"{dag}/clearTaskInstances"),
               ("GET", f"{dag}/dagRuns/{run}/taskInstances/attempt_1.launch/logs/1"),
               ("GET", f"{dag}/dagRuns/{run}/taskInstances/validate_spec/xcomEntries")]
    bodies = {"PATCH": {"state": "failed", "is_paused": True}, "POST": {"tags": {"team": "outsiders"},
                                                                         "logical_date": None, "dry_run": False}}
    answered = {(method, path): requests.request(method, deployment.url + path, headers=outsider,
                                                 json=bodies.get(method), timeout=60, allow_redirects=False)
                for method, path in routes}
    assert {route: r.status_code for route, r in answered.items() if r.status_code != 403} == {}
    assert [route for route, r in answered.items() if PROBE_MARK.strip() in r.text] == []  # nothing of its log

    def listed(path: str, rows: str, headers: dict[str, str]) -> set[str]:
        """The DAG ids of what a list shows `headers`' person."""
        response = requests.get(deployment.url + path, params={"limit": 100}, headers=headers, timeout=60)
        assert response.status_code == 200, (path, response.text[:300])
        return {row["dag_id"] for row in response.json()[rows]}

    for path, rows in (("/sat/api/jobs", "jobs"), ("/api/v2/dags/~/dagRuns", "dag_runs"), ("/api/v2/dags", "dags")):
        seen = listed(path, rows, outsider)
        assert seen and TENANCY not in seen, (path, seen)  # the other DAGs' runs: theirs to see
        assert TENANCY in listed(path, rows, admin), path  # the admin's list has it: the check above means something

    assert _objects(deployment, BUCKET, _key_prefix(TENANCY, run_id)) == before  # no stop.json, tags, deletion
    after = requests.get(f"{deployment.url}{dag}/dagRuns/{run}", headers=admin, timeout=60).json()
    assert after["state"] == "success" and len(requests.get(
        f"{deployment.url}{dag}/dagRuns", headers=admin, timeout=60).json()["dag_runs"]) == 1
    assert requests.get(f"{deployment.url}{dag}", headers=admin, timeout=60).json()["is_paused"] is False


def test_another_person_neither_sees_nor_acts_on_a_create_made_job(deployment, runs):
    """Issue 44.4 under `sat up` (ADR 0043): the demo job the admin made with Create is a run of the generic DAG,
    which `bob` (role `user`) may read in Airflow. In the view it is the admin's: every /sat route naming it refuses
    bob (404 where he passes the DAG's permission, 403 where he lacks the action's), his list does not show it, and
    nothing of it changed. The admin's list has it, so the check means something."""
    from urllib.parse import quote

    run_id = runs["demo"].dag_run_id
    admin = _admin_headers(deployment)
    bob = {"Authorization": f"Bearer {_token(deployment.url, _outsider_password(deployment, PEER), PEER)}",
           "Origin": deployment.url}
    before = _objects(deployment, BUCKET, _key_prefix(DEMO_NAME, run_id, "sat_training_job"))
    assert before and requests.get(_run_api(deployment, "sat_training_job", run_id), headers=admin,
                                   timeout=60).status_code == 200
    routes = [(method, path.replace("{dag_id}", "sat_training_job").replace("{run_id}", quote(run_id, safe=""))
               .replace("{name}", "job.log")) for method, path in _view_run_routes(deployment, admin)]
    answered = {(method, path): requests.request(method, deployment.url + path, headers=bob, timeout=60,
                                                 json={"tags": {"team": "bob"}} if method == "PUT" else None,
                                                 allow_redirects=False)
                for method, path in routes}
    assert {route: r.status_code for route, r in answered.items() if r.status_code not in (403, 404)} == {}
    assert any(r.status_code == 404 for r in answered.values())  # the ownership check, not only the role's
    assert [route for route, r in answered.items() if "--max_steps 80" in r.text] == []  # nothing of its spec
    compare = requests.get(f"{deployment.url}/sat/api/compare", headers=bob, timeout=60, params={
        "run": [f"sat_training_job/{run_id}", f"sat_training_job/{runs['generic'].dag_run_id}"]})
    assert compare.status_code == 404, compare.text[:300]

    def listed(headers: dict[str, str]) -> set[str]:
        response = requests.get(f"{deployment.url}/sat/api/jobs", params={"limit": 100}, headers=headers, timeout=60)
        assert response.status_code == 200, response.text[:300]
        return {row["run_id"] for row in response.json()["jobs"]}

    assert run_id not in listed(bob) and run_id in listed(admin)
    assert _objects(deployment, BUCKET, _key_prefix(DEMO_NAME, run_id, "sat_training_job")) == before


# ---- the Training Jobs API (plugins/sat_training_jobs.py) ---------------------------------------------
@pytest.mark.parametrize("path", ["/sat/api/jobs", "/sat/api/jobs/tiny-llama-demo/runs/any",
                                  "/sat/api/jobs/tiny-llama-demo/runs/any/log", "/sat/jobs"])
def test_the_training_jobs_api_needs_a_login(deployment, path):
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        response = requests.get(deployment.url + path, headers=headers, timeout=30, allow_redirects=False)
        if path.startswith("/sat/api/") or headers:
            assert response.status_code in (401, 403), (path, response.status_code, response.text[:200])
        else:  # a page sends a person without a login to Airflow's login page, which comes back to it
            assert response.status_code == 303 and response.headers["location"].startswith("/auth/login?next=")


def test_the_training_jobs_api_lists_and_shows_the_demo_run(deployment, runs):
    headers = {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}
    demo_run = runs["demo"].dag_run_id
    response = requests.get(f"{deployment.url}/sat/api/jobs", headers=headers, timeout=60)
    assert response.status_code == 200, response.text[:500]
    rows = {(row["dag_id"], row["run_id"]): row for row in response.json()["jobs"]}
    demo = rows[("sat_training_job", demo_run)]
    assert (demo["status"], demo["attempt"], demo["last_checkpoint_step"]) == ("Completed", 2, 80)
    assert ("sat_training_job", runs["generic"].dag_run_id) in rows  # a job created from the form
    assert rows[("svc-cron", runs["cron"].dag_run_id)]["schedule"] == CRON
    started = [row["started"] for row in response.json()["jobs"]]
    queued = started.count(None)  # not started yet: the newest of all, on top
    assert started[:queued] == [None] * queued and started[queued:] == sorted(started[queued:], reverse=True)
    running = requests.get(f"{deployment.url}/sat/api/jobs", params={"status": "Running"}, headers=headers,
                           timeout=60).json()["jobs"]
    assert all(row["status"] == "Running" for row in running)

    page = requests.get(f"{deployment.url}/sat/api/jobs/sat_training_job/runs/{demo_run}", headers=headers,
                        timeout=60)
    assert page.status_code == 200, page.text[:500]
    page = page.json()
    assert [entry["status"] for entry in page["history"]][-1] == "Completed"
    first, second = page["attempts"]
    assert (first["verdict"], second["verdict"]) == ("HARDWARE", "SUCCEEDED")
    assert any("Xid" in line for line in first["evidence"]) and second["resumed_from_step"] == first[
        "last_committed_step"]
    assert 80 in page["checkpoints"]["committed_steps"]
    missing = requests.get(f"{deployment.url}/sat/api/jobs/tiny-llama-demo/runs/no-such-run", headers=headers,
                           timeout=60)
    assert missing.status_code == 404

    # The same as the HTML view behind the menu entry "Training Jobs".
    html = requests.get(f"{deployment.url}/sat/jobs", headers=headers, timeout=60)
    assert html.status_code == 200 and "text/html" in html.headers["content-type"]
    assert DEMO_NAME in html.text and "Completed" in html.text
    view = requests.get(f"{deployment.url}/sat/jobs/sat_training_job/runs/{demo_run}", headers=headers, timeout=60)
    assert view.status_code == 200 and "HARDWARE" in view.text and "Xid" in view.text
    anonymous = requests.get(f"{deployment.url}/sat/jobs", timeout=60, allow_redirects=False)  # a page: to the login
    assert anonymous.status_code in (302, 303, 307) and "login" in anonymous.headers["location"], anonymous.headers

    # The Logs tab: the single job log across attempts, as a download.
    log_url = f"{deployment.url}/sat/api/jobs/sat_training_job/runs/{demo_run}/log"
    assert "/sat/api/jobs/sat_training_job/runs/" in view.text and "download job.log" in view.text
    log = requests.get(log_url, headers=headers, timeout=60)
    assert log.status_code == 200 and "attachment" in log.headers["content-disposition"]
    assert log.text.count("Starting dataset initialization") == 2  # one per attempt
    assert requests.get(log_url, timeout=60).status_code in (401, 403)


def test_a_person_logs_in_and_reads_the_training_jobs_view(deployment, runs, browser):
    page = _logged_in_page(deployment, browser)
    page.get_by_text("Training J").first.wait_for()  # the UI has rendered its navigation, our entry in it
    health = requests.get(f"{deployment.url}/api/v2/monitor/health", timeout=30).json()  # the panel's source
    assert {name: health[name]["status"] for name in ("metadatabase", "scheduler", "triggerer", "dag_processor")} \
        == dict.fromkeys(("metadatabase", "scheduler", "triggerer", "dag_processor"), "healthy"), health
    page.screenshot(path=str(SCREENSHOTS / "01-airflow-home.png"))

    page.goto(f"{deployment.url}/sat/jobs")  # what the "Training Jobs" menu entry shows
    page.get_by_role("link", name=DEMO_NAME).first.wait_for()
    demo_row = page.locator(f"tr.job-row[data-job='{DEMO_NAME}']").first.inner_text()
    assert "Completed" in demo_row and "team=platform" in demo_row and "purpose=demo" in demo_row, demo_row
    page.screenshot(path=str(SCREENSHOTS / "02-training-jobs.png"), full_page=True)

    page.get_by_role("link", name=DEMO_NAME).first.click()
    details = page.inner_text("#details")
    assert "Pending - failoverinprogress" in details and "Completed" in details
    page.screenshot(path=str(SCREENSHOTS / "03-job-page.png"), full_page=True)
    page.get_by_role("link", name="Attempts", exact=True).click()
    attempts = page.inner_text("#attempts")
    assert "HARDWARE" in attempts and "GPU has fallen off the bus" in attempts and "SUCCEEDED" in attempts
    assert "Xid" in attempts
    recovery = page.inner_text("#recovery")  # the failover's recovery by phase, from the run's report
    assert "1 (" in recovery and "HARDWARE" in recovery and "2 (" in recovery, recovery
    assert all(phase in recovery for phase in ("Detect", "Schedule", "Start", "Restore", "First step")), recovery
    assert re.search(r"\d+\.\d s", recovery) and "unknown" not in recovery, recovery
    page.screenshot(path=str(SCREENSHOTS / "03b-attempts.png"), full_page=True)
    page.get_by_role("link", name="Checkpoints", exact=True).click()
    checkpoints = page.inner_text("#checkpoints")
    assert "80" in checkpoints and "MiB" in checkpoints and "checksums checked on the copy" in checkpoints
    rows = page.locator("#checkpoints tbody tr")
    assert rows.count() >= 1 and "yes\tyes" in rows.first.inner_text()  # mirrored, verified
    page.screenshot(path=str(SCREENSHOTS / "03c-checkpoints.png"), full_page=True)
    page.get_by_role("link", name="Monitoring", exact=True).click()
    page.locator("#loss-chart svg").wait_for()
    assert page.locator("#loss-chart .marker").first.text_content().startswith("attempt 2 after HARDWARE")
    assert page.locator("#rate-chart svg").count() == 1
    report = page.frame_locator("#report-frame")  # the job report's plots from the run's metrics series
    report.locator("img").first.wait_for()
    assert report.locator("img").count() >= 3 and "local-node-1" in report.locator("table").first.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "03d-monitoring.png"), full_page=True)
    page.get_by_role("link", name="Logs", exact=True).click()
    log = page.request.get(deployment.url + page.get_by_role("link", name="download job.log").get_attribute("href"))
    assert log.ok and log.text().count("Starting dataset initialization") == 2  # one per attempt
    page.get_by_role("link", name="Tags", exact=True).click()
    page.fill("#tags-text", "team=platform\npurpose=demo\nreviewed=yes")
    page.get_by_role("button", name="Save tags").click()
    expect(page.locator("#tags table")).to_contain_text("reviewed", timeout=60_000)  # saved in place (job_tags.js)
    page.screenshot(path=str(SCREENSHOTS / "03e-tags.png"), full_page=True)

    page.goto(f"{deployment.url}/plugin/training-jobs")  # the view inside Airflow's UI, from its navigation
    frame = page.frame_locator("iframe")
    frame.get_by_text("Training Jobs").first.wait_for()
    page.screenshot(path=str(SCREENSHOTS / "04-training-jobs-in-airflow.png"))
    # The same demo's recovery by phase, reached as a person does inside Airflow's navigation.
    frame.get_by_role("link", name=DEMO_NAME).first.click()
    frame.locator("#details").wait_for()
    frame.get_by_role("link", name="Attempts", exact=True).click()
    embedded = frame.locator("#recovery").inner_text()
    assert all(phase in embedded for phase in ("Detect", "Schedule", "Start", "Restore", "First step")), embedded
    assert "HARDWARE" in embedded and re.search(r"\d+\.\d s", embedded) and "unknown" not in embedded, embedded
    frame.locator("#recovery").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "04b-recovery-in-airflow.png"))
    page.close()


def test_create_with_a_bad_name_shows_the_rule_next_to_the_field_and_starts_nothing(runs):
    bad = runs["browser"]["demo"]["bad_name"]
    assert bad["error"].startswith("name: must be 3-63 chars of lowercase letters"), bad
    assert bad["url"].endswith("/sat/jobs/new") and bad["runs_after"] == set()


def test_a_created_job_opens_its_page_which_follows_the_status(runs):
    created = runs["browser"]["demo"]
    assert "/sat/jobs/sat_training_job/runs/" in created["page_url"]
    before, after = created["status_words"]
    assert before != after and after in ("Running", "Pending - failoverinprogress", "Completed"), created


def test_a_person_stops_a_job_then_deletes_it_keeping_its_results(deployment, runs):
    stopped = runs["browser"]["stopped"]
    assert stopped["state"] == "failed"  # the run ended
    assert "Running" in stopped["history"]  # the image check passed with the login typed in the form
    assert "Stopped" in stopped["history"] and "stopped by admin at " in stopped["history"]
    assert "stopped by admin" in stopped["attempts"]  # the attempt's training got the SIGTERM
    assert "STOPPED" in stopped["attempts"] and "HARDWARE" not in stopped["attempts"]  # a person's stop, not the node
    assert "results were kept" in stopped["deleted"]
    assert "svc-stop" not in stopped["listed"] and not stopped["in_airflow"]
    kept = deployment.storage.client().list_objects_v2(
        Bucket=BUCKET, Prefix=_key_prefix("svc-stop", stopped["run_id"], "sat_training_job"))
    assert kept.get("KeyCount", 0) > 0


# ---- Training Workspaces (ADR 0015) in the browser -------------------------------------------------------
def test_a_person_creates_edits_and_deletes_a_workspace_from_airflows_navigation(deployment, api, browser):
    """Workspaces in Airflow's navigation: a bad name (the rule under its field, nothing created), then 2 nodes, 3,
    a Delete refused while a job holds the nodes (the local slot board, held by this process), then deleted.
    Each change sets the Airflow pool sat-workspace-<name>."""
    from datetime import date

    from airflow_client.client.api.pool_api import PoolApi
    from airflow_client.client.exceptions import NotFoundException

    from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore

    def pool_slots() -> int | None:
        try:
            return _retrying(lambda: PoolApi(api).get_pool("sat-workspace-team-vision")).slots
        except NotFoundException:
            return None

    store = WorkspaceStore(deployment.home.parent / "workspaces")  # the deployment's [sat] workspaces_dir
    page = _logged_in_page(deployment, browser)
    page.locator("a[href$='plugin/workspaces']").click()  # the "Workspaces" entry of Airflow's navigation
    page.wait_for_url("**/plugin/workspaces")
    frame = page.frame_locator("iframe")
    frame.get_by_role("heading", name="Training Workspaces").wait_for()
    assert page.locator("a[href$='plugin/workspaces']").inner_text().strip() == "Workspaces"
    page.screenshot(path=str(SCREENSHOTS / "12-workspaces-in-airflow.png"))

    today = date.today()
    for name, value in {"name": "Team Vision", "description": "vision team: nightly detector training", "nodes": "2",
                        "contract.start": today.isoformat(), "contract.end": f"{today.year + 1}-12-31"}.items():
        frame.locator(f"[name='{name}']").fill(value)
    frame.get_by_role("button", name="Create Workspace").click()
    error = frame.locator("[id='error-name']")
    error.wait_for()
    assert error.inner_text().startswith("name: must be 1-63 chars of lowercase letters")
    assert frame.locator("#name").input_value() == "Team Vision"  # what the person typed stays
    assert store.list() == [] and pool_slots() is None  # nothing was created
    page.screenshot(path=str(SCREENSHOTS / "13-workspace-bad-name.png"))

    frame.locator("#name").fill("team-vision")
    frame.get_by_role("button", name="Create Workspace").click()
    row = frame.locator("#ws-team-vision")
    row.wait_for()
    assert frame.locator("#notice").inner_text() == "workspace team-vision created: 2 node(s)"
    assert "0 of 2" in row.inner_text() and "vision team" in row.inner_text()
    assert store.get("team-vision").nodes == 2 and pool_slots() == 2

    board = SlotBoard("team-vision", root=deployment.work_dir / "workspaces")  # a job holds both nodes
    ticket = board.enqueue(job="detector-nightly", run_id="manual__e2e", attempt=1, slots=2)
    assert board.poll(store.get("team-vision"), ticket).admitted
    try:
        frame.get_by_label("Nodes", exact=True).fill("3")
        frame.get_by_role("button", name="Save node count").click()
        expect(frame.locator("#notice")).to_have_text(  # each change also sets the Airflow pool: slow under load
            "workspace team-vision: 3 node(s) from the next job that starts", timeout=60_000)
        assert "2 of 3" in row.inner_text() and "detector-nightly (2 node(s))" in row.inner_text()
        assert store.get("team-vision").nodes == 3 and pool_slots() == 3
        page.screenshot(path=str(SCREENSHOTS / "14-workspace-edited.png"))

        row.get_by_role("button", name="Delete").click()  # asks first
        frame.locator("#confirm-delete").click()
        refusal = frame.locator("#refusal")
        refusal.wait_for()
        assert "detector-nightly (manual__e2e, running" in refusal.inner_text()
        assert store.get("team-vision").nodes == 3 and pool_slots() == 3
        page.screenshot(path=str(SCREENSHOTS / "15-workspace-delete-refused.png"))
    finally:
        board.release(ticket)

    frame.locator("#ws-team-vision").get_by_role("button", name="Delete").click()
    frame.locator("#confirm-box").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "16-workspace-delete-confirm.png"))
    frame.locator("#confirm-delete").click()
    expect(frame.locator("#notice")).to_have_text("workspace team-vision deleted", timeout=60_000)
    assert frame.locator("#ws-team-vision").count() == 0 and "No Training Workspaces yet" in frame.locator(
        "body").inner_text()
    assert store.list() == [] and pool_slots() is None
    page.close()


# ---- the node health ledger in the browser (issue 27) -----------------------------------------------------
def test_a_person_reads_the_node_health_ledger_and_releases_a_node_from_airflows_navigation(deployment, runs,
                                                                                              browser):
    """The Nodes page inside Airflow's navigation lists what the ledger holds (the demo's injected Xid 79 at least);
    a second job's fault on that node (written here as another job's classify would) quarantines it; a person
    releases it from the page and the API then agrees."""
    from sat_tasks.core.node_health import FaultEvent

    headers = {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}

    def ledger() -> dict[str, bool]:
        response = requests.get(f"{deployment.url}/sat/api/nodes", headers=headers, timeout=30)
        response.raise_for_status()
        return {node["node"]: node["quarantined"] for node in response.json()["nodes"]}

    demo_nodes = ledger()
    assert demo_nodes, "the demo job's injected hardware fault is in the node health ledger"
    node = min(demo_nodes)
    other = FaultEvent(node=node, at=time.time(), job="co-tenant", run_id="manual__e2e", attempt=1, kind="HARDWARE",
                       signature="xid 79", evidence=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."])
    # the ledger's layout (sat_tasks/io/node_ledger.py) under the demo's results destination
    deployment.storage.client().put_object(
        Bucket=BUCKET, Key=f"results/_node-health/nodes/{node}/events/{int(other.at * 1000):015d}-e2e-a1-hardware.json",
        Body=other.model_dump_json().encode())
    nodes = ledger()
    assert nodes[node] is True, nodes  # faults of two different jobs on one node: quarantined

    page = _logged_in_page(deployment, browser)
    page.locator("a[href$='plugin/nodes']").click()  # the "Nodes" entry of Airflow's navigation
    page.wait_for_url("**/plugin/nodes**")
    frame = page.frame_locator("iframe")
    frame.get_by_role("heading", name="Nodes", exact=True).wait_for()
    rows = frame.locator("tr[data-node]")
    assert {rows.nth(i).get_attribute("data-node") for i in range(rows.count())} == set(nodes)
    assert "quarantined" in frame.locator(f"tr[data-node='{node}']").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "17-nodes-in-airflow.png"))
    frame.locator(f"tr[data-node='{node}'] input[name='note']").fill("GPU reseated")
    frame.locator(f"tr[data-node='{node}']").get_by_role("button", name="Release").click()
    frame.get_by_text(f"Released {node}").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "18-node-released.png"))
    page.close()
    assert ledger()[node] is False


# ---- issue 30 items 4 and 6 inside Airflow's navigation ------------------------------------------------
def _frame_of(page, part: str):
    """The embedded view's frame (Playwright's Frame, which can be sent to a URL) once it shows `part`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # not the main frame: Airflow's own address ends with the view's path too (/plugin/<entry>/sat/...)
        found = next((f for f in page.frames if f != page.main_frame and part in f.url), None)
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no frame at {part}: {[f.url for f in page.frames]}")


def test_the_views_refusals_say_what_to_do_inside_airflow(deployment, api, runs, browser):
    """Issue 30.4 in the embedded view: Spot disables Job failover; a workspace that does not exist is refused under
    its field and nothing starts; an empty filter says no job matches; a deleted run is a not-found page; without a
    login, Airflow's login page. On an ended run's Tags tab a refused edit (a key breaking the rule, 51 tags) shows
    its rule under the field, on the Tags tab, with what was typed; the corrected edit saves and the API agrees."""
    from urllib.parse import quote

    from sat_tasks.core.links import path_segment

    headers = {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}
    page = _logged_in_page(deployment, browser)
    try:
        page.locator("a[href$='plugin/create-training-job']").click()  # the Create form in Airflow's navigation
        frame = page.frame_locator("iframe")
        frame.get_by_role("heading", name="Create Training Job").wait_for()
        assert frame.locator("#job_failover").is_checked()
        frame.locator("#learning_type").select_option("spot")
        expect(frame.locator("#job_failover")).to_be_disabled()
        assert not frame.locator("#job_failover").is_checked()  # Spot jobs resume instead: the box says so
        page.screenshot(path=str(SCREENSHOTS / "22-create-spot-disables-failover.png"), full_page=True)
        frame.locator("#learning_type").select_option("on-demand")
        expect(frame.locator("#job_failover")).to_be_enabled()

        before = _generic_runs(api)
        for name, value in {"name": "svc-no-workspace", "workspace": "team-zz", "command": "python fake_train.py",
                            "storage.script_url": f"s3://{BUCKET}/scripts/fake_train.py"}.items():
            frame.locator(f"[name='{name}']").fill(value)
        frame.get_by_role("button", name="Create Training Job").click()
        error = frame.locator("[id='error-workspace']")
        error.wait_for()
        assert error.inner_text().startswith("workspace: no workspace named 'team-zz'"), error.inner_text()
        assert frame.locator("#workspace").input_value() == "team-zz" and _generic_runs(api) == before
        page.screenshot(path=str(SCREENSHOTS / "23-create-unknown-workspace.png"), full_page=True)

        # a page of another entry reached from the Create entry's frame moves Airflow's navigation to that entry
        # (airflow_view.js): "Training Jobs" is the current entry again, not "Create Training Job"
        # (the Create entry's frame is replaced by the Training Jobs entry's once the list loads: wait for Airflow's
        # address, not for that frame's load)
        _frame_of(page, "/sat/jobs/new").goto(f"{deployment.url}/sat/jobs?q=no-such-job-zzz", wait_until="commit")
        page.wait_for_url("**/plugin/training-jobs/sat/jobs?q=no-such-job-zzz", timeout=60_000)
        expect(frame.locator("#no-jobs")).to_contain_text("match these filters", timeout=60_000)
        page.screenshot(path=str(SCREENSHOTS / "33-list-from-the-create-entry-in-airflow.png"))
        deleted = quote(runs["browser"]["stopped"]["run_id"], safe="")
        # a fresh load through Airflow's address, as a shared link opens: one frame from here on
        page.goto(f"{deployment.url}/plugin/training-jobs/sat/jobs/sat_training_job/runs/{deleted}")
        frame.get_by_role("heading", name="Not found").wait_for()
        view = _frame_of(page, "/sat/jobs/sat_training_job/runs/")
        assert "The run may have been deleted" in frame.locator("#not-found").inner_text()
        page.screenshot(path=str(SCREENSHOTS / "25-deleted-run-not-found-in-airflow.png"))

        # spelled as the view's own links spell it (sat_tasks.core.links): with %3A/%2B, Airflow's navigation loaded
        # the frame again seconds later (its decoded route differed from the frame's address), losing the refusal
        demo = f"sat_training_job/runs/{path_segment(runs['demo'].dag_run_id)}"
        kept = requests.get(f"{deployment.url}/sat/api/jobs/{demo}", headers=headers, timeout=60).json()["tags"]
        kept_lines = [f"{key}={value}" for key, value in kept.items()]
        view.goto(f"{deployment.url}/sat/jobs/{demo}")
        frame.get_by_role("link", name="Tags", exact=True).click()
        fifty_one = "\n".join(f"k{i}=v" for i in range(51))
        for typed, rule in (("\n".join([*kept_lines, "bad key!=x", "owner=ana"]), "tags: key 'bad key!' must be"),
                            (fifty_one, "tags: at most 50 key/value pairs (got 51)")):
            frame.locator("#tags-text").fill(typed)
            frame.get_by_role("button", name="Save tags").click()
            errors = frame.locator("#tags-text + #tag-errors")  # under the field it is about
            expect(errors).to_contain_text(rule, timeout=60_000)
            assert "None" not in errors.inner_text(), errors.inner_text()
            expect(frame.locator("#tags")).to_be_visible()  # the Tags tab, not Details, after the refusal
            expect(frame.locator("#details")).to_be_hidden()
            assert frame.locator(".tabs a.active").inner_text().strip() == "Tags"
            assert frame.locator("#tags-text").input_value() == typed  # nothing typed is lost
            if typed != fifty_one:
                page.screenshot(path=str(SCREENSHOTS / "32-tags-edit-in-airflow.png"))
        assert requests.get(f"{deployment.url}/sat/api/jobs/{demo}", headers=headers,
                            timeout=60).json()["tags"] == kept  # nothing refused was saved
        frame.locator("#tags-text").fill("\n".join([*kept_lines, "reviewed-in=airflow"]))
        frame.get_by_role("button", name="Save tags").click()
        expect(frame.locator("#tags table")).to_contain_text("reviewed-in", timeout=60_000)
        expect(frame.locator("#tag-errors")).to_have_count(0)
        assert requests.get(f"{deployment.url}/sat/api/jobs/{demo}", headers=headers,
                            timeout=60).json()["tags"] == {**kept, "reviewed-in": "airflow"}
    finally:
        page.close()
    stranger = browser.new_context()
    try:
        anonymous = stranger.new_page()
        anonymous.goto(f"{deployment.url}/sat/jobs")  # no login: Airflow's login page, then back here
        anonymous.wait_for_url("**/auth/login**")
        anonymous.locator("input[name=username]").wait_for()
    finally:
        stranger.close()


def test_a_person_clones_reruns_and_stops_a_job_inside_airflow(deployment, api, runs, browser):
    """Issue 30.6 and Stop's confirmation in the embedded view: Clone opens the Create form filled in from a run
    (the registry password never, the registry connection kept); the copy starts under a new name; Stop asks
    first (Cancel stops nothing), then the attempt is STOPPED by the person through the view; Re-run starts the
    run's spec again as a new run."""
    from urllib.parse import quote

    from airflow_client.client.api.dag_run_api import DagRunApi

    headers = {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}

    def job_api(run_id: str) -> str:
        return f"{deployment.url}/sat/api/jobs/sat_training_job/runs/{quote(run_id, safe='')}"

    source = runs["generic"].dag_run_id  # svc-generic: its image on the password-protected registry
    page = _logged_in_page(deployment, browser)
    started: list[str] = []
    try:
        page.goto(f"{deployment.url}/plugin/training-jobs/sat/jobs/sat_training_job/runs/{quote(source, safe='')}")
        frame = page.frame_locator("iframe")
        frame.locator("#clone").click()
        frame.get_by_role("heading", name="Create Training Job").wait_for()
        assert "A copy of svc-generic" in frame.locator(".notice").inner_text()
        assert frame.locator("#name").input_value() == "svc-generic"
        assert frame.locator("#registry_password").input_value() == ""  # never copied
        advanced = json.loads(frame.locator("#advanced").input_value())
        assert advanced["image"]["registry_conn_id"] == "sat_registry_svc"  # pulls with the same login
        page.screenshot(path=str(SCREENSHOTS / "26-clone-form-in-airflow.png"), full_page=True)
        advanced["env"]["FAKE_STEPS"] = "100000"  # long enough to stop
        before = _generic_runs(api)
        frame.locator("#name").fill("svc-clone")
        frame.locator("#advanced").fill(json.dumps(advanced))
        frame.get_by_role("button", name="Create Training Job").click()
        frame.locator("#stop").wait_for()
        (clone,) = _generic_runs(api) - before
        started.append(clone)
        assert frame.locator("h1").inner_text().startswith("svc-clone")
        expect(frame.locator("#status")).to_have_text("Running", timeout=300_000)

        frame.locator("#stop").click()  # Stop asks first
        frame.locator("#confirm-stop").wait_for()
        page.screenshot(path=str(SCREENSHOTS / "27-stop-asks-first-in-airflow.png"))
        frame.locator("#cancel-stop").click()
        frame.locator("#stop").wait_for()
        assert requests.get(job_api(clone), headers=headers, timeout=60).json()["stop_requested"] is None
        frame.locator("#stop").click()
        frame.locator("#confirm-stop").click()
        frame.locator("#stop-notice").wait_for()
        assert _wait_for_run(api, "sat_training_job", clone, deadline=time.monotonic() + 300).state == "failed"
        stopped = requests.get(job_api(clone), headers=headers, timeout=60).json()
        assert stopped["status"] == "Stopped" and stopped["stop_requested"]["via"] == "the Training Jobs view"
        verdict = stopped["attempts"][-1]
        assert verdict["verdict"] == "STOPPED" and "node-side kill" not in (verdict["reason"] or ""), verdict
        assert verdict["evidence"][0].startswith("stop requested by admin at ")
        assert verdict["evidence"][0].endswith("through the Training Jobs view")

        page.goto(f"{deployment.url}/plugin/training-jobs/sat/jobs/sat_training_job/runs/{quote(source, safe='')}")
        before = _generic_runs(api)
        frame.locator("#rerun").click()
        deadline = time.monotonic() + 60
        while not _generic_runs(api) - before and time.monotonic() < deadline:
            time.sleep(1)
        (again,) = _generic_runs(api) - before
        started.append(again)
        runs_api = DagRunApi(api)
        assert runs_api.get_dag_run("sat_training_job", again).conf == runs_api.get_dag_run(
            "sat_training_job", source).conf  # the same spec again
        page.screenshot(path=str(SCREENSHOTS / "28-rerun-in-airflow.png"))
        assert requests.post(job_api(again) + "/stop", headers=headers, timeout=60).status_code == 202
        assert _wait_for_run(api, "sat_training_job", again, deadline=time.monotonic() + 300).state == "failed"
        assert requests.get(job_api(again), headers=headers, timeout=60).json()["stop_requested"]["via"] == \
            "the REST API"
    finally:
        page.close()
        for run_id in started:  # nothing of this test runs on into `sat down`
            requests.post(job_api(run_id) + "/stop", headers=headers, timeout=60)


def test_a_person_finds_jobs_by_search_filter_sort_and_page_inside_airflow(deployment, runs, browser):
    """Issue 30.7-8 in the embedded view at 1280 px: search by name, a status menu that applies at once, a sorted
    column, pages of 2 followed by their links; who created each job, GPU-hours, times relative in the browser's
    zone (no raw UTC with microseconds), and a list that fits the window."""
    import re

    page = _logged_in_page(deployment, browser)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.locator("a[href$='plugin/training-jobs']").click()  # the "Training Jobs" entry of Airflow's navigation
    page.wait_for_url("**/plugin/training-jobs")
    frame = page.frame_locator("iframe")
    frame.get_by_role("heading", name="Training Jobs").wait_for()

    frame.locator("#filter-q").fill(DEMO_NAME[len("tiny-"):])  # a part of the name
    frame.locator("#apply-filters").click()
    frame.locator("#clear-filters").wait_for()
    names = frame.locator("tr.job-row").evaluate_all("rows => rows.map(r => r.dataset.job)")
    assert names and set(names) == {DEMO_NAME}, names
    demo = frame.locator(f"tr.job-row[data-job='{DEMO_NAME}']").first
    cells = demo.inner_text().replace(runs["demo"].dag_run_id, "")  # the run id names its own time
    assert "admin" in cells and "Completed" in cells, cells  # created by, status
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d+", cells) and " UTC" not in cells, cells  # relative, local
    assert "ago" in demo.locator("time.when").first.inner_text()
    float(demo.locator(".gpu-hours").inner_text())  # GPU-hours, a number

    frame.locator("#clear-filters").click()
    frame.locator("#filter-status").select_option("Completed")  # a menu applies at once
    frame.locator("#filter-status option[value='Completed'][selected]").wait_for(state="attached")
    statuses = frame.locator("tr.job-row .status").all_inner_texts()
    assert statuses and set(statuses) == {"Completed"}, statuses
    frame.locator("th a[data-sort='job']").click()
    frame.locator("th a.sorted[data-sort='job']").wait_for()
    names = frame.locator("tr.job-row").evaluate_all("rows => rows.map(r => r.dataset.job)")
    assert names == sorted(names), names

    listing = _frame_of(page, "/sat/jobs")
    listing.goto(f"{deployment.url}/sat/jobs?per_page=2")  # small pages: the links take over
    total = int(re.search(r"of (\d+)", frame.locator("#list-summary").inner_text()).group(1))
    assert total > 2 and frame.locator("tr.job-row").count() == 2
    seen = set(frame.locator("tr.job-row .run-id").all_inner_texts())
    frame.locator("#page-next").click()
    frame.get_by_text("Page 2 of").wait_for()
    second = set(frame.locator("tr.job-row .run-id").all_inner_texts())
    assert second and not second & seen, (seen, second)
    fits = page.locator("iframe").element_handle().content_frame().evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    page.screenshot(path=str(SCREENSHOTS / "30-jobs-list-pages-in-airflow.png"))
    listing.goto(f"{deployment.url}/sat/jobs")
    frame.locator("tr.job-row").first.wait_for()
    page.screenshot(path=str(SCREENSHOTS / "31-jobs-list-in-airflow-1280.png"))
    assert fits, "the list is wider than a 1280 px window"
    page.close()


# ---- the job page inside Airflow: live log, outputs, links (issue 30 items 2, 3, 11) ---------------------
def test_a_person_follows_a_running_jobs_log_and_opens_its_files_report_and_grid_inside_airflow(deployment, api, runs,
                                                                                                browser):
    """Inside Airflow's navigation (the view's sandboxed iframe): a running job's Logs tab shows its log from the
    first attempt's marker on and follows new lines without a reload; the log downloads while the job runs; the
    finished demo's Outputs list its files with sizes and each downloads; "open the job report" opens in place and
    "Airflow grid and task logs" moves Airflow's own page (issue 30 items 2, 3, 11). No navigation is refused."""
    from urllib.parse import quote

    from airflow_client.client import TriggerDAGRunPostBody
    from airflow_client.client.api.dag_run_api import DagRunApi

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.spec import parse_spec

    headers = {"Authorization": f"Bearer {_token(deployment.url, _password(deployment))}"}
    ticking = parse_spec(_fast_spec("svc-live-log", env={**FAST_ENV, "FAKE_STEPS": "100000"},
                                    command="(for i in $(seq 1 100000); do echo tick $i; sleep 0.5; done) & "
                                            "python fake_train.py"))
    run_id = _retrying(lambda: DagRunApi(api).trigger_dag_run("sat_training_job", TriggerDAGRunPostBody(
        logical_date=None, conf=params_from_spec(ticking)))).dag_run_id
    job_api = f"{deployment.url}/sat/api/jobs/sat_training_job/runs/{quote(run_id, safe='')}"
    page = _logged_in_page(deployment, browser)
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text) if "Unsafe attempt" in message.text else None)
    try:
        frame = page.frame_locator("iframe")
        job_link = frame.get_by_role("link", name="svc-live-log").first
        listed_by = time.monotonic() + 180
        while True:  # the "Training Jobs" entry of Airflow's navigation; the list shows the run once it is indexed
            page.locator("a[href$='plugin/training-jobs']").click()
            frame.locator("table").first.wait_for()
            if job_link.count() or time.monotonic() > listed_by:
                break
            time.sleep(5)
        job_link.click()
        frame.locator("#status").wait_for()
        frame.get_by_role("link", name="Logs", exact=True).click()
        log = frame.locator("#job-log")
        expect(log).to_contain_text("tick 3", timeout=240_000)  # the job runs: its lines, while it runs
        assert "Starting dataset initialization" in frame.locator("#job-log .marker").first.inner_text()
        seen = log.inner_text()
        last = max(int(number) for number in re.findall(r"tick (\d+)", seen))
        expect(log).to_contain_text(f"tick {last + 1}", timeout=120_000)  # a new line comes without a reload
        frame.get_by_role("link", name="Logs", exact=True).click()  # a reload (a new status) opens on Details
        page.screenshot(path=str(SCREENSHOTS / "19-live-log-in-airflow.png"))
        with page.expect_download() as download:  # the whole log while the job runs (allow-downloads)
            frame.get_by_role("link", name="download job.log").click()
        whole = Path(download.value.path()).read_text()
        assert whole.count("Starting dataset initialization") == 1 and "tick 1\n" in whole
        assert requests.post(job_api + "/stop", headers=headers, timeout=60).status_code == 202
        assert _wait_for_run(api, "sat_training_job", run_id, deadline=time.monotonic() + 300).state == "failed"
        tail = requests.get(job_api + "/log/tail", headers=headers, timeout=60).json()
        assert tail["ended"] and "SIGTERM: final checkpoint" in requests.get(job_api + "/log", headers=headers,
                                                                             timeout=60).text

        from sat_tasks.core.links import path_segment

        demo = path_segment(runs["demo"].dag_run_id)  # as the view's links spell it
        page.goto(f"{deployment.url}/plugin/training-jobs/sat/jobs/sat_training_job/runs/{demo}")  # in the iframe
        frame.get_by_role("link", name="Outputs", exact=True).click()
        outputs = frame.locator("#outputs")
        expect(outputs).to_contain_text("Model and outputs")
        assert "Checkpoints" in outputs.inner_text() and "report.json" in outputs.inner_text()
        assert "KiB" in outputs.inner_text() or "MiB" in outputs.inner_text()
        page.screenshot(path=str(SCREENSHOTS / "20-outputs-in-airflow.png"))
        with page.expect_download() as download:
            frame.get_by_role("link", name="report.json", exact=True).click()
        assert json.loads(Path(download.value.path()).read_text())["status"] == "Completed"
        frame.get_by_role("link", name="Monitoring", exact=True).click()
        frame.locator("#report-link").click()  # opens in place: Airflow's address follows the iframe
        page.wait_for_url(f"**/plugin/training-jobs/sat/jobs/sat_training_job/runs/{demo}/report")
        frame.locator("img").first.wait_for()
        page.goto(f"{deployment.url}/plugin/training-jobs/sat/jobs/sat_training_job/runs/{demo}")
        frame.get_by_role("link", name="Airflow grid and task logs").click()  # Airflow's page, not inside the frame
        page.wait_for_url(f"**/dags/sat_training_job/runs/{demo}**")
        expect(page.locator("iframe")).to_have_count(0)
        page.get_by_text("finalize").or_(page.get_by_text(runs["demo"].dag_run_id)).first.wait_for()  # Airflow's page
        page.screenshot(path=str(SCREENSHOTS / "21-airflow-run-from-the-job-page.png"))
    finally:
        page.close()
    assert refused == []


# ---- restart: sat down, sat up (last: it stops the module's deployment) ------------------------------
def test_a_person_compares_two_runs_loss_curves_and_settings_inside_airflow(deployment, runs, browser):
    """Issue 45.7 in the embedded view: the demo run (a real Trainer's loss) beside the generic run, on one
    chart with shared axes, a row per run linking to its page, and the settings side by side with the
    differing rows marked; the env shows names only."""
    from urllib.parse import quote

    refs = [f"sat_training_job/{runs[key].dag_run_id}" for key in ("demo", "generic")]
    page = _logged_in_page(deployment, browser)
    try:
        page.locator("a[href$='plugin/training-jobs']").click()  # the list, from Airflow's navigation
        page.wait_for_url("**/plugin/training-jobs")
        frame = page.frame_locator("iframe")
        frame.get_by_role("heading", name="Training Jobs").wait_for()
        expect(frame.locator("#compare-selected")).to_be_disabled()  # nothing ticked yet
        frame.locator(f"input[name='run'][value='{refs[0]}']").check()
        expect(frame.locator("#compare-selected")).to_be_disabled()  # one is not a comparison
        frame.locator(f"input[name='run'][value='{refs[1]}']").check()
        frame.locator("#compare-selected").click()
        frame.get_by_role("heading", name="Compare runs").wait_for()
        assert frame.locator("#compare-problem").count() == 0
        assert frame.locator("#compare-runs tbody tr").count() == 2
        labels = frame.locator("#compare-runs tbody tr a").all_inner_texts()
        assert any(DEMO_NAME in label for label in labels) and any("svc-generic" in label for label in labels)
        assert frame.locator("polyline.run-line").count() >= 1  # the demo's Trainer logged its loss
        demo_row = frame.locator("#compare-runs tbody tr", has_text=DEMO_NAME).inner_text()
        assert "%" in demo_row, demo_row  # its goodput, as the list and its page show it
        job_row = frame.locator("#compare-settings tr.differs", has_text="Job")
        assert job_row.count() == 1  # the names differ
        env_row = frame.locator("#compare-settings tr", has_text="Environment (names)").inner_text()
        assert "FAKE_STEPS" in env_row and FAST_ENV["FAKE_STEP_SECONDS"] not in env_row  # names, no values
        page.screenshot(path=str(SCREENSHOTS / "34-compare-in-airflow.png"), full_page=True)
        frame.locator("#compare-runs tbody tr a").first.click()  # a row opens its run's page, inside Airflow
        frame.locator("#status").wait_for()
        assert "/plugin/training-jobs" in page.url
        page.goto(f"{deployment.url}/plugin/training-jobs/sat/compare?run={quote(refs[0], safe='')}")
        assert "name 2 to 6 runs" in page.frame_locator("iframe").locator("#compare-problem").inner_text()
    finally:
        page.close()


def test_a_person_stops_two_ticked_jobs_from_the_list_with_one_confirmation_inside_airflow(deployment, api, runs,
                                                                                            browser):
    """Issue 45.7 in the embedded view: two long jobs started through the REST API are ticked on the list, Stop
    selected shows them with what will happen (one confirmation), and both end Stopped through the Stop path."""
    from urllib.parse import quote

    from airflow_client.client import TriggerDAGRunPostBody
    from airflow_client.client.api.dag_run_api import DagRunApi

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.spec import parse_spec

    headers = _admin_headers(deployment)
    started = []
    for name in ("svc-bulk-a", "svc-bulk-b"):
        spec = parse_spec(_fast_spec(name, env={**FAST_ENV, "FAKE_STEPS": "100000"}))
        started.append(_retrying(lambda spec=spec: DagRunApi(api).trigger_dag_run("sat_training_job", TriggerDAGRunPostBody(
            logical_date=None, conf=params_from_spec(spec)))).dag_run_id)

    def job_api(run_id: str) -> str:
        return f"{deployment.url}/sat/api/jobs/sat_training_job/runs/{quote(run_id, safe='')}"

    page = _logged_in_page(deployment, browser)
    try:
        deadline = time.monotonic() + 300
        while not all(requests.get(job_api(r), headers=headers, timeout=60).json().get("status") == "Running"
                      for r in started):
            assert time.monotonic() < deadline, "the two jobs did not start"
            time.sleep(3)
        page.locator("a[href$='plugin/training-jobs']").click()
        page.wait_for_url("**/plugin/training-jobs")
        frame = page.frame_locator("iframe")
        frame.get_by_role("heading", name="Training Jobs").wait_for()
        expect(frame.locator("#stop-selected")).to_be_disabled()
        for run_id in started:
            frame.locator(f"input[name='run'][value='sat_training_job/{run_id}']").check()
        frame.locator("#stop-selected").click()
        frame.locator("#confirm-bulk").wait_for()
        assert frame.locator("tr.bulk-run:not(.skipped)").count() == 2
        assert all(requests.get(job_api(r), headers=headers, timeout=60).json()["stop_requested"] is None
                   for r in started)  # the confirmation changed nothing
        page.screenshot(path=str(SCREENSHOTS / "35-bulk-stop-asks-once-in-airflow.png"))
        frame.locator("#confirm-bulk").click()
        frame.locator("#back-to-list").wait_for()
        assert frame.locator("tr.bulk-run", has_text="stop requested").count() == 2
        page.screenshot(path=str(SCREENSHOTS / "36-bulk-stopped-in-airflow.png"))
        for run_id in started:
            assert _wait_for_run(api, "sat_training_job", run_id, deadline=time.monotonic() + 300).state == "failed"
            stopped = requests.get(job_api(run_id), headers=headers, timeout=60).json()
            assert stopped["status"] == "Stopped" and stopped["attempts"][-1]["verdict"] == "STOPPED", stopped
    finally:
        page.close()
        for run_id in started:  # nothing of this test runs on into `sat down`
            requests.post(job_api(run_id) + "/stop", headers=headers, timeout=60)


def test_sat_down_and_sat_up_keep_secrets_results_and_leave_no_process(deployment, runs, tmp_path):
    """`sat up` / `sat down` as `make up` / `make down` run them, on the same home: everything comes back."""
    password = _password(deployment)
    result_key = next(iter(deployment.storage.client().list_objects_v2(
        Bucket=BUCKET, Prefix=_key_prefix(DEMO_NAME, runs["demo"].dag_run_id, "sat_training_job"))["Contents"]))["Key"]
    storage_dir = deployment.storage.state_dir
    deployment.stop()  # the module's own stack: the CLI takes over the same home
    storage_port = free_port()
    env = {**os.environ, "AIRFLOW_HOME": str(deployment.home), "SAT_PORT": str(deployment.port),
           "SAT_STORAGE_PORT": str(storage_port), "SAT_STORAGE_DIR": str(storage_dir), "SAT_DB": "postgres"}
    sat = str(Path(sys.executable).with_name("sat"))
    up = subprocess.Popen([sat, "up"], env=env, stdout=open(tmp_path / "up.log", "w"),  # noqa: SIM115 - its life long
                          stderr=subprocess.STDOUT,
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "SAT is up" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(1)
        assert json.loads((deployment.home / SECRETS_FILE).read_text())["admin_password"] == password
        token = _token(deployment.url, password)
        response = requests.get(f"{deployment.url}/api/v2/dags/sat_training_job/dagRuns",
                                headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert response.status_code == 200 and response.json()["total_entries"] >= 1
        assert (storage_dir / BUCKET / state_file_name(result_key)).exists()
        restarted = PersistentS3Server(port=storage_port, state_dir=storage_dir,  # a client of the new server
                                       secret_key=load_or_create(deployment.home).object_storage_secret)
        assert restarted.client().head_object(Bucket=BUCKET, Key=result_key)["ContentLength"] > 0
    finally:
        down = subprocess.run([sat, "down"], env=env, capture_output=True, text=True, timeout=180)
    assert down.returncode == 0 and "stopped" in down.stdout, (down.stdout + down.stderr
                                                               + (tmp_path / "up.log").read_text())
    assert up.wait(timeout=60) == 0
    assert processes_of(deployment.home) == []  # not a component, not a task, not a training process
    assert not (deployment.home / "sat-up.pid").exists()
