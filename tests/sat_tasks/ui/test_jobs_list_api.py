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


def test_a_date_filter_whose_start_is_after_its_end_says_so(client, admin):  # noqa: F811
    params = {"since": "2026-12-03", "until": "2026-12-01"}
    answer = client.get("/sat/api/jobs", headers=admin, params=params)
    assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "until"
    assert "after the end" in answer.json()["errors"][0]["rule"]
    html = client.get("/sat/jobs", headers=admin, params=params)
    assert html.status_code == 422
    assert "id='query-error'>until: the start (2026-12-03) is after the end (2026-12-01)" in html.text, html.text


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


# ---- GPU-hours, node-hours and goodput: the list, the job page, the Workspaces page (issue 30.8-9) --------------
U0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
FAILOVER_HISTORY = [  # two attempts: 30 + 30 minutes in Running, a failover between them
    {"status": "Pending", "at": (U0 + timedelta(seconds=30)).isoformat(), "reason": "queued", "attempt": None},
    {"status": "Running", "at": (U0 + timedelta(minutes=1)).isoformat(), "reason": "attempt 1 started", "attempt": 1},
    {"status": "Pending - failoverinprogress", "at": (U0 + timedelta(minutes=31)).isoformat(),
     "reason": "HARDWARE: Xid 79", "attempt": 1},
    {"status": "Running", "at": (U0 + timedelta(minutes=33)).isoformat(), "reason": "attempt 2 started", "attempt": 2},
    {"status": "Completed", "at": (U0 + timedelta(minutes=63, microseconds=123456)).isoformat(),
     "reason": "results uploaded", "attempt": 2},
]
CPU_HISTORY = [
    {"status": "Running", "at": (U0 + timedelta(minutes=1)).isoformat(), "reason": "attempt 1 started", "attempt": 1},
    {"status": "Completed", "at": (U0 + timedelta(minutes=31)).isoformat(), "reason": "results uploaded", "attempt": 1},
]


def _indexed_run(client, admin, s3_hook, form: dict[str, str], history: list[dict], *,  # noqa: F811
                 creator: str = "ana", goodput: float | None = None) -> str:
    """A run of the generic DAG as the pipeline leaves it: created through the API, its DAG run ended, its status.json
    in Object Storage, and the summaries its tasks pushed as XComs (the status history's, finalize's goodput)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from sat_tasks.core.run_summary import SUMMARY_KEY, summarize_history
    from sat_tasks.io.object_storage import write_json
    from sat_tasks.io.run_layout import RunLayout
    from sat_tasks.ui import dag_runs
    from sat_tasks.ui.jobs import job_of
    from sat_tasks.ui.sources import job_specs

    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=GENERIC, run_id=run_id).one()
        run.state, run.queued_at, run.start_date = "success", U0, U0 + timedelta(seconds=30)
        run.end_date, run.triggering_user_name = U0 + timedelta(minutes=64), creator
        job = job_of(dag_runs.recorded_run_ref(session, run), job_specs(), GENERIC)
        write_json(s3_hook, RunLayout(job, run_id).status_uri, history)
        XComModel.set(SUMMARY_KEY, summarize_history(history).to_dict(), dag_id=GENERIC, task_id="validate_spec",
                      run_id=run_id, session=session)
        if goodput is not None:
            XComModel.set(SUMMARY_KEY, {"goodput": goodput}, dag_id=GENERIC, task_id="finalize", run_id=run_id,
                          session=session)
    return run_id


@pytest.fixture(scope="module")
def usage_runs(client, admin, s3_hook):  # noqa: F811
    """Workspace `gpu-team` with a GPU job's run that failed over (2 nodes x 4 GPUs, 30 + 30 min Running, goodput
    0.8); workspace `cpu-team` with a CPU job's run (1 node, no GPU, 30 min Running)."""
    for name, resources in (("gpu-team", {"server_type": "g3", "gpus_per_node": 8}), ("cpu-team", {})):
        body = {"name": name, "nodes": 4, "resources": resources,
                "contract": {"start": "2026-01-01", "end": "2099-12-31"}}
        created = client.post("/sat/api/workspaces", headers=admin, json=body)
        assert created.status_code == 201, created.text
    gpu_form = _good_form("usage-gpu", nodes="2", workspace="gpu-team",
                          **{"resources.server_type": "g3", "resources.gpus_per_node": "4"})
    failover = _indexed_run(client, admin, s3_hook, gpu_form, FAILOVER_HISTORY, goodput=0.8)
    cpu = _indexed_run(client, admin, s3_hook, _good_form("usage-cpu", workspace="cpu-team"), CPU_HISTORY, creator="bo")
    yield {"failover": failover, "cpu": cpu}
    for name in ("gpu-team", "cpu-team"):
        client.delete(f"/sat/api/workspaces/{name}", headers=admin)


@pytest.fixture(scope="module", autouse=True)
def _workspaces_dir(tmp_path_factory):
    """The module's workspaces (`gpu-team`) in a directory of its own."""
    import os

    saved = {name: os.environ.get(name) for name in ("AIRFLOW__SAT__WORKSPACES_DIR", "AIRFLOW__SAT__WORK_DIR")}
    home = tmp_path_factory.mktemp("usage")
    os.environ["AIRFLOW__SAT__WORKSPACES_DIR"] = str(home / "workspaces")
    os.environ["AIRFLOW__SAT__WORK_DIR"] = str(home / "work")
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_gpu_hours_count_both_attempts_of_a_failover_and_goodput_shows_in_the_list(client, admin, usage_runs):  # noqa: F811
    found = _list(client, admin, q="usage-", sort="job", order="asc")
    rows = {row["run_id"]: row for row in found["jobs"]}
    gpu, cpu = rows[usage_runs["failover"]], rows[usage_runs["cpu"]]
    # 2 nodes x 4 GPUs x (30 + 30 minutes): both attempts of the failover count
    assert (gpu["gpu_hours"], gpu["node_hours"], gpu["cpu_only"], gpu["goodput"]) == (8.0, 2.0, False, 0.8)
    assert (gpu["creator"], gpu["workspace"], gpu["queue_s"], gpu["running"]) == ("ana", "gpu-team", 30.0, False)
    # a CPU job: 0 GPU-hours, said as such, and its node-hours (1 node x 30 minutes)
    assert (cpu["gpu_hours"], cpu["node_hours"], cpu["cpu_only"], cpu["goodput"]) == (0.0, 0.5, True, None)
    assert found["usage_by_workspace"]["gpu-team"] == {"gpu_hours": 8.0, "node_hours": 2.0, "runs": 1}
    assert found["usage_by_workspace"]["cpu-team"] == {"gpu_hours": 0.0, "node_hours": 0.5, "runs": 1}
    assert found["gpu_hours_by_workspace"]["gpu-team"] == 8.0
    html = client.get("/sat/jobs", headers=admin, params={"q": "usage-"}).text
    assert "<span class='goodput' title='goodput: time training / wall time (the job report)'>80.0%</span>" in html
    assert ">8.00</span>" in html and "CPU, <span class='amount'><span class='hours'>0.50</span> node-h</span>" in html
    assert "<a href='/sat/workspaces#ws-gpu-team'>gpu-team</a> 8.00" in html
    assert "<a href='/sat/workspaces#ws-cpu-team'>cpu-team</a> 0.00 (CPU, 0.50 node-h)" in html


def test_the_job_page_shows_gpu_hours_goodput_queue_time_and_times_in_the_persons_zone(client, admin, usage_runs):  # noqa: F811
    import re

    run_id = usage_runs["failover"]
    data = client.get(f"/sat/api/jobs/{GENERIC}/runs/{run_id}", headers=admin).json()
    assert (data["gpu_hours"], data["node_hours"], data["running_s"], data["goodput"]) == (8.0, 2.0, 3600.1, 0.8)
    assert (data["creator"], data["queue_s"], data["queued"]) == ("ana", 30.0, U0.isoformat())
    html = client.get(f"/sat/jobs/{GENERIC}/runs/{run_id}", headers=admin).text
    usage = re.search(r"<p id='run-usage'>(.*?)</p>", html, re.DOTALL).group(1)
    assert ">8.00</span>" in usage and ">80.0%</span>" in usage and "data-rate" not in usage  # ended: it ticks no more
    times = re.search(r"<p id='run-times'>(.*?)</p>", html, re.DOTALL).group(1)
    started = (U0 + timedelta(seconds=30)).isoformat()
    assert f"<time class='when' datetime='{started}' data-style='full' id='started-at'" in times
    assert "2026-11-20 08:00:30 UTC</time>" in times and "waited <span id='queue-time'>0m 30s</span>" in times
    assert "class='duration'" in times and "ticking" not in times  # the run has ended: its duration is fixed
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d", re.sub(r"datetime='[^']*'", "", times))  # no microseconds shown
    facts = re.search(r"<p id='run-facts'>(.*?)</p>", html, re.DOTALL).group(1)
    assert "created by <span id='creator'>ana</span>" in facts and "href='/sat/workspaces#ws-gpu-team'" in facts
    assert "2 node(s) &times; 4 GPU(s)" in facts
    # the status history's times too: the person's zone by script, UTC to the second without it
    history = re.sub(r"datetime='[^']*'", "", html.split("<h3>Status history</h3>")[1].split("</table>")[0])
    assert "2026-11-20 09:03:00 UTC</time>" in history and ".123456" not in history
    cpu = client.get(f"/sat/jobs/{GENERIC}/runs/{usage_runs['cpu']}", headers=admin).text
    assert "CPU, <span class='amount'><span class='hours'>0.50</span> node-h</span>" in re.search(r"<p id='run-usage'>(.*?)</p>", cpu, re.DOTALL).group(1)


def test_the_workspaces_page_sums_gpu_and_node_hours_over_its_jobs_runs(client, admin, usage_runs):  # noqa: F811
    listed = {w["name"]: w for w in client.get("/sat/api/workspaces", headers=admin).json()["workspaces"]}
    assert listed["gpu-team"]["usage"] == {"gpu_hours": 8.0, "node_hours": 2.0, "runs": 1}
    assert listed["cpu-team"]["usage"] == {"gpu_hours": 0.0, "node_hours": 0.5, "runs": 1}
    html = client.get("/sat/workspaces", headers=admin).text
    row = html.split("id='ws-gpu-team'")[1].split("</tr>")[0]
    assert "<span class='gpu-hours'>8.00</span>" in row and "2.00 node-h</small>" in row
    assert "href='/sat/jobs?workspace=gpu-team'>1 run(s)</a>" in row
    cpu = html.split("id='ws-cpu-team'")[1].split("</tr>")[0]
    assert "<span class='gpu-hours'>0.00</span>" in cpu and "0.50 node-h (CPU)</small>" in cpu


# ---- in a browser: the list at 1280 px inside Airflow's navigation (issue 30.8) ---------------------------------
CHROMIUM = "/usr/bin/chromium"  # Debian's, as tests/e2e/test_service.py drives it (no browser download)
AIRFLOW_NAV_PX = 220  # Airflow's side navigation: the view's iframe gets the rest of the window
LONG_STATUSES = ("Pending - failoverinprogress", "Pending - maxretriesexceeded", "Pending - imagepullbackoff",
                 "Pending - internalerror", "Running", "Completed")
BROKEN_WORDS = """() => Array.from(document.querySelectorAll('tr.job-row .status')).flatMap(el => {
  const text = el.firstChild, broken = [];
  let at = 0;
  for (const word of text.textContent.split(' ')) {
    if (word) {
      const range = document.createRange();
      range.setStart(text, at); range.setEnd(text, at + word.length);
      if (new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top))).size > 1) broken.push(word);
    }
    at += word.length + 1;
  }
  return broken;
})"""


@pytest.fixture(scope="module")
def wide_runs(client, admin, usage_runs, s3_hook):  # noqa: F811
    """Runs whose cells are as wide as they get: 63-character names, every long status word, a long creator, tags,
    GPUs and none, a workspace, a running duration and GPU-hours that tick. Each ended one's status history says its
    status too (a run first seen ended is read once: its page and its row say what its history says)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from sat_tasks.core.run_summary import SUMMARY_KEY
    from sat_tasks.io.object_storage import write_json
    from sat_tasks.io.run_layout import RunLayout
    from sat_tasks.ui import dag_runs
    from sat_tasks.ui.jobs import job_of
    from sat_tasks.ui.sources import job_specs

    now = datetime.now(UTC)
    for n, status in enumerate(LONG_STATUSES):
        name = f"wide-llama-3-70b-instruct-finetune-on-the-team-corpus-run-{n:03d}"[:63]
        gpus = {"resources.server_type": "g3", "resources.gpus_per_node": "8", "workspace": "gpu-team"} if n % 2 else {}
        response = client.post("/sat/api/jobs", headers=admin, json={"form": _good_form(
            name, nodes="4", tags="team=vision-research\nproject=tiny-llama-long-tag", **gpus)})
        assert response.status_code == 201, response.text
        run_id = response.json()["run_id"]
        running = status == "Running"
        with create_session() as session:
            run = session.query(DagRun).filter_by(dag_id=GENERIC, run_id=run_id).one()
            run.state = "running" if running else "failed" if status != "Completed" else "success"
            run.queued_at, run.start_date = now - timedelta(hours=30), now - timedelta(hours=29, minutes=58)
            run.end_date = None if running else now - timedelta(hours=1)
            run.triggering_user_name = "maria.gonzalez-longname"
            job = job_of(dag_runs.recorded_run_ref(session, run), job_specs(), GENERIC)
            write_json(s3_hook, RunLayout(job, run_id).status_uri,
                       [{"status": status, "at": now.isoformat(), "attempt": 3}])
            XComModel.set(SUMMARY_KEY, {"status": status, "status_at": now.isoformat(), "attempt": 3,
                                        "running_s": 90000.0, "running_since": now.isoformat() if running else None},
                          dag_id=GENERIC, task_id="validate_spec", run_id=run_id, session=session)
            if status == "Completed":
                XComModel.set(SUMMARY_KEY, {"goodput": 0.934}, dag_id=GENERIC, task_id="finalize", run_id=run_id,
                              session=session)
    return "wide-llama"


def test_the_list_fits_1280_px_inside_airflows_navigation_and_no_status_word_breaks(client, admin, wide_runs,  # noqa: F811
                                                                                     usage_runs, tmp_path):
    """Debian's chromium (Playwright) at 1280 px: a stand-in for Airflow's page (its side navigation, the view in an
    iframe taking the rest), the list served by the API server app. The list has no horizontal scroll, no status
    word breaks inside itself, times are relative with no raw UTC, and the screenshot is kept for a person to see.
    A job page then shows its times in the browser's time zone (Berlin here) and how long ago."""
    import os
    import re
    from pathlib import Path
    from urllib.parse import quote, urlsplit

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: `make system-deps` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    shell = (f"<!doctype html><body style='margin:0;display:flex;height:100vh'><nav style='width:{AIRFLOW_NAV_PX}px;"
             "flex:none;background:#f0f0f0'>Airflow</nav><iframe src='/sat/jobs?q=" + wide_runs + "' title='Training Jobs'"
             " style='flex:1;border:0;height:100vh'></iframe></body>")
    served: list[int] = []

    def serve(route):
        url = urlsplit(route.request.url)
        if url.path == "/":
            return route.fulfill(status=200, content_type="text/html", body=shell)
        answer = client.get(url.path + (f"?{url.query}" if url.query else ""), headers=admin)
        served.append(answer.status_code)
        return route.fulfill(status=answer.status_code, content_type=answer.headers["content-type"], body=answer.text)

    shot = Path(os.environ.get("SAT_LIST_SCREENSHOT") or tmp_path / "list_1280.png")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, timezone_id="Europe/Berlin", locale="en-GB")
            page.route("http://sat.test/**", serve)
            page.goto("http://sat.test/")
            frame = page.frame_locator("iframe")
            frame.locator("tr.job-row").first.wait_for()
            view = page.frame(url=re.compile(r".*/sat/jobs\?.*"))
            assert served == [200] and frame.locator("tr.job-row").count() == len(LONG_STATUSES)
            width = view.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            assert width[1] == 1280 - AIRFLOW_NAV_PX and width[0] <= width[1], f"the list scrolls sideways: {width}"
            statuses = frame.locator("tr.job-row .status").all_inner_texts()
            assert {s.replace("\n", " ") for s in statuses} == set(LONG_STATUSES), statuses
            assert view.evaluate(BROKEN_WORDS) == [], "a status word breaks inside itself"
            first = frame.locator("tr.job-row").first
            cells = first.inner_text().replace(first.locator(".run-id").inner_text(), "")  # its id names its time
            assert not re.search(r"\d{2}:\d{2}:\d{2}", cells) and " UTC" not in cells, cells  # relative, local
            page.screenshot(path=str(shot))

            view.goto(f"http://sat.test/sat/jobs/{GENERIC}/runs/{quote(usage_runs['failover'], safe='')}")
            frame.locator("#started-at").wait_for()
            started = frame.locator("#started-at").inner_text()  # 08:00:30 UTC is 09:00:30 in Berlin in November
            assert "20 Nov 2026" in started and "09:00:30" in started and "ago)" in started, started
            assert "UTC" not in frame.locator("#run-times").inner_text()
            assert frame.locator("#run-usage .gpu-hours").inner_text() == "8.00"
        finally:
            browser.close()
    assert shot.stat().st_size > 0
