"""A job made with Create is its creator's: another person with the same DAG permissions gets 404 (issue 44.4, ADR 0043).

Every job made with Create is a run of the one generic DAG, and Airflow's permissions are per
DAG: before, `bob` read, stopped, deleted, re-ran and cloned `alice`'s job, listed it, and read
its `env` in the page and the Clone form. Now the run's owner is the person Airflow recorded as
its `triggering_user_name` (Create's, Re-run's or the REST API trigger's authenticated user), and
every `/sat` route that names the run, the compare page and the list answer it only to the owner,
a person sharing an Airflow team with them, and the operators (Op, Admin); to anyone else it is
a run that does not exist. And a secret never reaches the run's conf: Create refuses an `env`
key that names a secret or a value that looks like one, naming the field and the rule.

The app is Airflow's API server with the project's plugins (tests/sat_tasks/ui/test_api.py's
fixtures, one per module). People: alice and bob have the role `user` (every DAG permission,
nothing of pools or connections); olga has `op`; `admin` is an admin.
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import html
import json

import pytest

from tests.sat_tasks.ui.test_api import (  # noqa: F401 (the module-scoped app and its client)
    GENERIC,
    _good_form,
    _headers,
    admin,
    app,
    client,
)
from tests.security.test_run_ownership import _run_routes

OWN = {"Origin": "http://sat.test"}
ENV_VALUE = "alice-private-value-5c1e9"  # not secret-looking (Create takes it), but only alice may read it


def _person(name: str, role: str = "user") -> dict[str, str]:
    return {**_headers(name, role), **OWN}


@pytest.fixture(scope="module")
def alices_job(client) -> str:
    """alice's job, made with Create (the REST API's form), with an env value; its run id."""
    form = _good_form("alice-job", advanced=json.dumps({"env": {"ALICE_SETTING": ENV_VALUE}}))
    response = client.post("/sat/api/jobs", headers=_person("alice"), json={"form": form})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


@pytest.fixture(scope="module")
def alices_other_job(client) -> str:
    """Another of alice's jobs (Compare takes two runs at least)."""
    response = client.post("/sat/api/jobs", headers=_person("alice"), json={"form": _good_form("alice-other-job")})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def _compared(*run_ids: str) -> dict[str, list[str]]:
    return {"run": [f"{GENERIC}/{run_id}" for run_id in run_ids]}


def _url(path: str, run_id: str) -> str:
    return "/sat" + path.replace("{dag_id}", GENERIC).replace("{run_id}", run_id) \
        .replace("{name:path}", "job.log").replace("{name}", "job.log")


def _state(client, admin, run_id: str) -> str:
    response = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{run_id}", headers=admin)
    assert response.status_code == 200, response.text
    return response.json()["state"]


def _listed(client, headers: dict[str, str]) -> set[str]:
    response = client.get("/sat/api/jobs", headers=headers, params={"per_page": 200})
    assert response.status_code == 200, response.text
    return {row["run_id"] for row in response.json()["jobs"] if row["dag_id"] == GENERIC}


def test_another_person_gets_404_on_every_route_of_alices_job_and_changes_nothing(client, admin, alices_job,
                                                                                   alices_other_job):
    bob = _person("bob")
    routes = _run_routes()
    assert len(routes) >= 16, routes  # page, JSON, log, tail, files, report, stop, tags, delete, re-run, clone, ...
    answered = []
    for method, path in routes:
        response = client.request(method, _url(path, alices_job), headers=bob, json={"tags": {"a": "b"}},
                                  follow_redirects=False)
        answered.append((method, path, response.status_code))
        assert response.status_code == 404, (method, path, response.status_code, response.text[:200])
        detail = f"no run {alices_job!r} of {GENERIC!r}"  # as for a run that is not there
        if method == "GET" and not path.startswith("/api/"):  # a page: the not-found page, saying the same
            assert detail in html.unescape(response.text), (path, response.text[:300])
        else:
            assert response.json()["detail"] == detail, (method, path, response.text[:200])
        assert ENV_VALUE not in response.text
    assert {("POST", "/api/jobs/{dag_id}/runs/{run_id}/stop"), ("DELETE", "/api/jobs/{dag_id}/runs/{run_id}"),
            ("POST", "/api/jobs/{dag_id}/runs/{run_id}/rerun"), ("GET", "/jobs/{dag_id}/runs/{run_id}/clone"),
            ("GET", "/api/jobs/{dag_id}/runs/{run_id}/log"), ("GET", "/api/jobs/{dag_id}/runs/{run_id}/files")} \
        <= {(method, path) for method, path, _ in answered}
    assert _state(client, admin, alices_job) == "queued"  # not stopped, not deleted
    runs = client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["dag_runs"]
    assert not [run for run in runs if run["triggering_user_name"] == "bob"]  # no re-run for bob
    compare = client.get("/sat/api/compare", headers=bob, params=_compared(alices_other_job, alices_job))
    assert compare.status_code == 404 and ENV_VALUE not in compare.text
    compare_page = client.get("/sat/compare", headers=bob, params=_compared(alices_job, alices_other_job))
    assert compare_page.status_code == 404 and ENV_VALUE not in compare_page.text


def test_alice_and_the_operators_list_read_and_clone_alices_job_and_bob_does_not_list_it(client, alices_job,
                                                                                         alices_other_job):
    for name, role in (("alice", "user"), ("olga", "op"), ("admin", "admin")):
        person = _person(name, role)
        assert alices_job in _listed(client, person), name
        page = client.get(f"/sat/api/jobs/{GENERIC}/runs/{alices_job}", headers=person)
        assert page.status_code == 200, (name, page.text)
        clone = client.get(f"/sat/jobs/{GENERIC}/runs/{alices_job}/clone", headers=person)
        assert clone.status_code == 200 and ENV_VALUE in clone.text, name  # the owner's env, back in the form
        compare = client.get("/sat/api/compare", headers=person, params=_compared(alices_job, alices_other_job))
        assert compare.status_code == 200, (name, compare.text)
    assert alices_job not in _listed(client, _person("bob"))
    filtered = client.get("/sat/api/jobs", headers=_person("bob"), params={"creator": "alice"}).json()
    assert filtered["jobs"] == [] and filtered["total"] == 0
    page = client.get("/sat/jobs", headers=_person("bob"))
    assert page.status_code == 200 and alices_job not in page.text and "alice-job" not in page.text
    assert ">alice<" not in page.text  # the creators' menu names only the runs listed
    assert ENV_VALUE not in page.text


def test_a_run_triggered_through_the_rest_api_is_its_triggering_persons(client, admin, alices_job):
    conf = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{alices_job}", headers=admin).json()["conf"]
    conf = {**conf, "name": "bob-api-job", "env": {}}
    # The owner is the token's person: a body naming another is refused or ignored, never believed.
    response = client.post(f"/api/v2/dags/{GENERIC}/dagRuns", headers=_person("bob"),
                           json={"logical_date": None, "conf": conf, "triggering_user_name": "alice"})
    if response.status_code == 422:
        response = client.post(f"/api/v2/dags/{GENERIC}/dagRuns", headers=_person("bob"),
                               json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    assert response.json()["triggering_user_name"] == "bob"
    page = f"/sat/api/jobs/{GENERIC}/runs/{run_id}"
    assert client.get(page, headers=_person("bob")).status_code == 200
    assert client.get(page, headers=_person("alice")).status_code == 404
    assert client.post(page + "/stop", headers=_person("alice")).status_code == 404
    assert run_id in _listed(client, _person("bob")) and run_id not in _listed(client, _person("alice"))
    # bob's re-run of his own run is his; alice's re-run of hers is hers
    rerun = client.post(page + "/rerun", headers=_person("bob"))
    assert rerun.status_code == 201, rerun.text
    again = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{rerun.json()['run_id']}", headers=admin).json()
    assert again["triggering_user_name"] == "bob"
    assert client.get(f"/sat/api/jobs/{GENERIC}/runs/{again['dag_run_id']}", headers=_person("alice")).status_code \
        == 404


# ---- no secret in the run's conf ------------------------------------------------------------------------
@pytest.mark.parametrize(("env", "field", "rule"), [
    pytest.param({"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"}, "env.HF_TOKEN", "the name HF_TOKEN names a secret",
                 id="token-name"),
    pytest.param({"WANDB_API_KEY": "0123456789abcdef"}, "env.WANDB_API_KEY", "the name WANDB_API_KEY names a secret",
                 id="api-key-name"),
    pytest.param({"DB_PASSWORD": "pw-9f8e7d"}, "env.DB_PASSWORD", "the name DB_PASSWORD names a secret",
                 id="password-name"),
    pytest.param({"MODEL_HUB": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"}, "env.MODEL_HUB",
                 "the value looks like a Hugging Face token", id="hf-token-value"),
    pytest.param({"UPSTREAM": "AKIAABCDEFGHIJKLMNOP"}, "env.UPSTREAM", "the value looks like an AWS access key id",
                 id="aws-key-value"),
    pytest.param({"DATABASE_URL": "postgresql://trainer:pw-9f8e7d@db:5432/x"}, "env.DATABASE_URL",
                 "the value looks like a URL with a password", id="url-with-password"),
])
def test_create_refuses_a_secret_in_env_naming_the_field_and_rule_and_starts_nothing(client, admin, env, field, rule):
    before = client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"]
    form = _good_form("secret-env-job", advanced=json.dumps({"env": env}))
    response = client.post("/sat/api/jobs", headers=_person("alice"), json={"form": form})
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert [(e["field"], e["input"]) for e in errors] == [(field, "advanced")]
    assert errors[0]["rule"].startswith(rule) and "by reference" in errors[0]["rule"]
    for value in env.values():
        assert value not in json.dumps(errors)
    assert client.get(f"/api/v2/dags/{GENERIC}/dagRuns", headers=admin).json()["total_entries"] == before
    html = client.post("/sat/jobs/new", headers=_person("alice"), data=form)
    assert html.status_code == 422 and f"{field}: {rule}" in html.text


def test_harmless_env_names_are_taken_and_the_form_says_secrets_go_by_reference(client):
    from sat_tasks.spec.env_secrets import env_secret_problems

    assert env_secret_problems({"TOKENIZERS_PARALLELISM": "false", "PASSES": "3", "KEYWORDS": "a,b",
                                "HF_HOME": "/data/hf", "SAT_FINAL_CKPT_GRACE_SECONDS": "30",
                                "URL": "https://example.com/a@b"}) == []
    form = client.get("/sat/jobs/new", headers=_person("alice"))
    assert form.status_code == 200
    assert "env holds no secrets" in form.text and "by reference" in form.text


# ---- a team's grant (Airflow's multi-team mode) ---------------------------------------------------------
def test_a_person_in_the_owners_airflow_team_may_see_the_run_and_others_not(app, monkeypatch):
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.configuration import conf
    from airflow.models.team import Team

    from sat_tasks.ui import security

    def getboolean(section, key, **kw):
        return True if (section, key) == ("core", "multi_team") else type(conf).getboolean(conf, section, key, **kw)

    monkeypatch.setattr(conf, "getboolean", getboolean)
    monkeypatch.setattr(Team, "get_all_team_names", classmethod(lambda cls, **_: {"vision", "speech"}))
    people = {"alice": SimpleAuthManagerUser(username="alice", role="user", teams=["vision"]),
              "boss": SimpleAuthManagerUser(username="boss", role="admin")}
    monkeypatch.setattr("sat_tasks.airflow.person_access.find_user", people.get)
    carol = SimpleAuthManagerUser(username="carol", role="user", teams=["vision"])
    bob = SimpleAuthManagerUser(username="bob", role="user", teams=["speech"])
    assert security.may_see_owned_run(carol, "alice")  # her team's
    assert not security.may_see_owned_run(bob, "alice")  # another team's
    assert not security.may_see_owned_run(carol, "boss")  # an admin is in every team: shares no run by it
    assert not security.may_see_owned_run(carol, "nobody-known")
    assert not security.may_see_owned_run(carol, None)  # no person triggered it: the operators'
    assert security.visible_owners(carol, {"alice", "boss", "carol"}) == {"alice", "carol"}
    assert security.visible_owners(SimpleAuthManagerUser(username="olga", role="op"), {"alice"}) is None
