"""Runs of the generic DAG triggered through the REST API with a short conf (issue 45 item 1): listed, with a page.

Airflow fills what the conf leaves out (`data_source`, `results_destination`, `image_url`, ...)
from the DAG's Params, and validate_spec records the job the run's tasks use. The list and the
job page show that job: the recorded one once validate_spec ran, else the conf merged with the
Params defaults. Uses the app, client and people of test_api.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sat_tasks.airflow.params import generic_params
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.ui.jobs import RunRef, generic_defaults, job_of
from tests.sat_tasks.ui.test_api import GENERIC, _trigger, admin, app, client  # noqa: F401

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
# What an automation sends: the job's own fields; the form fields with Params defaults left out.
LEFT_OUT = ("data_source", "results_destination", "image_url", "memory", "shared_memory", "job_failover", "tags",
            "extra", "registry_conn_id", "file_storage_mount")


def short_conf(name: str) -> dict:
    return {"name": name, "learning_type": "on-demand", "framework": "pytorch", "nodes": 1, "server_type": "cpu",
            "gpus_per_node": 0, "command": "python fake_train.py", "script_url": "s3://sat-demo/scripts/seed_train.py"}


def _list(client, admin, **params) -> dict:  # noqa: F811
    response = client.get("/sat/api/jobs", headers=admin, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _page(client, admin, run_id: str):  # noqa: F811
    return client.get(f"/sat/api/jobs/{GENERIC}/runs/{run_id}", headers=admin)


def test_the_conf_is_merged_with_the_generic_dags_params_defaults():
    assert not set(LEFT_OUT) & set(short_conf("x"))
    assert generic_defaults() == {name: param.value for name, param in generic_params().items()}
    job = job_of(RunRef(GENERIC, "manual__1", "queued", conf=short_conf("short-unit")), {}, GENERIC)
    assert job is not None and job.name == "short-unit"
    assert (job.data.source, job.results.destination, job.image.url) == (
        generic_defaults()["data_source"], generic_defaults()["results_destination"], generic_defaults()["image_url"])
    assert JobRun(job, "manual__1").results_uri.endswith(f"/{GENERIC}/short-unit/manual__1/")  # scoped: its DAG's
    recorded = scoped(job.model_copy(update={"tags": {"from": "validate_spec"}}), GENERIC).to_dict()
    ran = job_of(RunRef(GENERIC, "manual__1", "success", conf=short_conf("short-unit"), validated=recorded), {},
                 GENERIC)
    assert ran is not None and ran.tags == {"from": "validate_spec"}  # the record, not the conf


def test_a_run_triggered_with_a_short_conf_is_listed_and_its_page_answers(client, admin):  # noqa: F811
    run_id = _trigger(client, admin, GENERIC, short_conf("short-conf-job"))
    found = _list(client, admin, q="short-conf-job")
    assert found["total"] == 1, found
    row = found["jobs"][0]
    assert (row["job"], row["run_id"], row["status"]) == ("short-conf-job", run_id, "Pending")
    page = _page(client, admin, run_id)
    assert page.status_code == 200, page.text
    spec = page.json()["spec"]
    assert spec["name"] == "short-conf-job" and spec["data"]["source"] == generic_defaults()["data_source"]
    assert client.get(f"/sat/jobs/{GENERIC}/runs/{run_id}", headers=admin).status_code == 200  # the HTML page too


def test_a_row_indexed_unlisted_takes_the_job_its_run_validated(client, admin, s3_hook):  # noqa: F811
    """As an older SAT indexed such runs (listed False, never looked at again): the record lists it."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    from sat_tasks.ui.run_index import INDEX

    run_id = _trigger(client, admin, GENERIC, short_conf("validated-later"))
    assert _list(client, admin, q="validated-later")["total"] == 1  # indexed (from the conf and the defaults)
    job = job_of(RunRef(GENERIC, run_id, "queued", conf=short_conf("validated-later")), {}, GENERIC)
    ran = scoped(job.model_copy(update={"tags": {"team": "automation"}, "nodes": 1}), GENERIC)
    from sat_tasks.io.object_storage import write_json

    write_json(s3_hook, JobRun(ran, run_id).status_uri, [
        {"status": "Pending", "at": T0.isoformat(), "reason": "spec validated"},
        {"status": "Running", "at": (T0 + timedelta(minutes=1)).isoformat(), "attempt": 1},
        {"status": "Completed", "at": (T0 + timedelta(minutes=5)).isoformat(), "attempt": 1}])
    with create_session() as session:
        session.execute(update(INDEX).where(INDEX.c.dag_id == GENERIC, INDEX.c.run_id == run_id)
                        .values(listed=False, job="", spec_at=None))  # what the index held before the fix
    assert _list(client, admin, q="validated-later")["total"] == 0
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=GENERIC, run_id=run_id).one()
        XComModel.set(key="return_value", value=ran.to_dict(), dag_id=GENERIC, task_id="validate_spec",
                      run_id=run_id, session=session)
        run.state, run.start_date, run.end_date = "success", T0, T0 + timedelta(minutes=6)
    rows = _list(client, admin, q="validated-later")["jobs"]
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["job"], row["status"], row["attempt"], row["tags"]) == (
        "validated-later", "Completed", 1, {"team": "automation"})
    assert _list(client, admin, tag="team=automation", q="validated-later")["total"] == 1
    page = _page(client, admin, run_id)
    assert page.status_code == 200, page.text
    assert page.json()["status"] == "Completed" and page.json()["spec"]["tags"] == {"team": "automation"}
    again = _list(client, admin, q="validated-later")["jobs"][0]
    assert again == {**row, "duration_s": again["duration_s"]}  # re-taken once: the next sync changes nothing


def test_a_validated_record_that_is_not_a_job_is_not_listed(client, admin):  # noqa: F811
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    run_id = _trigger(client, admin, GENERIC, short_conf("forged-record"))
    assert _list(client, admin, q="forged-record")["total"] == 1
    with create_session() as session:
        XComModel.set(key="return_value", value={"name": 3}, dag_id=GENERIC, task_id="validate_spec",
                      run_id=run_id, session=session)
    assert _list(client, admin, q="forged-record")["total"] == 0  # nothing of an unreadable record is read
    assert _page(client, admin, run_id).status_code == 404


def test_a_rerun_after_validation_sends_the_runs_own_conf_again(client, admin):  # noqa: F811
    """validate_spec's record holds what it filled in (the deployment's backend, the results' DAG): a Re-run sends
    the run's conf again, not the record's form values (found by the service test: the confs differed)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    conf = short_conf("rerun-validated")
    run_id = _trigger(client, admin, GENERIC, conf)
    job = job_of(RunRef(GENERIC, run_id, "queued", conf=conf), {}, GENERIC)
    recorded = scoped(job.with_backend("local"), GENERIC).to_dict()
    assert recorded["backend"] == "local" and recorded["results"]["dag_id"] == GENERIC
    with create_session() as session:
        XComModel.set(key="return_value", value=recorded, dag_id=GENERIC, task_id="validate_spec", run_id=run_id,
                      session=session)
    again = client.post(f"/sat/api/jobs/{GENERIC}/runs/{run_id}/rerun", headers=admin)
    assert again.status_code == 201, again.text
    original = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{run_id}", headers=admin).json()["conf"]
    rerun = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{again.json()['run_id']}", headers=admin).json()["conf"]
    assert rerun == original
