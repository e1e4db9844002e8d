"""A person reads and acts only on runs of DAGs they may, and only on what a run owns (issue 29.4, ADR 0024).

The attack: `outsider` (the auth manager denies them the DAG `tiny-llama-demo`) starts a run of
the generic DAG named `tiny-llama-demo`, with the victim's destination and run id, and uses
their own run's `/sat` routes. Before, its results prefix was the victim's: they read its status
history and job log, stopped it and deleted its results. Now the prefix is scoped by the run's
DAG and every route reads the run's recorded prefix; a record whose prefix is not its DAG's
(a legacy generic twin, a forged XCom) gives 404 on every route. The routes are exercised in
tests/security/test_view_requests.py, on that module's app (tests/sat_tasks/ui/test_api.py's
fixtures: one API server per module, so they share it); the helpers and the record's rules live here.
"""

from __future__ import annotations

import pytest

from sat_tasks.airflow.params import params_from_spec
from sat_tasks.io.object_storage import write_json
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.ui.jobs import RunRef, job_of
from tests.sat_tasks.ui.test_api import DEMO, GENERIC, _trigger

RUN = "/jobs/{dag}/runs/{run}"


def _demo_job():
    from sat_tasks.ui.sources import job_specs

    return job_specs()[DEMO]


def _set_validated(dag_id: str, run_id: str, job) -> None:
    """validate_spec's XCom for the run, as the task writes it (or as a person with XCom rights could)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        XComModel.set(key="return_value", value=job.to_dict(), dag_id=dag_id, task_id="validate_spec",
                      run_id=run_id, session=session)


def _twin(client, outsider: dict, run_id: str) -> None:
    """The outsider's run of the generic DAG: the victim's job name, destination and run id."""
    response = client.post(f"/api/v2/dags/{GENERIC}/dagRuns", headers=outsider,
                           json={"dag_run_id": run_id, "logical_date": None, "conf": params_from_spec(_demo_job())})
    assert response.status_code == 200, response.text


def _victim(client, admin, s3_hook, *, legacy: bool = False) -> tuple[str, JobRun]:
    """A run of tiny-llama-demo with a status history, a job log and tags (legacy: validated before ADR 0024)."""
    run_id = _trigger(client, admin, DEMO)
    job = _demo_job() if legacy else scoped(_demo_job(), DEMO)
    _set_validated(DEMO, run_id, job)
    run = JobRun(job, run_id)
    write_json(s3_hook, run.status_uri, [{"status": "Running", "at": "t", "reason": "the victim's secret status"}])
    write_json(s3_hook, run.tags_uri, {"team": "victims"})
    bucket, key = run.results_uri[len("s3://"):].split("/", 1)
    s3_hook.load_string("the victim's secret log line\n", key=key + "job.log", bucket_name=bucket, replace=True)
    return run_id, run


def _victim_objects(s3_hook, run: JobRun) -> list[str]:
    bucket, prefix = run.results_uri[len("s3://"):].split("/", 1)
    return sorted(s3_hook.list_keys(bucket_name=bucket, prefix=prefix) or [])


def _run_routes() -> list[tuple[str, str]]:
    """Every /sat route that names a run: (method, path template), from the view's app (a new route is covered)."""
    from sat_tasks.ui.app import create_app

    routes = []
    for route in create_app().routes:
        path = getattr(route, "path", "")
        if "{dag_id}" in path and "{run_id}" in path:
            routes += [(method, path) for method in sorted(getattr(route, "methods", None) or []) if method != "HEAD"]
    return routes


# ---- the record decides the layout (no app) ----------------------------------------------------------
def test_job_of_takes_the_runs_recorded_results_and_refuses_one_that_is_not_its_dags():
    demo = _demo_job()
    jobs = {DEMO: demo}
    fresh = job_of(RunRef(DEMO, "r1", "queued"), jobs, GENERIC)
    assert JobRun(fresh, "r1").results_uri.endswith(f"/{DEMO}/{DEMO}/r1/")  # not validated yet: its own DAG's
    legacy = job_of(RunRef(DEMO, "r1", "success", validated=demo.to_dict()), jobs, GENERIC)
    assert JobRun(legacy, "r1").results_uri.endswith(f"/results/{DEMO}/r1/")  # validated before: kept readable
    conf = params_from_spec(demo)
    twin = RunRef(GENERIC, "r1", "success", conf=conf)
    assert JobRun(job_of(twin, jobs, GENERIC), "r1").results_uri.endswith(f"/{GENERIC}/{DEMO}/r1/")
    legacy_twin = RunRef(GENERIC, "r1", "success", conf=conf, validated=demo.to_dict())
    assert job_of(legacy_twin, jobs, GENERIC) is None  # its legacy prefix is tiny-llama-demo's
    forged = RunRef(GENERIC, "r1", "success", conf=conf, validated=scoped(demo, DEMO).to_dict())
    assert job_of(forged, jobs, GENERIC) is None  # a record naming another DAG
    broken = RunRef(DEMO, "r1", "success", validated={"name": 3})
    assert job_of(broken, jobs, GENERIC) is None


# ---- validate_spec asks again for the person who triggered the run (issue 29.6) --------------------------
class _Person:
    """A PersonAccess double: the workspaces and connections this person may use."""

    def __init__(self, name: str, workspaces: set[str] = frozenset(), connections: set[str] = frozenset()):
        self.name, self.workspaces, self.connections = name, workspaces, connections

    def may_use_workspace(self, workspace: str) -> bool:
        return workspace in self.workspaces

    def may_use_connection(self, conn_id: str) -> bool:
        return conn_id in self.connections


def _job_for_person(**fields):
    from sat_tasks.spec import parse_spec

    spec = {"name": "crafted", "image": {"url": "registry.sat.local/sat/training:0.1.0"}, "command": "python t.py",
            "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
            "results": {"destination": "s3://sat-demo/results/"}, **fields}
    return scoped(parse_spec(spec), GENERIC)


@pytest.mark.parametrize(("fields", "person", "refused"), [
    pytest.param({"workspace": "team-secret"}, _Person("outsider"), "workspace: outsider may not run jobs in "
                 "workspace team-secret (it needs the permission to read its pool sat-workspace-team-secret)",
                 id="workspace-denied"),
    pytest.param({"workspace": "team-secret"}, _Person("member", workspaces={"team-secret"}), None,
                 id="workspace-allowed"),
    pytest.param({"image": {"url": "registry.sat.local/x:1", "registry_conn_id": "sat_registry_crafted"}},
                 _Person("outsider"), "image.registry_conn_id: outsider may not use the connection "
                 "sat_registry_crafted (it needs the permission to read it)", id="registry-login-denied"),
    pytest.param({"image": {"url": "registry.sat.local/x:1", "registry_conn_id": "sat_registry_crafted"}},
                 _Person("owner", connections={"sat_registry_crafted"}), None, id="registry-login-allowed"),
    pytest.param({"workspace": "team-secret"}, None, None, id="no-triggering-person-the-deployments-spec"),
])
def test_validate_spec_refuses_what_the_triggering_person_may_not_use(s3_hook, demo_bucket, fields, person, refused):
    from sat_tasks.errors import JobStopped
    from sat_tasks.pipeline.steps import check_person

    run = JobRun(_job_for_person(**fields), f"manual__person-{len(str(fields))}-{person and person.name}")
    if refused is None:
        check_person(run.job, run, person, log=lambda _m: None)
        assert run.history(lambda _m: None).entries() == []
        return
    with pytest.raises(JobStopped, match="refused for the person who triggered the run"):
        check_person(run.job, run, person, log=lambda _m: None)
    last = run.history(lambda _m: None).entries()[-1]
    assert last["status"] == "Failed" and refused in last["reason"]


def test_the_triggering_person_is_asked_of_the_auth_manager_and_runs_no_person_triggered_are_the_deployments():
    from types import SimpleNamespace

    from sat_tasks.airflow.person_access import DAG_TEST_PERSON, triggering_person

    def run(name, run_type="manual"):
        return SimpleNamespace(triggering_user_name=name, run_type=run_type)

    assert triggering_person(run("admin", "scheduled")) is None  # no triggering person: the spec file's author
    assert triggering_person(run(None, "asset_triggered")) is None
    assert triggering_person(run(DAG_TEST_PERSON)) is None  # dag.test(): the deployment's own
    admin = triggering_person(run("admin"))  # [core] simple_auth_manager_users = admin:admin
    assert admin.user is not None and admin.may_use_workspace("team-secret") and admin.may_use_connection("c1")
    stranger = triggering_person(run("mallory"))  # a name the auth manager does not know may use nothing
    assert stranger.user is None and not stranger.may_use_workspace("team-secret")
    assert not stranger.may_use_connection("c1")


def test_kubernetes_objects_of_a_twin_run_have_other_names_and_labels_than_the_victims():
    """On Kubernetes a run's pods, claim and helper pods are named and selected by job and run: a twin of
    the generic DAG (same job name and run id) must neither share a name nor match a cleanup selector."""
    from sat_tasks.backends.kubernetes import names

    victim, twin = scoped(_demo_job(), DEMO), scoped(_demo_job(), GENERIC)
    run_id = "manual__2026-01-01T00:00:00+00:00"
    for name in (names.attempt_name, names.pod_name):
        args = (run_id, 1) if name is names.attempt_name else (run_id, 1, 0)
        assert name(victim, *args) != name(twin, *args)
    assert names.run_volume_claim_name(victim, run_id) != names.run_volume_claim_name(twin, run_id)
    assert names.run_volume_subpaths(victim, run_id) != names.run_volume_subpaths(twin, run_id)

    def selects(selector: str, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in (part.split("=", 1) for part in selector.split(",")))

    assert not selects(names.run_label_selector(twin, run_id), names.run_labels(victim, run_id))
    assert not selects(names.run_label_selector(twin, run_id), names.labels(victim, run_id, 1))
    assert not selects(names.attempt_label_selector(twin, run_id, 1), names.labels(victim, run_id, 1))
    assert selects(names.run_label_selector(victim, run_id), names.labels(victim, run_id, 1))
    legacy = _demo_job()  # a run validated before ADR 0024 keeps its names (its pods may still be running)
    assert names.run_label_selector(legacy, run_id) == f"{names.LABEL_JOB}={DEMO},{names.LABEL_RUN_ID}=" \
        + names.label_value(run_id)


def test_a_generic_twin_keeps_its_own_warm_state_not_the_job_dags():
    from sat_tasks.io.warm_pool import state_uri

    demo = _demo_job()
    assert state_uri(scoped(demo, DEMO)) == state_uri(demo)  # a job DAG's runs keep the state they had
    assert state_uri(scoped(demo, GENERIC)) != state_uri(demo)
    assert state_uri(scoped(demo, GENERIC)).endswith(f"/{DEMO}@{GENERIC}.json")
