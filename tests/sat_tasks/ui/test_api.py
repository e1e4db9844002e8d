"""The Training Jobs API in Airflow's own API server app (in process), with Airflow's auth: every endpoint.

The app is `airflow.api_fastapi.app.create_app()` with the project's plugins, on the test
session's migrated metadata DB, the project's DAGs serialized into it, and the embedded
S3 server. People: `admin`; `viewer` (Airflow's read-only role); `outsider`, an admin
whom the auth manager denies the DAG `tiny-llama-demo` (tests/support/dag_scoped_auth.py:
the simple auth manager's roles are global, so per-DAG answers come from a subclass, as
FAB's or Keycloak's would). Tokens come from the auth manager itself.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from html import unescape

import pytest

from tests.conftest import ROOT

DEMO = "tiny-llama-demo"
GENERIC = "sat_training_job"
SECRET = "hunter2-REGISTRY-9d1e"
OTHER_SITE = {"Origin": "https://evil.example"}


@pytest.fixture(scope="module")
def app(airflow_db, demo_bucket):
    from airflow.configuration import conf
    from airflow.models.crypto import get_fernet
    from cryptography.fernet import Fernet

    keys = (("core", "auth_manager"), ("api_auth", "jwt_secret"), ("core", "fernet_key"))
    saved = {key: conf.get(*key, fallback=None) for key in keys}
    conf.set("core", "auth_manager", "tests.support.dag_scoped_auth.DagScopedAuthManager")
    conf.set("api_auth", "jwt_secret", "t" * 64)
    conf.set("core", "fernet_key", Fernet.generate_key().decode())  # as `make up` sets one: passwords encrypted
    get_fernet.cache_clear()
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert {DEMO, GENERIC} <= set(bag.dags), bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
    from airflow.api_fastapi.app import create_app, purge_cached_app

    purge_cached_app()
    yield create_app()
    purge_cached_app()
    get_fernet.cache_clear()
    for (section, key), value in saved.items():
        if value is None:
            conf.remove_option(section, key)
        else:
            conf.set(section, key, value)


@pytest.fixture(scope="module")
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app, base_url="http://sat.test") as test_client:
        yield test_client


def _headers(name: str, role: str = "admin") -> dict[str, str]:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=name, role=role))
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def admin(client):
    return _headers("admin")


def _trigger(client, admin, dag_id: str, conf: dict | None = None) -> str:
    response = client.post(f"/api/v2/dags/{dag_id}/dagRuns", headers=admin,
                           json={"logical_date": None, **({"conf": conf} if conf else {})})
    assert response.status_code == 200, response.text
    return response.json()["dag_run_id"]


def _set_state(dag_id: str, run_id: str, state: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        run.state = state


def _good_form(name: str, **changes: str) -> dict[str, str]:
    form = {"name": name, "learning_type": "on-demand", "framework": "pytorch", "nodes": "1",
            "resources.server_type": "cpu", "resources.gpus_per_node": "0",
            "data.source": "s3://sat-demo/datasets/tiny-corpus/", "results.destination": "s3://sat-demo/results/",
            "job_failover": "on", "image.url": "registry.sat.local/sat/training:0.1.0",
            "command": "python fake_train.py", "storage.script_url": "s3://sat-demo/scripts/seed_train.py",
            "tags": "team=ml\nproject=tiny"}
    form.update(changes)
    return form


ENDPOINTS = [
    ("GET", "/sat/api/jobs"), ("POST", "/sat/api/jobs"), ("GET", f"/sat/api/jobs/{DEMO}/runs/r"),
    ("GET", f"/sat/api/jobs/{DEMO}/runs/r/log"), ("POST", f"/sat/api/jobs/{DEMO}/runs/r/stop"),
    ("GET", f"/sat/api/jobs/{DEMO}/runs/r/log/tail?offset=9&cursor=2:p:1:1"),  # a live section's reader
    ("PUT", f"/sat/api/jobs/{DEMO}/runs/r/tags"), ("DELETE", f"/sat/api/jobs/{DEMO}/runs/r"),
    ("GET", "/sat/jobs"), ("GET", "/sat/jobs/new"), ("POST", "/sat/jobs/new"), ("GET", f"/sat/jobs/{DEMO}/runs/r"),
    ("POST", f"/sat/jobs/{DEMO}/runs/r/stop"), ("POST", f"/sat/jobs/{DEMO}/runs/r/tags"),
    ("GET", f"/sat/jobs/{DEMO}/runs/r/delete"), ("POST", f"/sat/jobs/{DEMO}/runs/r/delete"),
    ("GET", f"/sat/jobs/{DEMO}/runs/r/report"), ("GET", f"/sat/jobs/{DEMO}/runs/r/stop"),
    ("GET", f"/sat/jobs/{DEMO}/runs/r/clone"), ("POST", f"/sat/jobs/{DEMO}/runs/r/rerun"),
    ("POST", f"/sat/api/jobs/{DEMO}/runs/r/rerun"), ("GET", "/sat/jobs/bulk"), ("POST", "/sat/jobs/bulk"),
]


def _is_page(method: str, path: str) -> bool:
    return method == "GET" and not path.startswith("/sat/api/")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_a_login(client, method, path):
    response = client.request(method, path, json={}, follow_redirects=False)
    if _is_page(method, path):  # a page sends the person to Airflow's login, which comes back to it
        assert response.status_code == 303 and response.headers["location"].startswith("/auth/login?next=%2Fsat%2F")
    else:
        assert response.status_code == 401, (method, path, response.status_code, response.text[:200])
    forged = client.request(method, path, headers={"Authorization": "Bearer not-a-token"}, json={})
    assert forged.status_code in (401, 403), (method, path, forged.status_code)  # Airflow answers 403 here


@pytest.mark.parametrize(("method", "path"), [e for e in ENDPOINTS if f"/{DEMO}/" in e[1]])
def test_a_person_without_permission_on_the_dag_gets_403(client, method, path):
    response = client.request(method, path, headers=_headers("outsider"), json={})
    assert response.status_code == 403, (method, path, response.status_code, response.text[:200])


@pytest.mark.parametrize(("method", "path"), [("POST", "/sat/api/jobs"), ("GET", "/sat/jobs/new"),
                                              ("POST", f"/sat/api/jobs/{DEMO}/runs/r/stop"),
                                              ("PUT", f"/sat/api/jobs/{DEMO}/runs/r/tags"),
                                              ("DELETE", f"/sat/api/jobs/{DEMO}/runs/r")])
def test_a_viewer_may_read_but_not_act(client, method, path):
    viewer = _headers("vera", role="viewer")
    assert client.get("/sat/api/jobs", headers=viewer).status_code == 200
    response = client.request(method, path, headers=viewer, json={})
    assert response.status_code == 403, (method, path, response.status_code, response.text[:200])


def test_the_list_hides_the_runs_of_dags_a_person_may_not_read(client, admin):
    demo_run = _trigger(client, admin, DEMO)
    admin_rows = {(r["dag_id"], r["run_id"]) for r in client.get("/sat/api/jobs", headers=admin).json()["jobs"]}
    assert (DEMO, demo_run) in admin_rows
    rows = client.get("/sat/api/jobs", headers=_headers("outsider")).json()["jobs"]
    assert rows == [] or all(row["dag_id"] != DEMO for row in rows)
    assert client.get(f"/sat/api/jobs/{DEMO}/runs/{demo_run}", headers=_headers("outsider")).status_code == 403
    assert client.get(f"/sat/api/jobs/{DEMO}/runs/{demo_run}", headers=admin).status_code == 200


def _runs_of(client, admin, dag_id: str) -> set[str]:
    response = client.get(f"/api/v2/dags/{dag_id}/dagRuns", headers=admin)
    return {run["dag_run_id"] for run in response.json()["dag_runs"]}


def test_create_with_a_bad_form_names_each_field_and_starts_nothing(client, admin):
    before = _runs_of(client, admin, GENERIC)
    bad = _good_form("ab", **{"resources.gpus_per_node": "4", "data.source": "s3://sat-demo/no-such-prefix/",
                              "nodes": "two", "registry_user": "robot", "tags": "no-equals-sign"})
    response = client.post("/sat/api/jobs", headers=admin, json={"form": bad})
    assert response.status_code == 422, response.text
    errors = {(e["field"], e["rule"]) for e in response.json()["errors"]}
    assert ("name", "must be 3-63 chars of lowercase letters, digits, '-' or '.', starting and ending with a "
                    "letter or digit") in errors
    assert ("nodes", "must be a whole number, not 'two'") in errors
    assert ("registry_password", "required with the registry user") in errors
    assert ("tags", "line 1 ('no-equals-sign') must be key=value") in errors
    # Rules only the model (cross-field) or Object Storage can check come before anything runs too.
    gpus = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
        "gpu-job", **{"resources.gpus_per_node": "4", "data.source": "s3://sat-demo/no-such-prefix/"})}).json()
    assert {(e["field"], e["rule"]) for e in gpus["errors"]} == {
        ("resources.gpus_per_node", "server type cpu has 0 GPUs per node")}
    data = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
        "data-job", **{"data.source": "s3://sat-demo/no-such-prefix/"})}).json()
    assert [(e["field"], e["rule"]) for e in data["errors"]] == [
        ("data.source", "s3://sat-demo/no-such-prefix/ holds no objects in Object Storage: upload the data first")]
    assert _runs_of(client, admin, GENERIC) == before  # nothing started

    html = client.post("/sat/jobs/new", headers=admin, data=bad)
    assert html.status_code == 422 and "nothing was started" in html.text
    assert "<div class='error' id='error-name'>name: must be 3-63 chars" in html.text
    assert "value='ab'" in html.text  # what the person typed stays
    assert _runs_of(client, admin, GENERIC) == before


def test_create_starts_the_run_and_keeps_the_registry_password_in_a_connection_only(client, admin, airflow_db):
    form = _good_form("created-job", registry_user="robot", registry_password=SECRET)
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["dag_id"] == GENERIC and created["job"] == "created-job"
    # ':' and '+' literal: the address Airflow's navigation rebuilds from its decoded route (sat_tasks.core.links)
    assert created["page"] == f"/sat/jobs/{GENERIC}/runs/{created['run_id']}" and ":" in created["run_id"]
    run = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{created['run_id']}", headers=admin).json()
    assert run["conf"]["name"] == "created-job" and run["conf"]["registry_conn_id"] == "sat_registry_created-job"
    assert run["triggering_user_name"] == "admin"
    page = client.get(f"/sat/api/jobs/{GENERIC}/runs/{created['run_id']}", headers=admin)
    assert page.status_code == 200 and page.json()["tags"] == {"team": "ml", "project": "tiny"}
    connection = client.get("/api/v2/connections/sat_registry_created-job", headers=admin).json()
    assert connection["login"] == "robot" and connection["host"] == "registry.sat.local"
    for text in (response.text, json.dumps(run), page.text, json.dumps(connection)):
        assert SECRET not in text
    with sqlite3.connect(airflow_db) as db:
        stored, encrypted = db.execute("SELECT password, is_encrypted FROM connection WHERE conn_id = ?",
                                       ("sat_registry_created-job",)).fetchone()
    assert encrypted and SECRET not in stored

    # The HTML form: the same, then the browser goes to the job page.
    html = client.post("/sat/jobs/new", headers=admin, data=_good_form("created-from-html"), follow_redirects=False)
    assert html.status_code == 303 and html.headers["location"].startswith(f"/sat/jobs/{GENERIC}/runs/manual__")


def test_a_form_post_from_another_site_is_refused(client, admin):
    before = _runs_of(client, admin, GENERIC)
    response = client.post("/sat/jobs/new", headers={**admin, **OTHER_SITE}, data=_good_form("cross-site-job"))
    assert response.status_code == 403 and _runs_of(client, admin, GENERIC) == before
    assert client.post("/sat/jobs/new", headers={**admin, "Referer": "https://evil.example/x"},
                       data=_good_form("cross-site-job")).status_code == 403


def test_stop_a_job_before_training_ends_the_run_and_says_who(client, admin, s3_hook):
    from sat_tasks.io.object_storage import read_json

    run_id = _trigger(client, admin, DEMO)
    response = client.post(f"/sat/api/jobs/{DEMO}/runs/{run_id}/stop", headers=admin)
    assert response.status_code == 202, response.text
    assert response.json()["stop_requested"]["by"] == "admin"
    assert client.get(f"/api/v2/dags/{DEMO}/dagRuns/{run_id}", headers=admin).json()["state"] == "failed"
    page = client.get(f"/sat/api/jobs/{DEMO}/runs/{run_id}", headers=admin).json()
    assert page["status"] == "Stopped" and page["stop_requested"]["by"] == "admin"
    assert page["history"][-1]["reason"].startswith("stopped by admin at ")
    assert read_json(s3_hook, page["results"] + "stop.json")["by"] == "admin"
    again = client.post(f"/sat/api/jobs/{DEMO}/runs/{run_id}/stop", headers=admin)
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    html = client.post(f"/sat/jobs/{DEMO}/runs/{run_id}/stop", headers=admin, follow_redirects=False)
    assert html.status_code == 409


def test_tags_are_checked_saved_and_shown(client, admin):
    run_id = _trigger(client, admin, DEMO)
    base = f"/sat/api/jobs/{DEMO}/runs/{run_id}"
    bad = client.put(base + "/tags", headers=admin, json={"tags": {"bad key!": "x"}})
    assert bad.status_code == 422 and bad.json()["errors"] == [
        "tags: key 'bad key!' must be 1-128 chars of letters, digits or _.:/=+@-"]
    good = client.put(base + "/tags", headers=admin, json={"tags": {"team": "vision", "cost-center": "42"}})
    assert good.status_code == 200 and good.json()["tags"] == {"team": "vision", "cost-center": "42"}
    assert client.get(base, headers=admin).json()["tags"] == {"team": "vision", "cost-center": "42"}
    form = client.post(f"/sat/jobs/{DEMO}/runs/{run_id}/tags", headers=admin, data={"tags": "team=nlp"},
                       follow_redirects=False)
    assert form.status_code == 303 and client.get(base, headers=admin).json()["tags"] == {"team": "nlp"}


def test_delete_refuses_a_running_job_and_keeps_results_unless_asked(client, admin, s3_hook):
    from sat_tasks.io.object_storage import write_json

    kept, gone = _trigger(client, admin, DEMO), _trigger(client, admin, DEMO)
    uris = {}
    for run_id in (kept, gone):
        uris[run_id] = client.get(f"/sat/api/jobs/{DEMO}/runs/{run_id}", headers=admin).json()["results"]
        write_json(s3_hook, uris[run_id] + "status.json", [{"status": "Completed", "at": "t", "reason": "done"}])
        write_json(s3_hook, uris[run_id] + "output/metrics.json", {"loss": 0.5})
    _set_state(DEMO, kept, "running")
    refused = client.delete(f"/sat/api/jobs/{DEMO}/runs/{kept}", headers=admin)
    assert refused.status_code == 409 and "stop it first" in refused.json()["detail"]
    confirm = client.get(f"/sat/jobs/{DEMO}/runs/{kept}/delete", headers=admin)
    assert "stop it first" in confirm.text and "confirm-delete" not in confirm.text
    _set_state(DEMO, kept, "success")
    confirm = client.get(f"/sat/jobs/{DEMO}/runs/{kept}/delete", headers=admin)
    assert confirm.status_code == 200 and "Also delete the results" in confirm.text and "confirm-delete" in confirm.text
    deleted = client.delete(f"/sat/api/jobs/{DEMO}/runs/{kept}", headers=admin)
    assert deleted.status_code == 200 and deleted.json()["results"] == "kept"
    assert kept not in _runs_of(client, admin, DEMO)
    bucket, prefix = uris[kept][len("s3://"):].split("/", 1)
    assert len(s3_hook.list_keys(bucket_name=bucket, prefix=prefix)) == 2  # the results are still there

    _set_state(DEMO, gone, "failed")
    html = client.post(f"/sat/jobs/{DEMO}/runs/{gone}/delete", headers=admin, data={"delete_results": "on"})
    assert html.status_code == 200 and "2 object(s) of its results were deleted" in html.text
    bucket, prefix = uris[gone][len("s3://"):].split("/", 1)
    assert s3_hook.list_keys(bucket_name=bucket, prefix=prefix) == []
    assert client.delete(f"/sat/api/jobs/{DEMO}/runs/{gone}", headers=admin).status_code == 404


def test_the_monitoring_tabs_report_renders_the_runs_metrics_series(client, admin, s3_hook):
    run_id = _trigger(client, admin, DEMO)
    page = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}", headers=admin).text
    assert f"<iframe id='report-frame' src='/sat/jobs/{DEMO}/runs/" in page
    empty = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}/report", headers=admin)
    assert empty.status_code == 200 and "No metrics series were found for this run." in empty.text
    results = client.get(f"/sat/api/jobs/{DEMO}/runs/{run_id}", headers=admin).json()["results"]
    bucket, prefix = results[len("s3://"):].split("/", 1)
    lines = [{"time": 1000.0 + i, "series": "training", "job": DEMO, "run": run_id, "attempt": 1, "node": "n0",
              "device": "host", "global_step": 10 * i, "loss": 5.0 / (i + 1), "steps_per_second": 2.0}
             for i in range(5)]
    s3_hook.load_string("\n".join(json.dumps(line) for line in lines) + "\n",
                        key=prefix + "metrics/attempt-1/n0/training.jsonl", bucket_name=bucket, replace=True)
    report = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}/report", headers=admin)
    assert report.status_code == 200 and "data:image/png;base64," in report.text
    assert "No metrics series were found" not in report.text


# ---- Workspaces (ADR 0015) -----------------------------------------------------------------------
WORKSPACE_FORM = {"name": "team-ui", "resources.server_type": "cpu", "resources.gpus_per_node": "0",
                  "resources.memory": "16Gi", "resources.cpu": "4", "nodes": "3", "contract.start": "2026-01-01",
                  "contract.end": "2099-12-31"}


@pytest.fixture
def workspace_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    return tmp_path


def _pool_slots(name: str) -> int | None:
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    with create_session() as session:
        pool = Pool.get_pool(name, session=session)
        return None if pool is None else pool.slots


def test_workspaces_need_a_login_and_airflows_pool_permissions(client, workspace_dirs):
    for method, path in (("GET", "/sat/api/workspaces"), ("POST", "/sat/api/workspaces"), ("GET", "/sat/workspaces"),
                         ("PUT", "/sat/api/workspaces/x"), ("DELETE", "/sat/api/workspaces/x")):
        answer = client.request(method, path, json={}, follow_redirects=False)
        assert answer.status_code == (303 if _is_page(method, path) else 401), (method, path)
    viewer = _headers("vera", role="viewer")
    assert client.get("/sat/api/workspaces", headers=viewer).status_code == 200
    assert client.post("/sat/api/workspaces", headers=viewer, json={"name": "v"}).status_code == 403
    assert client.delete("/sat/api/workspaces/x", headers=viewer).status_code == 403


def test_workspace_create_edit_delete_with_refusals_and_the_pool(client, admin, workspace_dirs):
    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore
    from sat_tasks.spec import parse_spec

    bad = client.post("/sat/api/workspaces", headers=admin, json={"name": "Team UI", "nodes": 0})
    assert bad.status_code == 422
    assert {e["field"] for e in bad.json()["errors"]} == {"name", "nodes", "contract"}
    body = {"name": "team-ui", "nodes": 3, "contract": {"start": "2026-01-01", "end": "2099-12-31"}}
    assert client.post("/sat/api/workspaces", headers=admin, json=body).status_code == 201
    assert (workspace_dirs / "workspaces" / "team-ui.yaml").exists()  # the store `sat workspace` writes
    assert _pool_slots("sat-workspace-team-ui") == 3
    # a job runs there on the local backend (the slot board), another is queued as an Airflow run
    board = SlotBoard("team-ui")
    ticket = board.enqueue(job="train-local", run_id="run-l", attempt=1, slots=2)
    assert board.poll(WorkspaceStore().get("team-ui"), ticket).admitted
    job = parse_spec({"name": "train-queued", "workspace": "team-ui", "nodes": 1,
                      "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                      "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
                      "results": {"destination": "s3://sat-demo/results/"}, "command": "python t.py"})
    queued_run = _trigger(client, admin, GENERIC, params_from_spec(job))
    try:
        listed = client.get("/sat/api/workspaces", headers=admin).json()["workspaces"]
        (row,) = [r for r in listed if r["name"] == "team-ui"]
        assert row["nodes_used"] == 2 and [q["job"] for q in row["queued"]] == ["train-queued"]
        shrink = client.put("/sat/api/workspaces/team-ui", headers=admin, json={"nodes": 1})
        assert shrink.status_code == 409 and "running jobs use 2: train-local (run-l" in shrink.json()["detail"]
        grow = client.put("/sat/api/workspaces/team-ui", headers=admin, json={"nodes": 4})
        assert grow.status_code == 200 and _pool_slots("sat-workspace-team-ui") == 4
        refused = client.delete("/sat/api/workspaces/team-ui", headers=admin)
        assert refused.status_code == 409
        assert "train-local (run-l, running" in refused.json()["detail"]
        assert f"train-queued ({queued_run}, queued" in refused.json()["detail"]
        board.release(ticket)
        assert client.delete("/sat/api/workspaces/team-ui", headers=admin).status_code == 409  # still queued
    finally:
        _set_state(GENERIC, queued_run, "failed")
    assert client.delete("/sat/api/workspaces/team-ui", headers=admin).json() == {"deleted": "team-ui"}
    assert _pool_slots("sat-workspace-team-ui") is None
    assert client.delete("/sat/api/workspaces/team-ui", headers=admin).status_code == 404


def test_the_workspaces_page_creates_edits_and_shows_refusals(client, admin, workspace_dirs):
    from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore

    page = client.get("/sat/workspaces", headers=admin)
    assert page.status_code == 200 and "No Training Workspaces yet" in page.text and "Create Workspace" in page.text
    bad = client.post("/sat/workspaces", headers=admin, data={**WORKSPACE_FORM, "nodes": "0", "contract.end": "2025"})
    assert bad.status_code == 422
    assert "nodes: must be between 1 and 64" in bad.text and "contract.end: must be a date YYYY-MM-DD" in bad.text
    assert client.post("/sat/workspaces", headers={**admin, **OTHER_SITE}, data=WORKSPACE_FORM).status_code == 403
    created = client.post("/sat/workspaces", headers=admin, data={**WORKSPACE_FORM, "warm_pool.keep_alive_seconds": "600"})
    assert [r.status_code for r in created.history] == [303]  # Post/Redirect/Get: a reload does not post again
    assert created.url.path == "/sat/workspaces" and created.request.method == "GET"
    assert created.status_code == 200 and "workspace team-ui created: 3 node(s)" in created.text
    assert "id='ws-team-ui'" in created.text and "warm pool: 600 s" in created.text
    assert WorkspaceStore().get("team-ui").warm_pool.keep_alive_seconds == 600
    # the notice comes from the store, not the query: a crafted link shows nothing it does not hold
    assert "created" not in client.get("/sat/workspaces?created=team-zz", headers=admin).text.split("<h1>")[1]
    assert "id='notice'" not in client.get("/sat/workspaces?created=%3Cb%3E", headers=admin).text
    board = SlotBoard("team-ui")
    ticket = board.enqueue(job="train-x", run_id="run-x", attempt=1, slots=3)
    board.poll(WorkspaceStore().get("team-ui"), ticket)
    refused = client.post("/sat/workspaces/team-ui/nodes", headers=admin, data={"nodes": "2"})
    assert refused.status_code == 409 and "cannot shrink to 2 node(s): running jobs use 3: train-x" in refused.text
    asked = client.post("/sat/workspaces/team-ui/delete", headers=admin)  # the row's Delete asks first
    assert asked.status_code == 200 and "id='confirm-delete'" in asked.text
    assert "name='confirm' value='yes'" in asked.text
    assert WorkspaceStore().find("team-ui") is not None
    assert client.post("/sat/workspaces/team-zz/delete", headers=admin).status_code == 404
    refused = client.post("/sat/workspaces/team-ui/delete", headers=admin, data={"confirm": "yes"})
    assert refused.status_code == 409 and "cannot delete it while jobs run or wait in it: train-x" in refused.text
    board.release(ticket)
    edited = client.post("/sat/workspaces/team-ui/nodes", headers=admin, data={"nodes": "2"})
    assert [r.status_code for r in edited.history] == [303]
    assert edited.status_code == 200 and "2 node(s) from the next job that starts" in edited.text
    deleted = client.post("/sat/workspaces/team-ui/delete", headers=admin, data={"confirm": "yes"})
    assert [r.status_code for r in deleted.history] == [303]
    assert deleted.status_code == 200 and "workspace team-ui deleted" in deleted.text
    bad_warm = client.post("/sat/workspaces", headers=admin, data={**WORKSPACE_FORM, "warm_pool.keep_alive_seconds": "0"})
    assert bad_warm.status_code == 422 and "warm_pool.keep_alive_seconds: must be between 1 and 3600" in bad_warm.text
    assert WorkspaceStore().find("team-ui") is None


# ---- Nodes (sat_tasks.ui.nodes, mounted beside the view's own routers) ----------------------------------
@pytest.mark.parametrize(("method", "path"), [("GET", "/sat/nodes"), ("GET", "/sat/api/nodes"),
                                              ("POST", "/sat/api/nodes/gpu-1/release")])
def test_the_nodes_page_is_mounted_behind_the_login_and_in_the_views_navigation(client, admin, method, path):
    answer = client.request(method, path, json={}, follow_redirects=False)
    assert answer.status_code == (303 if _is_page(method, path) else 401), (method, path)
    assert "<a href='/sat/nodes'>Nodes</a>" in client.get("/sat/jobs", headers=admin).text


# ---- issue 30 (items 4, 6, 10, 12): the view as its users expect ------------------------------------------
def _page(client, admin, dag_id: str, run_id: str) -> dict:
    return client.get(f"/sat/api/jobs/{dag_id}/runs/{run_id}", headers=admin).json()


def _textarea(html: str, name: str) -> str:
    found = re.search(rf"<textarea id='{re.escape(name)}' name='[^']*'[^>]*>(.*?)</textarea>", html, re.DOTALL)
    return unescape(found.group(1)) if found else ""


def _input(html: str, name: str) -> str | None:
    found = re.search(rf"<input type='(?:text|password)' id='{re.escape(name)}' name='[^']*' value='([^']*)'", html)
    return unescape(found.group(1)) if found else None


# ---- 4: bugs ----------------------------------------------------------------------------------------
def test_spot_with_job_failover_is_refused_under_the_box_and_starts_nothing(client, admin):
    before = _runs_of(client, admin, GENERIC)
    spot = _good_form("spot-failover", learning_type="spot", job_failover="on")
    refused = client.post("/sat/api/jobs", headers=admin, json={"form": spot})
    assert refused.status_code == 422
    assert [(e["input"], e["field"], e["rule"]) for e in refused.json()["errors"]] == [
        ("job_failover", "job_failover", "not allowed with learning_type spot (Spot jobs resume instead)")]
    html = client.post("/sat/jobs/new", headers=admin, data=spot)
    assert html.status_code == 422 and "<div class='error' id='error-job_failover'>job_failover: not allowed" in html.text
    assert _runs_of(client, admin, GENERIC) == before
    assert "box.disabled=spot" in client.get("/sat/jobs/new", headers=admin).text  # the form disables the box
    unticked = {k: v for k, v in spot.items() if k != "job_failover"}
    started = client.post("/sat/api/jobs", headers=admin, json={"form": unticked})
    assert started.status_code == 201, started.text


def test_create_refuses_a_workspace_that_does_not_exist_or_whose_contract_has_ended(client, admin, workspace_dirs):
    from sat_tasks.io.workspaces import WorkspaceStore

    store = WorkspaceStore()
    store.create({"name": "team-live", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2099-12-31"}})
    store.create({"name": "team-over", "nodes": 2, "contract": {"start": "2025-01-01", "end": "2025-06-30"}})
    before = _runs_of(client, admin, GENERIC)
    missing = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form("ws-missing", workspace="team-zz")})
    assert missing.status_code == 422
    assert [(e["input"], e["rule"]) for e in missing.json()["errors"]] == [
        ("workspace", "no workspace named 'team-zz' (workspaces: team-live, team-over)")]
    ended = client.post("/sat/jobs/new", headers=admin, data=_good_form("ws-ended", workspace="team-over"))
    assert ended.status_code == 422
    assert ("<div class='error' id='error-workspace'>workspace: workspace team-over&#39;s contract runs "
            "2025-01-01 to 2025-06-30; the job starts") in ended.text
    assert _runs_of(client, admin, GENERIC) == before
    live = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form("ws-live", workspace="team-live")})
    assert live.status_code == 201, live.text


def test_a_workspace_whose_contract_has_already_ended_cannot_be_created(client, admin, workspace_dirs):
    from sat_tasks.io.workspaces import WorkspaceStore

    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    body = {"name": "team-past", "nodes": 1, "contract": {"start": "2025-01-01", "end": yesterday}}
    refused = client.post("/sat/api/workspaces", headers=admin, json=body)
    assert refused.status_code == 422
    ((problem,),) = [refused.json()["errors"]]
    assert problem["field"] == "contract.end" and problem["rule"].startswith(f"the contract ended on {yesterday}")
    form = {"name": "team-past", "resources.server_type": "cpu", "resources.gpus_per_node": "0", "nodes": "1",
            "contract.start": "2025-01-01", "contract.end": yesterday}
    html = client.post("/sat/workspaces", headers=admin, data=form)
    assert html.status_code == 422 and f"contract.end: the contract ended on {yesterday}" in html.text
    assert WorkspaceStore().find("team-past") is None
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert client.post("/sat/api/workspaces", headers=admin,
                       json={**body, "contract": {"start": "2025-01-01", "end": today}}).status_code == 201


def test_a_refused_tag_edit_opens_the_tags_tab_with_the_error_and_what_was_typed(client, admin):
    run_id = _trigger(client, admin, DEMO)
    typed = "team=vision\nbad key!=x\nowner=ana"
    refused = client.post(f"/sat/jobs/{DEMO}/runs/{run_id}/tags", headers=admin, data={"tags": typed})
    assert refused.status_code == 422
    assert "<section class='tab' id='tags' data-open='yes'>" in refused.text  # the page opens on the Tags tab
    assert "<section class='tab' id='details'>" in refused.text
    assert _textarea(refused.text, "tags-text") == typed  # nothing typed is lost
    assert "<div id='tag-errors' role='alert'><div class='error'>tags: key &#39;bad key!&#39;" in refused.text
    assert "section.tab[data-open]" in refused.text  # job.js shows the opened tab when the URL names none
    assert "fetch(form.action,{method:'POST'" in refused.text  # job_tags.js: the form saves in place
    # the form's address asked for with GET (a reload; Airflow re-requesting its frame): the Tags tab, not a 405
    again = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}/tags", headers=admin, follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"].endswith("#tags"), again
    assert client.get(f"/sat/jobs/{DEMO}/runs/{run_id}/tags", headers=admin).status_code == 200
    fifty_one = client.put(f"/sat/api/jobs/{DEMO}/runs/{run_id}/tags", headers=admin,
                           json={"tags": {f"k{i}": "v" for i in range(51)}})
    assert fifty_one.status_code == 422
    assert fifty_one.json()["errors"] == ["tags: at most 50 key/value pairs (got 51)"]


def test_stop_asks_first_and_records_who_and_through_which_route(client, admin, s3_hook):
    from sat_tasks.io.object_storage import read_json

    from_page, from_api = _trigger(client, admin, DEMO), _trigger(client, admin, DEMO)
    page = client.get(f"/sat/jobs/{DEMO}/runs/{from_page}", headers=admin).text
    assert f"<a class='button danger' href='/sat/jobs/{DEMO}/runs/" in page and "id='stop'>Stop</a>" in page
    asked = client.get(f"/sat/jobs/{DEMO}/runs/{from_page}/stop", headers=admin)
    assert asked.status_code == 200 and "id='confirm-stop'" in asked.text and "name='confirm' value='yes'" in asked.text
    unconfirmed = client.post(f"/sat/jobs/{DEMO}/runs/{from_page}/stop", headers=admin, data={})
    assert unconfirmed.status_code == 200 and "id='confirm-stop'" in unconfirmed.text  # asks again, stops nothing
    results = _page(client, admin, DEMO, from_page)["results"]
    assert read_json(s3_hook, results + "stop.json") is None
    done = client.post(f"/sat/jobs/{DEMO}/runs/{from_page}/stop", headers=admin, data={"confirm": "yes"},
                       follow_redirects=False)
    assert done.status_code == 303
    assert read_json(s3_hook, results + "stop.json")["via"] == "the Training Jobs view"
    assert client.get(f"/sat/jobs/{DEMO}/runs/{from_page}/stop", headers=admin).status_code == 409  # ended

    assert client.post(f"/sat/api/jobs/{DEMO}/runs/{from_api}/stop", headers=admin).status_code == 202
    stopped = _page(client, admin, DEMO, from_api)
    assert stopped["stop_requested"]["via"] == "the REST API"
    assert stopped["history"][-1]["reason"].endswith("(the REST API) before training ran")


def test_an_empty_filter_result_says_no_job_matches(client, admin):
    empty = client.get("/sat/jobs?q=no-such-job-zzz", headers=admin)
    assert empty.status_code == 200
    assert "match these filters" in empty.text and "No Training Jobs yet" not in empty.text


def test_pages_redirect_to_the_login_and_a_deleted_run_is_a_not_found_page(client, admin):
    login = client.get("/sat/jobs?status=Running", follow_redirects=False)
    assert login.status_code == 303
    assert login.headers["location"] == "/auth/login?next=%2Fsat%2Fjobs%3Fstatus%3DRunning"
    assert client.get(f"/sat/jobs/{DEMO}/runs/r", follow_redirects=False).headers["location"].startswith(
        "/auth/login?next=")
    api = client.get("/sat/api/jobs")
    assert api.status_code == 401 and api.headers["content-type"] == "application/json"  # REST clients read JSON
    run_id = _trigger(client, admin, DEMO)
    _set_state(DEMO, run_id, "failed")
    assert client.delete(f"/sat/api/jobs/{DEMO}/runs/{run_id}", headers=admin).status_code == 200
    gone = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}", headers=admin)
    assert gone.status_code == 404 and gone.headers["content-type"].startswith("text/html")
    assert "<h1>Not found</h1>" in gone.text and "<a class='button' href='/sat/jobs'>Training Jobs</a>" in gone.text
    assert f"no run &#39;{run_id}&#39;" in gone.text and "<nav class='views'>" in gone.text
    assert client.get("/sat/no-such-page", headers=admin).status_code == 404
    api_gone = client.get(f"/sat/api/jobs/{DEMO}/runs/{run_id}", headers=admin)
    assert api_gone.status_code == 404 and api_gone.json() == {"detail": f"no run {run_id!r} of {DEMO!r}"}


# ---- 6: Clone and Re-run ----------------------------------------------------------------------------
def test_clone_fills_the_create_form_from_the_run_but_never_the_password(client, admin, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_TEAM_HOOK", "http://hooks.example.com")  # an http connection admin may read
    form = _good_form("clone-me", registry_user="robot", registry_password=SECRET, workspace="",
                      notify_webhook="team_hook", notify_on="failed, pending or stopped",
                      advanced=json.dumps({"env": {"LR": "0.1"}}))
    created = client.post("/sat/api/jobs", headers=admin, json={"form": form}).json()
    page = client.get(f"/sat/jobs/{GENERIC}/runs/{created['run_id']}", headers=admin).text
    assert f"href='/sat/jobs/{GENERIC}/runs/" in page and "id='clone'" in page and "id='rerun'" in page
    clone = client.get(f"/sat/jobs/{GENERIC}/runs/{created['run_id']}/clone", headers=admin)
    assert clone.status_code == 200 and SECRET not in clone.text
    assert "A copy of clone-me" in clone.text and "The registry password is never copied" in clone.text
    assert _input(clone.text, "name") == "clone-me" and _input(clone.text, "command") == "python fake_train.py"
    assert _input(clone.text, "registry_password") == "" and _input(clone.text, "notify_webhook") == "team_hook"
    assert "<option value='failed, pending or stopped' selected>" in clone.text
    assert _textarea(clone.text, "tags") == "team=ml\nproject=tiny"
    advanced = json.loads(_textarea(clone.text, "advanced"))
    assert advanced["env"] == {"LR": "0.1"} and advanced["image"] == {"registry_conn_id": "sat_registry_clone-me"}
    # What the form shows starts the same job (renamed here), pulling with the same registry connection.
    shown = {**form, "name": "clone-me-2", "registry_user": "", "registry_password": "",
             "advanced": _textarea(clone.text, "advanced")}
    copy = client.post("/sat/api/jobs", headers=admin, json={"form": shown})
    assert copy.status_code == 201, copy.text
    conf = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{copy.json()['run_id']}", headers=admin).json()["conf"]
    assert conf["registry_conn_id"] == "sat_registry_clone-me" and conf["extra"]["env"] == {"LR": "0.1"}
    assert conf["extra"]["notifications"] == [{"on": ["failed", "pending", "stopped"], "webhook": "team_hook",
                                               "endpoint": None, "email": None, "smtp_conn_id": "smtp_default"}]
    outsider = client.get(f"/sat/jobs/{DEMO}/runs/any/clone", headers=_headers("outsider"))
    assert outsider.status_code == 403


def test_rerun_starts_the_same_spec_again_as_a_new_run(client, admin):
    created = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form("rerun-me")}).json()
    original = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{created['run_id']}", headers=admin).json()
    again = client.post(f"/sat/api/jobs/{GENERIC}/runs/{created['run_id']}/rerun", headers=admin)
    assert again.status_code == 201, again.text
    rerun = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{again.json()['run_id']}", headers=admin).json()
    assert again.json()["run_id"] != created["run_id"] and rerun["conf"] == original["conf"]
    assert rerun["triggering_user_name"] == "admin"
    before = _runs_of(client, admin, DEMO)
    demo_run = _trigger(client, admin, DEMO)
    _set_state(DEMO, demo_run, "success")
    html = client.post(f"/sat/jobs/{DEMO}/runs/{demo_run}/rerun", headers=admin, follow_redirects=False)
    assert html.status_code == 303 and html.headers["location"].startswith(f"/sat/jobs/{DEMO}/runs/manual__")
    assert len(_runs_of(client, admin, DEMO) - before) == 2
    assert client.post(f"/sat/api/jobs/{DEMO}/runs/{demo_run}/rerun",
                       headers=_headers("vera", role="viewer")).status_code == 403


# ---- 10: Details and Monitoring ---------------------------------------------------------------------
def test_details_are_labelled_fields_in_the_guides_sections_with_the_spec_as_yaml_behind_a_toggle(client, admin):
    run_id = _trigger(client, admin, DEMO)
    html = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}", headers=admin).text
    for section in ("job", "image", "resources", "storage", "command", "tags", "notifications"):
        assert f"id='details-{section}'" in html, section
    fields = dict(re.findall(r"<dd id='detail-([a-z-]+)'>(.*?)</dd>", html))
    assert fields["learning-type"] == "On-Demand" and fields["framework"] == "PyTorch"
    assert fields["image"] == "registry.sat.local/sat/training:0.1.0" and fields["server-type"] == "cpu"
    assert fields["data"] == "s3://sat-demo/datasets/tiny-corpus/" and fields["job-failover"].startswith("On, at most 3")
    assert "<pre id='detail-command'>python train_tiny_llama.py" in html
    assert "<code>team=platform</code>" in html
    assert "<details id='spec-yaml'><summary>Spec (YAML)</summary><pre>name: tiny-llama-demo\n" in html
    assert "On-Demand · PyTorch" in html  # the header line too


def test_monitoring_shows_each_chart_once(client, admin, s3_hook):
    run_id = _trigger(client, admin, DEMO)
    results = _page(client, admin, DEMO, run_id)["results"]
    bucket, prefix = results[len("s3://"):].split("/", 1)
    lines = [{"time": 1000.0 + i, "series": "training", "job": DEMO, "run": run_id, "attempt": 1, "node": "n0",
              "device": "host", "global_step": 10 * i, "loss": 5.0 / (i + 1), "steps_per_second": 2.0}
             for i in range(5)]
    s3_hook.load_string("\n".join(json.dumps(line) for line in lines) + "\n",
                        key=prefix + "metrics/attempt-1/n0/training.jsonl", bucket_name=bucket, replace=True)
    page = client.get(f"/sat/jobs/{DEMO}/runs/{run_id}", headers=admin).text
    assert "id='loss-chart'" in page and "id='rate-chart'" in page  # the tab draws loss and steps/s itself
    (src,) = re.findall(r"<iframe id='report-frame' src='([^']+)'", page)
    embedded = client.get(unescape(src), headers=admin).text
    assert "<h2>Loss</h2>" not in embedded and "<h2>Throughput</h2>" not in embedded  # so its report leaves them out
    assert "data:image/png;base64," in embedded  # its other plots stay ("open the job report" has them all)


# ---- 12: notifications on the form -------------------------------------------------------------------
def test_notifications_are_set_on_the_form_and_refused_under_their_field(client, admin, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", "smtp://mail.example.com:25")
    monkeypatch.setenv("AIRFLOW__SAT__NOTIFICATION_CONNECTIONS", "smtp_default")  # the operator's list (issue 44.2)
    form = client.get("/sat/jobs/new", headers=admin).text
    assert "<legend>Notifications</legend>" in form and "id='notify_webhook'" in form and "id='notify_email'" in form
    bad = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
        "notify-bad", notify_email="ml@example.com, nobody")})
    assert bad.status_code == 422
    assert [(e["input"], e["field"], e["rule"]) for e in bad.json()["errors"]] == [
        ("notify_email", "notifications.0.email", "'nobody' is not an e-mail address (name@domain)")]
    good = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
        "notify-good", notify_email="ml@example.com", notify_on="completed")})
    assert good.status_code == 201, good.text
    page = client.get(f"/sat/jobs/{GENERIC}/runs/{good.json()['run_id']}", headers=admin).text
    assert "<ul id='detail-notifications'><li>e-mail ml@example.com on completed</li></ul>" in page


# ---- Compare runs (issue 45 item 7) ---------------------------------------------------------------
def test_compare_shows_two_runs_side_by_side_and_only_runs_the_person_may_read(client, admin):
    first, second = _trigger(client, admin, DEMO), _trigger(client, admin, DEMO)
    query = f"run={DEMO}/{first}&run={DEMO}/{second}".replace("+", "%2B")
    found = client.get(f"/sat/api/compare?{query}", headers=admin)
    assert found.status_code == 200, found.text
    body = found.json()
    assert [r["label"] for r in body["runs"]] == [f"{DEMO} · {first}", f"{DEMO} · {second}"]
    assert {row["label"] for row in body["settings"]} >= {"Nodes", "Image", "Environment (names)"}
    page = client.get(f"/sat/compare?{query}", headers=admin)
    assert page.status_code == 200 and "id='compare-settings'" in page.text and "id='loss-compare'" in page.text
    assert client.get(f"/sat/api/compare?{query}", headers=_headers("outsider")).status_code in (403, 404)
    one = client.get(f"/sat/compare?run={DEMO}/{first}".replace("+", "%2B"), headers=admin)
    assert one.status_code == 400 and "name 2 to 6 runs" in unescape(one.text)
    missing = client.get(f"/sat/api/compare?{query}&run={DEMO}/no-such-run", headers=admin)
    assert missing.status_code == 404
    assert client.get(f"/sat/compare?{query}", follow_redirects=False).status_code == 303  # the login first


def test_the_list_ticks_runs_to_compare_and_the_compare_page_names_the_rule(client, admin):
    """Issue 45.7: a tick per row whose value is the compare page's `run=<dag>/<run>`, in one GET form."""
    import html
    import re

    demo_run = _trigger(client, admin, DEMO)
    page = client.get("/sat/jobs", headers=admin)
    assert page.status_code == 200
    assert "<form id='select-runs' method='get' action='/sat/compare'>" in page.text
    ticks = [html.unescape(v) for v in re.findall(r"<input type='checkbox' name='run' form='select-runs' "
                                                  r"value='([^']+)'", page.text)]
    assert f"{DEMO}/{demo_run}" in ticks
    assert len(ticks) == page.text.count("<tr class='job-row'")  # one per row
    one = client.get("/sat/compare", params={"run": f"{DEMO}/{demo_run}"}, headers=admin)
    assert one.status_code == 400 and "name 2 to 6 runs" in html.unescape(one.text)
