"""The job page's Logs and Outputs: the live job log (tail, follow, download) and the run's files, through the router.

The runs router on an app of its own (FastAPI's TestClient, mounted under /sat as Airflow
does), the run found without the metadata DB, its objects on the embedded S3 server and its
job log in a work directory under tmp_path (the local backend's).
"""

from __future__ import annotations

import copy
import re
import uuid
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ckpt_engine import contract
from sat_tasks.spec import parse_spec, split_s3_uri
from sat_tasks.ui import sources
from sat_tasks.ui.jobs import RunRef
from sat_tasks.ui.routers import runs
from sat_tasks.ui.run_files import BadFileName, check_file_name, group_of
from sat_tasks.ui.security import OWN_RUN, READ_JOBS
from tests.sat_tasks.spec.test_spec import BASE

BUCKET = "run-files-tests"
DAG = "files-job"
RUN_ID = "manual__2026-12-02T07:00:00+00:00"
QUOTED = RUN_ID  # as the page spells it in its links: ':' and '+' literal (sat_tasks.core.links)
HEADER = "2026-12-02T07:00:00+00:00 [sat] attempt 1 of job files-job on node local-0: Starting dataset initialization"


@pytest.fixture
def run(s3_hook, tmp_path, monkeypatch):
    """A running run of a job whose results are on the S3 server and whose job log is in tmp_path's work dir."""
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    spec = copy.deepcopy(BASE)
    spec.update(name=DAG, results={"destination": f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/"})
    found = sources.JobRunFound(None, RunRef(DAG, RUN_ID, "running",  # type: ignore[arg-type]
                                             start_date=datetime(2026, 12, 2, 7, tzinfo=UTC)),
                                parse_spec(spec))
    state = {"found": found}
    monkeypatch.setattr(runs, "find_job_run", lambda session, dag_id, run_id: state["found"])
    monkeypatch.setattr(runs, "object_storage", lambda: s3_hook)
    monkeypatch.setattr(sources, "object_storage", lambda: s3_hook)
    monkeypatch.setattr(runs.run_index, "run_facts", lambda session, dag_run: {})  # no metadata DB here
    return state


@pytest.fixture
def client(run) -> TestClient:
    from airflow.api_fastapi.common.db.common import _get_session

    view = FastAPI()
    view.include_router(runs.router)
    view.dependency_overrides.update({depends.dependency: (lambda: None) for depends in READ_JOBS + OWN_RUN})
    view.dependency_overrides[_get_session] = lambda: None
    airflow = FastAPI()
    airflow.mount("/sat", view)
    return TestClient(airflow, base_url="http://testserver")


def _api(path: str = "") -> str:
    return f"/sat/api/jobs/{DAG}/runs/{RUN_ID}{path}"


def _ended(run, state: str = "success") -> None:
    found = run["found"]
    run["found"] = sources.JobRunFound(None, RunRef(DAG, RUN_ID, state, start_date=found.ref.start_date), found.job)


def _put(s3_hook, uri: str, data: bytes) -> None:
    bucket, key = split_s3_uri(uri)
    s3_hook.load_bytes(data, key=key, bucket_name=bucket, replace=True)


def test_every_new_route_asks_airflows_read_permission_on_the_dag():
    needs = {route.path: {d.dependency for d in route.dependencies} for route in runs.router.routes}
    for path in ("/api/jobs/{dag_id}/runs/{run_id}/log", "/api/jobs/{dag_id}/runs/{run_id}/log/tail",
                 "/api/jobs/{dag_id}/runs/{run_id}/files", "/api/jobs/{dag_id}/runs/{run_id}/files/{name:path}"):
        assert READ_JOBS[0].dependency in needs[path], path


def test_before_the_first_line_the_tail_is_empty_and_the_download_404(client):
    assert client.get(_api("/log/tail")).json() | {"source": None} == {
        "start": 0, "end": 0, "offset": 0, "size": 0, "text": "", "skipped": 0, "restarted": False, "source": None,
        "cursor": None, "more": False, "ended": False}
    missing = client.get(_api("/log"))
    assert missing.status_code == 404 and "first attempt" in missing.json()["detail"]


def test_while_the_job_runs_the_page_follows_the_work_dirs_log(client, run):
    log = run["found"].layout.job_log
    log.parent.mkdir(parents=True)
    log.write_text(HEADER + "\nstep 1 loss 3.0\nstep 2 lo")  # the last line is still being written
    first = client.get(_api("/log/tail")).json()
    assert first["text"] == HEADER + "\nstep 1 loss 3.0\n" and first["ended"] is False
    assert first["source"] == "the run's work directory, as the job writes it"  # not the server's path
    with open(log, "a") as handle:
        handle.write("ss 2.5\n")
    after = client.get(_api("/log/tail"), params={"offset": first["offset"]}).json()
    assert after["text"] == "step 2 loss 2.5\n" and after["start"] == first["offset"]
    assert client.get(_api("/log/tail"), params={"offset": after["offset"]}).json()["text"] == ""
    page = client.get(f"/sat/jobs/{DAG}/runs/{RUN_ID}").text
    assert f"<span class='marker'>{HEADER}</span>\nstep 1 loss 3.0\nstep 2 loss 2.5\n</pre>" in page
    assert f"data-tail='/sat/api/jobs/{DAG}/runs/{QUOTED}/log/tail'" in page and "data-ended='no'" in page
    download = client.get(_api("/log"))
    assert download.status_code == 200 and download.text == log.read_text()
    assert download.headers["content-length"] == str(log.stat().st_size)
    assert 'filename="files-job-manual__2026-12-02T07_00_00_00_00.log"' in download.headers["content-disposition"]


@pytest.mark.parametrize(("offset", "limit", "problem"), [
    pytest.param("-1", None, "offset", id="negative-offset"),
    pytest.param("x", None, "offset", id="offset-not-a-number"),
    pytest.param(None, str(2**21), "limit", id="limit-over-the-cap"),
])
def test_a_bad_offset_or_limit_is_refused_naming_it(client, offset, limit, problem):
    params = {key: value for key, value in (("offset", offset), ("limit", limit)) if value is not None}
    answer = client.get(_api("/log/tail"), params=params)
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", problem]


def test_after_the_run_the_log_comes_from_object_storage_and_the_kubernetes_sections_before_it(client, run, s3_hook):
    _ended(run)
    layout = run["found"].layout
    _put(s3_hook, layout.attempt_log_uri(2), b"attempt two\n")
    _put(s3_hook, layout.attempt_log_uri(1), b"attempt one\n")
    sections = client.get(_api("/log/tail")).json()
    assert sections["text"] == "attempt one\nattempt two\n" and sections["ended"] is True
    assert client.get(_api("/log/tail"), params={"offset": 12}).json()["text"] == "attempt two\n"
    assert client.get(_api("/log")).text == "attempt one\nattempt two\n"
    _put(s3_hook, layout.results_uri + contract.JOB_LOG_NAME, b"the whole log\nwithout a last newline")
    whole = client.get(_api("/log/tail")).json()
    assert whole["text"] == "the whole log\nwithout a last newline" and whole["source"].endswith("/job.log")
    assert client.get(_api("/log")).text == "the whole log\nwithout a last newline"


def test_the_outputs_list_the_runs_files_by_group_and_each_downloads(client, run, s3_hook):
    _ended(run)
    results = run["found"].layout.results_uri
    files = {contract.OUTPUT_DIR + "model/model.safetensors": b"\0" * 3000,
             contract.MIRROR_DIR + "checkpoint-20/manifest.json": b"{}",
             contract.REPORT_NAME: b"{\"status\": \"Completed\"}", contract.STATUS_NAME: b"[]",
             contract.OUTPUT_DIR + "odd name+1.txt": b"<script>alert(1)</script>"}
    for name, data in files.items():
        _put(s3_hook, results + name, data)
    listing = client.get(_api("/files")).json()
    assert [(g["group"], [f["name"] for f in g["files"]]) for g in listing["groups"]] == [
        ("Model and outputs", ["output/model/model.safetensors", "output/odd name+1.txt"]),
        ("Checkpoints", ["checkpoints/checkpoint-20/manifest.json"]),
        ("Report and log", ["report.json"]), ("The run's records", ["status.json"])]
    assert listing["clipped"] is False
    model = client.get(_api("/files/output/model/model.safetensors"))
    assert model.status_code == 200 and model.content == files["output/model/model.safetensors"]
    assert model.headers["content-length"] == "3000" and model.headers["x-content-type-options"] == "nosniff"
    assert 'filename="model.safetensors"' in model.headers["content-disposition"]
    odd = client.get(_api("/files/output/odd%20name%2B1.txt"))
    assert odd.content == files["output/odd name+1.txt"] and odd.headers["content-type"] == "application/octet-stream"
    assert "filename*=UTF-8''odd%20name%2B1.txt" in odd.headers["content-disposition"]
    page = client.get(f"/sat/jobs/{DAG}/runs/{RUN_ID}").text
    assert f"<a href='/sat/api/jobs/{DAG}/runs/{QUOTED}/files/output/odd%20name%2B1.txt' download>" in page
    assert "<td>2.9 KiB</td>" in page and "<script>alert(1)" not in page
    assert client.get(_api("/files/output/nothing-here")).status_code == 404


@pytest.mark.parametrize("name", [
    pytest.param("../other-run/status.json", id="parent"),
    pytest.param("output/../../x", id="parent-inside"),
    pytest.param("output//model", id="empty-part"),
    pytest.param("./status.json", id="dot"),
    pytest.param("output\\model", id="backslash"),
    pytest.param("output/\x00", id="nul"),
])
def test_a_file_name_outside_the_runs_results_is_refused(name):
    with pytest.raises(BadFileName, match=r"^file: a path inside the run's results"):
        check_file_name(name)


def test_a_file_name_outside_the_runs_results_is_refused_by_the_route(client):
    answer = client.get(_api("/files/output%2F..%2F..%2Fother%2Fsecret"))
    assert answer.status_code == 422 and answer.json()["detail"].startswith("file: a path inside the run's results")


@pytest.mark.parametrize(("name", "group"), [
    pytest.param("output/model.bin", "Model and outputs", id="output"),
    pytest.param("checkpoints/checkpoint-5/manifest.json", "Checkpoints", id="checkpoint"),
    pytest.param("report.html", "Report and log", id="report"),
    pytest.param("job.log", "Report and log", id="log"),
    pytest.param("metrics/attempt-1/n0/training.jsonl", "Metrics", id="metrics"),
    pytest.param("attempts/attempt-1.json", "The run's records", id="record"),
    pytest.param("output.bak", "The run's records", id="a-lookalike-name"),
])
def test_the_groups_of_the_outputs_tab(name, group):
    assert group_of(name) == group


def test_the_outputs_stop_at_their_limit(s3_hook, run):
    from sat_tasks.ui.run_files import list_result_files

    results = run["found"].layout.results_uri
    for i in range(5):
        _put(s3_hook, results + f"{contract.OUTPUT_DIR}f{i}", b"x")
    listing = list_result_files(s3_hook, results, limit=3)
    assert listing.clipped and sum(len(files) for _, files in listing.groups) == 3


def test_the_page_links_stay_inside_the_embedded_views_sandbox(client, run):
    page = client.get(f"/sat/jobs/{DAG}/runs/{RUN_ID}").text
    assert re.search(r"target=", page) is None
    assert f"<a href='/dags/{DAG}/runs/{QUOTED}' data-airflow-link>" in page
    assert f"<a href='/sat/jobs/{DAG}/runs/" in page and "id='report-link'" in page


def test_a_store_that_cannot_be_read_leaves_the_logs_and_outputs_saying_so(client, run, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    def unreachable(*args, **kwargs):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    monkeypatch.setattr(runs, "list_result_files", unreachable)
    page = client.get(f"/sat/jobs/{DAG}/runs/{RUN_ID}")
    assert page.status_code == 200 and "id='job-log'" not in page.text
    assert page.text.count("could not read them: EndpointConnectionError") == 2  # the Logs and the Outputs tabs
