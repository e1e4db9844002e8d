"""The view refuses cross-site writes, frames only for its own origin, asks the right permissions (issue 29.4-7).

The app is Airflow's API server with the project's plugins (the fixtures of
tests/sat_tasks/ui/test_api.py, one per module). A browser sends the session cookie
(`_token`) with another site's request, never an `Authorization` header: a state-changing
request that the cookie authenticates must come from this origin; one with a bearer token
(the REST API's clients) needs no Origin. ADR 0019.
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import pytest

from sat_tasks.io.object_storage import read_json
from sat_tasks.io.run_layout import scoped
from tests.sat_tasks.ui.test_api import (  # noqa: F401 (the module-scoped app and its client)
    DEMO,
    GENERIC,
    _good_form,
    _headers,
    _set_state,
    _trigger,
    admin,
    app,
    client,
)
from tests.security.test_run_ownership import (
    RUN,
    _demo_job,
    _run_routes,
    _set_validated,
    _twin,
    _victim,
    _victim_objects,
)

OWN = "http://sat.test"  # the TestClient's base URL
STORAGE = "http://127.0.0.1:9000"  # the embedded Object Storage: another loopback origin that serves HTML


def _cookie(name: str = "admin", role: str = "admin") -> dict[str, str]:
    return {"Cookie": "_token=" + _headers(name, role)["Authorization"].removeprefix("Bearer ")}


def _state(client, admin, run_id: str) -> str:
    return client.get(f"/api/v2/dags/{DEMO}/dagRuns/{run_id}", headers=admin).json()["state"]


WRITES = [
    pytest.param("POST", "/sat/api/jobs/{dag}/runs/{run}/stop", id="api-stop"),
    pytest.param("PUT", "/sat/api/jobs/{dag}/runs/{run}/tags", id="api-tags"),
    pytest.param("DELETE", "/sat/api/jobs/{dag}/runs/{run}", id="api-delete"),
    pytest.param("POST", "/sat/api/jobs", id="api-create"),
    pytest.param("POST", "/sat/api/workspaces", id="api-workspace-create"),
    pytest.param("PUT", "/sat/api/workspaces/team-x", id="api-workspace-edit"),
    pytest.param("DELETE", "/sat/api/workspaces/team-x", id="api-workspace-delete"),
    pytest.param("POST", "/sat/api/nodes/local-node-0/release", id="api-node-release"),
    pytest.param("POST", "/sat/jobs/{dag}/runs/{run}/stop", id="form-stop"),
    pytest.param("POST", "/sat/workspaces", id="form-workspace-create"),
]


@pytest.mark.parametrize(("method", "path"), WRITES)
@pytest.mark.parametrize("sender", [
    pytest.param({"Origin": STORAGE}, id="object-storage-origin"),
    pytest.param({"Referer": STORAGE + "/sat-demo/page.html"}, id="object-storage-referer"),
    pytest.param({}, id="no-origin"),
])
def test_a_cookie_write_from_another_origin_or_none_is_refused(client, method, path, sender):
    response = client.request(method, path.format(dag=DEMO, run="r"), headers={**_cookie(), **sender}, json={})
    assert response.status_code == 403, (method, path, response.status_code, response.text[:200])


def test_stop_acts_for_the_cookie_from_this_origin_and_for_a_bearer_token_without_one(client, admin):
    run_id = _trigger(client, admin, DEMO)
    stop = f"/sat/api/jobs/{DEMO}/runs/{run_id}/stop"
    assert client.post(stop, headers={**_cookie(), "Origin": STORAGE}).status_code == 403
    assert _state(client, admin, run_id) == "queued"  # the cross-site stop changed nothing
    assert client.post(stop, headers={**_cookie(), "Origin": OWN}).status_code == 202
    assert _state(client, admin, run_id) == "failed"
    other = _trigger(client, admin, DEMO)
    assert client.post(f"/sat/api/jobs/{DEMO}/runs/{other}/stop", headers=admin).status_code == 202  # no Origin
    assert client.get("/sat/api/jobs", headers=_cookie()).status_code == 200  # reading needs no Origin


@pytest.mark.parametrize("path", ["/sat/jobs", "/sat/api/jobs", "/sat/jobs/new"])
def test_pages_may_be_framed_by_this_origin_only(client, admin, path):
    response = client.get(path, headers=admin)
    assert response.status_code == 200
    assert response.headers["x-frame-options"] == "SAMEORIGIN"
    assert response.headers["content-security-policy"] == "frame-ancestors 'self'"  # Airflow's UI embeds it


def test_the_api_description_needs_a_login(client, admin):
    docs = client.get("/sat/docs", follow_redirects=False)  # a page: to the login, as every page
    assert docs.status_code == 303 and "login" in docs.headers["location"]
    assert client.get("/sat/openapi.json").status_code == 401
    schema = client.get("/sat/openapi.json", headers=admin)
    assert schema.status_code == 200 and "/api/jobs" in schema.json()["paths"]
    docs = client.get("/sat/docs", headers=admin)
    assert docs.status_code == 200 and "/sat/openapi.json" in docs.text


# ---- permissions at Create (issue 29.6) ------------------------------------------------------------
@pytest.fixture
def auth_manager(app):
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


def test_create_over_an_existing_registry_login_needs_the_permission_to_edit_it(client, admin, auth_manager,
                                                                                 monkeypatch):
    created = client.post("/api/v2/connections", headers=admin, json={
        "connection_id": "sat_registry_victim-job", "conn_type": "generic", "host": "registry.sat.local",
        "login": "victim", "password": "victim-secret"})
    assert created.status_code == 201, created.text
    allowed = auth_manager.is_authorized_connection

    def no_edit_for_mallory(*, method, user, details=None):
        return not (user.get_name() == "mallory" and method == "PUT") and allowed(method=method, user=user,
                                                                                  details=details)

    monkeypatch.setattr(auth_manager, "is_authorized_connection", no_edit_for_mallory)
    mallory = _headers("mallory")
    form = _good_form("victim-job", registry_user="mallory", registry_password="attacker")
    response = client.post("/sat/api/jobs", headers=mallory, json={"form": form})
    assert response.status_code == 403 and "edit the existing connection" in response.json()["detail"]
    assert client.get("/api/v2/connections/sat_registry_victim-job", headers=admin).json()["login"] == "victim"
    fresh = _good_form("mallory-own-job", registry_user="mallory", registry_password="own")
    assert client.post("/sat/api/jobs", headers=mallory, json={"form": fresh}).status_code == 201


def test_create_in_a_workspace_needs_the_permission_on_its_pool(client, admin, auth_manager, monkeypatch, tmp_path):
    from sat_tasks.io.workspaces import WorkspaceStore

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    WorkspaceStore().create({"name": "team-secret", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2099-12-31"},
                             "resources": {"server_type": "cpu", "gpus_per_node": 0, "memory": "64Gi", "cpu": "8"}})
    allowed = auth_manager.is_authorized_pool
    asked = []

    def team_pool_only(*, method, user, details=None):
        asked.append((user.get_name(), method, details.name if details else None))
        if user.get_name() == "outsider" and details is not None and details.name == "sat-workspace-team-secret":
            return False
        return allowed(method=method, user=user, details=details)

    monkeypatch.setattr(auth_manager, "is_authorized_pool", team_pool_only)
    runs_before = client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"]
    form = _good_form("squatter-job", advanced='{"workspace": "team-secret"}')
    response = client.post("/sat/api/jobs", headers=_headers("outsider"), json={"form": form})
    assert response.status_code == 403 and "sat-workspace-team-secret" in response.json()["detail"]
    assert client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"] == runs_before
    assert ("outsider", "GET", "sat-workspace-team-secret") in asked
    created = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert created.status_code == 201, created.text


def test_create_refuses_a_backend_the_deployment_does_not_allow(client, admin):
    runs_before = client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"]
    form = _good_form("elsewhere-job", advanced='{"backend": "kubernetes"}')  # this deployment: [sat] backend local
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 422 and response.json()["errors"] == [{
        "field": "backend", "input": "advanced",
        "rule": "kubernetes is not allowed on this deployment: a job may run on local only ([sat] allowed_backends)"}]
    assert client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"] == runs_before


# ---- issue 29.4: what a run owns (ADR 0024; the helpers: tests/security/test_run_ownership.py) -----------
# ---- every route checks the DAG's permission ----------------------------------------------------------
def test_every_run_route_refuses_a_person_without_the_dags_permission(client, admin, s3_hook):
    routes = _run_routes()
    assert len(routes) >= 12, routes  # the page, its JSON, log, report, stop, tags, delete (and newer ones)
    run_id, run = _victim(client, admin, s3_hook)
    before = _victim_objects(s3_hook, run)
    outsider = {**_headers("outsider"), "Origin": "http://sat.test"}
    for method, path in routes:
        url = "/sat" + path.replace("{dag_id}", DEMO).replace("{run_id}", run_id).replace("{name:path}", "job.log") \
            .replace("{name}", "job.log")
        response = client.request(method, url, headers=outsider, json={"tags": {"a": "b"}}, data=None)
        assert response.status_code == 403, (method, path, response.status_code, response.text[:200])
    assert _victim_objects(s3_hook, run) == before
    assert client.get(f"/api/v2/dags/{DEMO}/dagRuns/{run_id}", headers=admin).json()["state"] == "queued"


# ---- a twin run reaches only its own objects ----------------------------------------------------------
@pytest.mark.parametrize("legacy_victim", [pytest.param(False, id="victim-scoped"),
                                           pytest.param(True, id="victim-validated-before-adr-0024")])
def test_a_twin_run_of_the_generic_dag_cannot_read_stop_tag_or_delete_the_victims_objects(
        client, admin, s3_hook, legacy_victim):
    run_id, victim = _victim(client, admin, s3_hook, legacy=legacy_victim)
    before = _victim_objects(s3_hook, victim)
    outsider = {**_headers("outsider"), "Origin": "http://sat.test"}
    _twin(client, outsider, run_id)
    api = f"/sat/api{RUN.format(dag=GENERIC, run=run_id)}"

    page = client.get(api, headers=outsider)
    assert page.status_code == 200, page.text  # its own run: readable, its own (empty) records
    assert page.json()["results"] != victim.results_uri and f"/{GENERIC}/" in page.json()["results"]
    assert "the victim's secret" not in page.text and page.json()["tags"] != {"team": "victims"}
    log = client.get(api + "/log", headers=outsider)
    assert "the victim's secret" not in log.text
    assert client.post(api + "/stop", headers=outsider).status_code == 202
    assert client.put(api + "/tags", headers=outsider, json={"tags": {"team": "outsiders"}}).status_code == 200
    _set_state(GENERIC, run_id, "failed")
    deleted = client.delete(api + "?delete_results=true", headers=outsider)
    assert deleted.status_code == 200 and deleted.json()["results_uri"] != victim.results_uri

    assert _victim_objects(s3_hook, victim) == before  # no stop.json, same tags, nothing deleted
    assert read_json(s3_hook, victim.tags_uri) == {"team": "victims"}
    assert client.get(f"/api/v2/dags/{DEMO}/dagRuns/{run_id}", headers=admin).json()["state"] == "queued"
    owner = client.get(f"/sat/api{RUN.format(dag=DEMO, run=run_id)}", headers=admin)
    assert owner.status_code == 200 and owner.json()["results"] == victim.results_uri
    assert owner.json()["history"][0]["reason"] == "the victim's secret status"  # the owner still reads it
    log = client.get(f"/sat/api{RUN.format(dag=DEMO, run=run_id)}/log", headers=admin)
    assert log.status_code == 200 and "the victim's secret log line" in log.text


@pytest.mark.parametrize("record", [
    pytest.param("legacy", id="twin-validated-before-adr-0024"),
    pytest.param("forged", id="twin-record-naming-the-victims-dag"),
])
def test_a_twin_whose_record_reaches_another_dags_prefix_is_refused_by_every_route(
        client, admin, s3_hook, record):
    run_id, victim = _victim(client, admin, s3_hook, legacy=True)
    before = _victim_objects(s3_hook, victim)
    outsider = {**_headers("outsider"), "Origin": "http://sat.test"}
    _twin(client, outsider, run_id)
    _set_validated(GENERIC, run_id, _demo_job() if record == "legacy" else scoped(_demo_job(), DEMO))
    _set_state(GENERIC, run_id, "failed")
    for method, path in _run_routes():
        url = "/sat" + path.replace("{dag_id}", GENERIC).replace("{run_id}", run_id) \
            .replace("{name:path}", "job.log").replace("{name}", "job.log")
        response = client.request(method, url, headers=outsider, json={"tags": {"a": "b"}})
        assert response.status_code in (403, 404), (method, path, response.status_code, response.text[:200])
        assert "the victim's secret" not in response.text
    assert _victim_objects(s3_hook, victim) == before
    owner = client.get(f"/sat/api{RUN.format(dag=DEMO, run=run_id)}", headers=admin)
    assert owner.status_code == 200 and owner.json()["results"] == victim.results_uri
