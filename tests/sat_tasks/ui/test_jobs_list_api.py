"""The Training Jobs list through Airflow's API server (in process): every run, filters in the query, the index kept
current by the pipeline's XCom summaries without Object Storage reads (ADR 0022).

Uses the app, client and people of test_api.py (the same module-scoped API server app).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.sat_tasks.ui.test_api import GENERIC, _good_form, admin, app, client  # noqa: F401

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def many_runs(client, admin):  # noqa: F811 - the fixtures of test_api.py
    """205 runs of the generic DAG as the metadata DB holds them (queued by `bulk-<n>`, 3 of them failed)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.ui.create import validate_form

    job = validate_form(_good_form("bulk-job"), exists=lambda uri: True).job
    conf = params_from_spec(job)
    with create_session() as session:
        for n in range(205):
            session.add(DagRun(dag_id=GENERIC, run_id=f"bulk__{n:04d}", run_type="manual", conf=conf,
                               state="failed" if n < 3 else "success", queued_at=T0 + timedelta(minutes=n),
                               run_after=T0 + timedelta(minutes=n), triggering_user_name=f"bulk-{n % 2}"))
    return 205


def _list(client, admin, **params):  # noqa: F811
    response = client.get("/sat/api/jobs", headers=admin, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_list_pages_over_every_run_and_filters_in_the_query(client, admin, many_runs):  # noqa: F811
    first = _list(client, admin, q="bulk-job", per_page=100)
    assert first["total"] == many_runs and first["pages"] == 3 and len(first["jobs"]) == 100
    last = _list(client, admin, q="bulk-job", per_page=100, page=3)
    assert {row["run_id"] for row in last["jobs"]} == {f"bulk__{n:04d}" for n in range(5)}
    failed = _list(client, admin, q="bulk-job", status="Failed")
    assert failed["total"] == 3 and {row["run_id"] for row in failed["jobs"]} == {"bulk__0000", "bulk__0001",
                                                                                    "bulk__0002"}
    mine = _list(client, admin, creator="bulk-1", q="bulk", sort="submitted", order="asc", per_page=2)
    assert mine["total"] == 102 and [row["run_id"] for row in mine["jobs"]] == ["bulk__0001", "bulk__0003"]
    assert mine["jobs"][0]["creator"] == "bulk-1" and mine["jobs"][0]["framework"] == "pytorch"


@pytest.mark.parametrize(("params", "field"), [
    pytest.param({"status": "Asleep"}, "status", id="status"),
    pytest.param({"per_page": "1000"}, "per_page", id="per-page"),
    pytest.param({"sort": "password"}, "sort", id="sort"),
])
def test_a_bad_list_query_is_refused_naming_the_field(client, admin, params, field):  # noqa: F811
    response = client.get("/sat/api/jobs", headers=admin, params=params)
    assert response.status_code == 422 and response.json()["errors"][0]["field"] == field


def test_a_summary_xcom_moves_a_row_with_no_object_storage_read(client, admin, monkeypatch):  # noqa: F811
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from sat_tasks.core.run_summary import SUMMARY_KEY
    from sat_tasks.ui.routers import jobs as jobs_router

    response = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
        "summary-job", nodes="2", **{"resources.server_type": "g3", "resources.gpus_per_node": "4"})})
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    assert _list(client, admin, q="summary-job")["jobs"][0]["status"] == "Pending"

    def no_object_storage():
        raise AssertionError("the list read Object Storage")

    monkeypatch.setattr(jobs_router, "object_storage", no_object_storage)
    started = datetime.now(UTC) - timedelta(minutes=30)
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=GENERIC, run_id=run_id).one()
        run.state, run.start_date = "running", started
        XComModel.set(SUMMARY_KEY, {"status": "Running", "status_at": (started + timedelta(minutes=20)).isoformat(),
                                    "attempt": 2, "running_s": 900.0,
                                    "running_since": (started + timedelta(minutes=20)).isoformat()},
                      dag_id=GENERIC, task_id="validate_spec", run_id=run_id, session=session)
    row = _list(client, admin, q="summary-job")["jobs"][0]
    assert (row["status"], row["attempt"], row["running"]) == ("Running", 2, True)
    # 2 nodes x 4 GPUs x (15 closed + ~10 open minutes)
    assert 3.3 < row["gpu_hours"] < 3.5, row
    assert _list(client, admin, status="Running", q="summary-job")["total"] == 1
    page = client.get("/sat/jobs", headers=admin, params={"q": "summary-job"})
    assert page.status_code == 200 and "class='duration ticking'" in page.text and ">Running</span>" in page.text


def test_saved_tags_show_in_the_list_and_its_tag_filter(client, admin):  # noqa: F811
    response = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form("tagged-job")})
    run_id = response.json()["run_id"]
    assert _list(client, admin, tag="team=ml", q="tagged-job")["total"] == 1
    saved = client.put(f"/sat/api/jobs/{GENERIC}/runs/{run_id}/tags", headers=admin,
                       json={"tags": {"team": "vision"}})
    assert saved.status_code == 200, saved.text
    assert _list(client, admin, tag="team=ml", q="tagged-job")["total"] == 0
    assert _list(client, admin, tag="team=vision", q="tagged-job")["jobs"][0]["tags"] == {"team": "vision"}


def test_a_run_that_ended_is_read_once_for_the_status_its_tasks_wrote(client, admin, s3_hook):  # noqa: F811
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from sat_tasks.io.object_storage import write_json
    from sat_tasks.ui.jobs import job_of
    from sat_tasks.ui.sources import job_specs

    response = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form("stopped-job")})
    run_id = response.json()["run_id"]
    assert _list(client, admin, q="stopped-job")["jobs"][0]["status"] == "Pending"
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=GENERIC, run_id=run_id).one()
        from sat_tasks.ui import dag_runs

        job = job_of(dag_runs.recorded_run_ref(session, run), job_specs(), GENERIC)
        from sat_tasks.io.run_layout import RunLayout

        write_json(s3_hook, RunLayout(job, run_id).status_uri, [
            {"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 1},
            {"status": "Stopped", "at": "2026-12-01T10:10:00+00:00", "reason": "stopped by admin", "attempt": 1}])
        run.state, run.start_date, run.end_date = "failed", T0, T0 + timedelta(minutes=11)
    row = _list(client, admin, q="stopped-job")["jobs"][0]
    assert (row["status"], row["attempt"], row["run_state"]) == ("Stopped", 1, "failed")
    assert row["gpu_hours"] == 0.0 and row["duration_s"] == 660.0


def test_the_page_links_its_pages_and_keeps_the_filters(client, admin, many_runs):  # noqa: F811
    html = client.get("/sat/jobs", headers=admin, params={"q": "bulk-job", "page": "2"})
    assert html.status_code == 200 and f"Runs 51&ndash;100 of {many_runs}" in html.text
    assert "href='/sat/jobs?q=bulk-job&amp;page=3' id='page-next'" in html.text
    assert "href='/sat/jobs?q=bulk-job' id='page-prev'" in html.text and "value='bulk-job'" in html.text


def test_a_list_on_a_quiet_deployment_writes_and_reads_nothing_more(client, admin, many_runs):  # noqa: F811
    from airflow.utils.session import create_session

    from sat_tasks.ui import run_index
    from sat_tasks.ui.sources import job_specs

    _list(client, admin)

    def no_reader():
        raise AssertionError("the sync read Object Storage")

    with create_session() as session:
        assert run_index.sync(session, job_specs(), GENERIC, read_json=no_reader) == run_index.SyncCounts()
