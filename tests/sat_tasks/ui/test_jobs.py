"""The Training Jobs view's rows and job pages, from what a run's tasks wrote (no DB, no bucket)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from ckpt_engine.contract import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    TRAINER_STATE_NAME,
    checkpoint_dir,
)
from sat_tasks.airflow.params import params_from_spec
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.spec import parse_spec
from sat_tasks.ui.jobs import RunRef, job_of, job_page, list_rows
from tests.sat_tasks.spec.test_spec import BASE

GENERIC = "sat_training_job"
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _job(name: str, **fields):
    spec = copy.deepcopy(BASE)
    spec.update(name=name, **fields)
    return parse_spec(spec)


def _written(job, run_id: str) -> dict:
    """What the demo's tasks write for a run with one hardware fault and a resume."""
    layout = JobRun(job, run_id)
    xid = "[21004.510907] NVRM: Xid (PCI:0000:3b:00): 79, pid=17112, name=python, GPU has fallen off the bus."
    return {
        layout.status_uri: [
            {"status": "Pending", "at": "t0", "attempt": None},
            {"status": "Running", "at": "t1", "attempt": 1},
            {"status": "Pending - failoverinprogress", "at": "t2", "attempt": 1},
            {"status": "Running", "at": "t3", "attempt": 2},
        ],
        layout.progress_uri: {"step": 120, "last_committed_step": 100, "committed_steps": [100, 80, 60],
                              "last_mirrored_step": 100},
        layout.attempt_uri(1): {"job": job.name, "attempt": 1, "backend": "local", "node": "node-0", "exit_code": -9,
                                "progress": {"last_committed_step": 60}},
        layout.verdict_uri(1): {"kind": "HARDWARE", "reason": "Xid 79", "evidence": [xid]},
        layout.attempt_uri(2): {"job": job.name, "attempt": 2, "backend": "local", "node": "node-1", "exit_code": None,
                                "progress": {"resumed_from_step": 60, "last_committed_step": 100}},
    }


def test_rows_in_the_services_words_newest_first_sat_dags_only():
    demo, nightly = _job("demo-job"), _job("nightly-job", schedule="0 3 * * *")
    jobs = {"demo-job": demo, "nightly-job": nightly}
    store = _written(scoped(demo, "demo-job"), "manual__1")  # where the run's tasks write (ADR 0024)
    runs = [
        RunRef("demo-job", "manual__1", "running", start_date=T0 + timedelta(minutes=5)),
        RunRef("nightly-job", "scheduled__1", "queued", start_date=T0, next_run=T0 + timedelta(days=1)),
        RunRef("someone_elses_dag", "manual__9", "success", start_date=T0 + timedelta(minutes=9)),
    ]
    rows = list_rows(runs, jobs, store.get, GENERIC)
    assert [row["job"] for row in rows] == ["demo-job", "nightly-job"]  # not the DAG that is no Training Job
    queued = RunRef("nightly-job", "scheduled__2", "queued")  # not started: the newest of all
    assert next(r["run_id"] for r in list_rows([*runs, queued], jobs, store.get, GENERIC)) == "scheduled__2"
    first = rows[0]
    assert first["status"] == "Running" and first["attempt"] == 2 and first["last_checkpoint_step"] == 100
    assert (first["learning_type"], first["framework"], first["nodes"]) == ("on-demand", "pytorch", 1)
    assert first["tags"] == {"team": "ml"} and first["grid"] == "/dags/demo-job/runs/manual__1"
    assert rows[1]["status"] == "Pending" and rows[1]["attempt"] is None  # nothing written yet
    assert rows[1]["next_run"] == (T0 + timedelta(days=1)).isoformat()
    assert [row["job"] for row in list_rows(runs, jobs, store.get, GENERIC, status="Pending")] == ["nightly-job"]


def test_a_run_that_ended_before_writing_history_says_how_it_ended():
    job = _job("early-end")
    row = list_rows([RunRef("early-end", "r", "failed", start_date=T0, end_date=T0 + timedelta(seconds=42))],
                    {"early-end": job}, {}.get, GENERIC)[0]
    assert row["status"] == "Failed" and row["duration_s"] == 42.0


def test_the_generic_dags_runs_are_read_from_their_form_conf():
    job = _job("from-the-form")
    ref = RunRef(GENERIC, "manual__2", "running", conf=params_from_spec(job))
    assert job_of(ref, {}, GENERIC).name == "from-the-form"
    broken = RunRef(GENERIC, "manual__3", "failed", conf={"name": "ab"})
    assert job_of(broken, {}, GENERIC) is None


def test_job_page_has_the_spec_history_attempts_with_evidence_and_checkpoints():
    job = _job("demo-job")
    store = _written(job, "manual__1")
    page = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, store.get)
    assert page["spec"]["name"] == "demo-job" and len(page["history"]) == 4
    first, second = page["attempts"]
    assert (first["node"], first["verdict"], first["exit_code"]) == ("node-0", "HARDWARE", -9)
    assert "GPU has fallen off the bus" in first["evidence"][0]
    assert second["resumed_from_step"] == 60 and second["verdict"] is None  # still running
    checkpoints = page["checkpoints"]
    assert (checkpoints["committed_steps"], checkpoints["last_mirrored_step"]) == ([100, 80, 60], 100)
    assert [c["step"] for c in checkpoints["steps"]] == [100, 80, 60]  # newest first
    assert not any(c["mirrored"] for c in checkpoints["steps"])  # no manifest in Object Storage in this store


def _mirrored(job, run_id: str, store: dict, step: int, log_history: list[dict]) -> dict:
    """A mirrored checkpoint: its manifest and trainer_state.json, and the objects' sizes."""
    prefix = f"{JobRun(job, run_id).mirror_uri}{checkpoint_dir(step)}/"
    files = {"model.safetensors": {"size": 2000, "checksum": "xxh3_64/16MiB:1"},
             TRAINER_STATE_NAME: {"size": 300, "checksum": "xxh3_64/16MiB:2"}}
    store[prefix + MANIFEST_NAME] = {"step": step, "files": files, "format": MANIFEST_FORMAT}
    store[prefix + TRAINER_STATE_NAME] = {"global_step": step, "log_history": log_history}
    return {prefix: {name: entry["size"] for name, entry in files.items()}}


def test_checkpoints_say_size_mirrored_and_verified():
    job = _job("demo-job")
    store = _written(job, "manual__1")
    sizes = _mirrored(job, "manual__1", store, 100, [])
    sizes.update(_mirrored(job, "manual__1", store, 80, []))
    torn = next(prefix for prefix in sizes if prefix.endswith("checkpoint-80/"))
    sizes[torn] = {"model.safetensors": 1999}  # a short copy, and trainer_state.json missing
    page = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, store.get,
                    lambda prefix: sizes.get(prefix, {}))
    newest, torn_row, unmirrored = page["checkpoints"]["steps"]
    assert (newest["size_bytes"], newest["files"], newest["mirrored"], newest["verified"]) == (2300, 2, True, True)
    assert torn_row["mirrored"] and torn_row["verified"] is False
    assert "model.safetensors" in torn_row["note"] and "trainer_state.json" in torn_row["note"]
    assert (unmirrored["mirrored"], unmirrored["verified"]) == (False, None)


def test_monitoring_has_loss_steps_per_second_and_a_failover_marker():
    job = _job("demo-job")
    store = _written(job, "manual__1")
    store[JobRun(job, "manual__1").attempt_uri(2)]["started_at"] = "2026-12-01T10:00:30+00:00"
    t0 = T0.timestamp()
    history = [{"step": 10, "loss": 5.0, "sat_time": t0 + 10, "sat_attempt": 1},
               {"step": 20, "loss": 3.0, "sat_time": t0 + 15, "sat_attempt": 1},
               {"step": 70, "loss": 1.0, "sat_time": t0 + 40, "sat_attempt": 2},
               {"step": 80, "loss": 0.9, "sat_time": t0 + 44, "sat_attempt": 2},
               {"step": 80, "eval_loss": 1.2}, {"train_runtime": 30.0, "step": 80}]
    _mirrored(job, "manual__1", store, 100, history)
    monitoring = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, store.get)["monitoring"]
    assert [(p["step"], p["loss"]) for p in monitoring["loss"]] == [(10, 5.0), (20, 3.0), (70, 1.0), (80, 0.9)]
    # 10 steps in 5 s (attempt 1), 10 steps in 4 s (attempt 2); never across the failover
    assert [(r["step"], r["steps_per_second"]) for r in monitoring["steps_per_second"]] == [(20, 2.0), (80, 2.5)]
    (marker,) = monitoring["markers"]
    assert marker["attempt"] == 2 and marker["step"] == 60 and marker["at"] == t0 + 30
    assert marker["label"] == "attempt 2 after HARDWARE, resumed from step 60"


def test_edited_tags_replace_the_specs_in_the_row():
    job = _job("demo-job")
    store = _written(scoped(job, "demo-job"), "manual__1")
    store[JobRun.of(job, "demo-job", "manual__1").tags_uri] = {"team": "vision", "cost-center": "42"}
    row = list_rows([RunRef("demo-job", "manual__1", "running", start_date=T0)], {"demo-job": job}, store.get,
                    GENERIC)[0]
    assert row["tags"] == {"team": "vision", "cost-center": "42"}


def test_html_list_and_job_page_show_the_services_words_and_escape_everything():
    from sat_tasks.ui.pages import job_page_html, list_page

    job = scoped(_job("demo-job", tags={"team": "<script>alert(1)</script>"}), "demo-job")  # as job_of gives it
    store = _written(job, "manual__1")
    ref = RunRef("demo-job", "manual__1", "running", start_date=T0)
    from sat_tasks.ui.run_index import JobsPage, ListQuery

    # the list's extra columns (ADR 0022) beside the row this module builds
    extra = {"gpus_per_node": 0, "creator": None, "workspace": None, "submitted": None, "queue_s": None,
             "running": True, "gpu_hours": 0.0, "node_hours": 0.0, "cpu_only": True, "running_since": None,
             "goodput": None}
    rows = [{**row, **extra} for row in list_rows([ref], {"demo-job": job}, store.get, GENERIC)]
    html = list_page(JobsPage(rows, len(rows), ListQuery(status="Running")))
    assert "<script>alert" not in html and "&lt;script&gt;" in html  # (the page's own script is its last block)
    assert "href='/sat/jobs/demo-job/runs/manual__1'" in html and ">Running</span>" in html
    assert "<option value='Running' selected>" in html
    page = job_page_html(job_page(ref, job, store.get))
    assert "GPU has fallen off the bus" in page and "HARDWARE" in page and "node-0" in page
    assert all(f"<tr><td>{step}</td>" in page for step in (100, 80, 60))  # the Checkpoints tab's rows
    assert "href='/dags/demo-job/runs/manual__1'" in page
    for tab in ("Details", "Attempts", "Checkpoints", "Logs", "Monitoring", "Tags"):
        assert f"data-tab='{tab.lower()}'>{tab}</a>" in page and f"<section class='tab' id='{tab.lower()}'>" in page
    assert "id='stop'" in page and "id='delete'" in page  # a running job can be stopped
    assert "data-api='/sat/api/jobs/demo-job/runs/manual__1'" in page  # the live status reads the page's API
    assert "href='/sat/api/jobs/demo-job/runs/manual__1/log'" in page and "download job.log" in page
    assert "No Training Jobs yet." in list_page(JobsPage([], 0, ListQuery()))


def test_job_page_reads_each_file_once():
    job = _job("demo-job")
    store = _written(job, "manual__1")
    reads: list[str] = []

    def read(uri):
        reads.append(uri)
        return store.get(uri)

    job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, read)
    assert len(reads) == len(set(reads))


def test_the_monitoring_tab_draws_loss_and_rate_with_the_failover_marker():
    from sat_tasks.ui.pages import job_page_html

    job = _job("demo-job")
    store = _written(job, "manual__1")
    store[JobRun(job, "manual__1").attempt_uri(2)]["started_at"] = "2026-12-01T10:00:30+00:00"
    t0 = T0.timestamp()
    _mirrored(job, "manual__1", store, 100, [
        {"step": 10, "loss": 5.0, "sat_time": t0 + 10, "sat_attempt": 1},
        {"step": 20, "loss": 3.0, "sat_time": t0 + 15, "sat_attempt": 1},
        {"step": 70, "loss": 1.0, "sat_time": t0 + 40, "sat_attempt": 2},
        {"step": 80, "loss": 0.9, "sat_time": t0 + 44, "sat_attempt": 2}])
    html = job_page_html(job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, store.get))
    assert "<figure class='chart' id='loss-chart'>" in html and "<figure class='chart' id='rate-chart'>" in html
    assert html.count("attempt 2 after HARDWARE, resumed from step 60") == 2  # a marker on each chart
    stopped = job_page(RunRef("demo-job", "manual__1", "success", start_date=T0), job, store.get)
    assert "id='stop'" not in job_page_html(stopped)  # an ended run has nothing to stop
    empty = job_page_html(job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, {}.get))
    assert "no checkpoint mirrored yet" in empty and "Loss by step: no data yet." in empty


def test_the_attempts_read_are_bounded_by_the_job_not_by_what_status_json_claims():
    job = _job("demo-job")
    layout = JobRun(job, "manual__1")
    store = _written(job, "manual__1")
    store[layout.status_uri].append({"status": "Running", "at": "t4", "attempt": 400})
    reads: list[str] = []

    def read(uri):
        reads.append(uri)
        return store.get(uri)

    page = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, read)
    attempt_reads = [uri for uri in reads if uri.startswith(layout.results_uri + "attempts/")]
    assert len(attempt_reads) == 2 * job.max_attempts() < 400
    assert [a["attempt"] for a in page["attempts"]] == list(range(1, job.max_attempts() + 1))


def _wrongly_typed(job, run_id: str, what: str) -> dict:
    layout = JobRun(job, run_id)
    store = _written(job, run_id)
    mirror = f"{layout.mirror_uri}{checkpoint_dir(100)}/"
    store[mirror + MANIFEST_NAME] = {"step": 100, "files": {"x": {"size": 1, "checksum": "c"}}, "format": MANIFEST_FORMAT}
    if what == "status":
        store[layout.status_uri] = [{"status": 7, "attempt": "2"}, "Running", {"attempt": [1]}, None]
    elif what == "status-not-a-list":
        store[layout.status_uri] = {"attempt": 400}
    elif what == "progress":
        store[layout.progress_uri] = {"committed_steps": ["100", None, {}], "last_mirrored_step": "100",
                                      "last_committed_step": [1]}
    elif what == "progress-not-a-list":
        store[layout.progress_uri] = {"committed_steps": 100, "last_mirrored_step": 100}
    elif what == "trainer-state":
        store[mirror + TRAINER_STATE_NAME] = {"log_history": [{"step": "10", "loss": 1.0}, {"step": 20, "loss": "x"},
                                                              {"step": 30, "loss": 1.0, "sat_time": "soon"},
                                                              {"step": 40, "loss": 0.5, "sat_time": 3.0}, 5]}
    elif what == "trainer-state-history":
        store[mirror + TRAINER_STATE_NAME] = {"log_history": "not a list"}
    elif what == "attempt-record":
        store[layout.attempt_uri(1)] = {"node": ["node-0"], "exit_code": "nine"}
        store[layout.verdict_uri(1)] = {"kind": "NOT_A_KIND"}
    elif what == "manifest":
        store[mirror + MANIFEST_NAME] = {"step": "x", "files": [], "format": MANIFEST_FORMAT}
    return store


@pytest.mark.parametrize("what", [
    pytest.param("status", id="status-entries"),
    pytest.param("status-not-a-list", id="status-not-a-list"),
    pytest.param("progress", id="progress-fields"),
    pytest.param("progress-not-a-list", id="progress-committed-steps"),
    pytest.param("trainer-state", id="trainer-state-entries"),
    pytest.param("trainer-state-history", id="trainer-state-log-history"),
    pytest.param("attempt-record", id="attempt-record-and-verdict"),
    pytest.param("manifest", id="manifest"),
])
def test_wrongly_typed_records_give_a_page_not_an_exception(what):
    from sat_tasks.ui.pages import job_page_html

    job = _job("demo-job")
    store = _wrongly_typed(job, "manual__1", what)
    ref = RunRef("demo-job", "manual__1", "running", start_date=T0)
    page = job_page(ref, job, store.get)
    assert "demo-job" in job_page_html(page)
    assert list_rows([ref], {"demo-job": job}, store.get, GENERIC)[0]["job"] == "demo-job"


def test_what_does_not_validate_is_shown_as_unreadable():
    job = _job("demo-job")
    page = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job,
                    _wrongly_typed(job, "manual__1", "attempt-record").get)
    first = page["attempts"][0]
    assert first["unreadable"] == ["attempt record", "verdict"] and "unreadable" in first["reason"]
    assert first["node"] is None and first["verdict"] is None
    assert page["attempts"][1]["node"] == "node-1"  # the readable one is shown as before
    torn = _wrongly_typed(job, "manual__1", "manifest")
    newest = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job, torn.get)["checkpoints"]["steps"][0]
    assert newest["mirrored"] is False and "unreadable" in newest["note"]
    typed = job_page(RunRef("demo-job", "manual__1", "running", start_date=T0), job,
                     _wrongly_typed(job, "manual__1", "trainer-state").get)["monitoring"]
    assert [(p["step"], p["t"]) for p in typed["loss"]] == [(30, None), (40, 3.0)]


def _older_elastic_run(job, run_id: str) -> dict:
    """An elastic run written before the Running entries carried node counts (ADR 0029): its records list the nodes."""
    layout = JobRun(job, run_id)
    return {
        layout.status_uri: [
            {"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 1, "task": "launch",
             "reason": "attempt 1 started on a, b"},
            {"status": "Pending - failoverinprogress", "at": "2026-12-01T10:30:00+00:00", "attempt": 1},
            {"status": "Running", "at": "2026-12-01T10:40:00+00:00", "attempt": 2, "task": "launch",
             "reason": "attempt 2 started on b; resumed on 1 of 2 nodes (a excluded: HARDWARE)"},
            {"status": "Completed", "at": "2026-12-01T11:10:00+00:00", "attempt": 2},
        ],
        layout.attempt_uri(1): {"job": job.name, "attempt": 1, "backend": "local", "node": "a", "nodes": ["a", "b"],
                                "exit_code": -9},
        layout.attempt_uri(2): {"job": job.name, "attempt": 2, "backend": "local", "node": "b", "nodes": ["b"],
                                "exit_code": 0},
    }


def test_an_older_elastic_runs_usage_takes_the_nodes_its_attempt_records_list():
    elastic = _job("elastic-job", nodes=2, elastic={"min_nodes": 1})
    ref = RunRef("elastic-job", "manual__1", "success", start_date=T0, end_date=T0 + timedelta(hours=2))
    page = job_page(ref, elastic, _older_elastic_run(elastic, "manual__1").get)
    assert [a["nodes"] for a in page["attempts"]] == [["a", "b"], ["b"]]
    # 2 nodes x 30 min + 1 node x 30 min = 1.5 node-hours (8 GPUs each: 12 GPU-hours, not 16)
    assert (page["node_hours"], page["gpu_hours"]) == (1.5, 12.0)
    # a job without elastic runs on its nodes whatever its records list (the local backend lists the one it used)
    plain = _job("plain-job", nodes=2)
    page = job_page(ref, plain, _older_elastic_run(plain, "manual__1").get)
    assert (page["node_hours"], page["gpu_hours"]) == (2.0, 16.0)


def test_the_attempts_tab_shows_each_faults_recovery_by_phase_from_the_report():
    from sat_tasks.ui.pages import job_page_html

    job = _job("demo-job")
    store = _written(job, "manual__1")
    ref = RunRef("demo-job", "manual__1", "success", start_date=T0)
    before = job_page(ref, job, store.get)
    assert before["recovery"] is None  # no report yet
    assert "measured from the run's series when the run ends" in job_page_html(before)
    store[JobRun(job, "manual__1").report_uri] = {"recovery": [
        {"attempt": 1, "next_attempt": 2, "node": "node-0", "next_node": "node-1", "verdict": "HARDWARE",
         "resumed_from_step": 60, "recovery_s": 2.64,
         "phases": {"detect": 0.8, "schedule": 0.6, "start": 0.7, "restore": 0.4, "first_step": 0.14}},
        "not an entry",
    ], "planned_restarts": [
        {"attempt": 2, "next_attempt": 3, "node": "node-1", "next_node": "node-0,node-1", "verdict": "PLANNED_RESTART",
         "resumed_from_step": "<b>100</b>", "recovery_s": True,
         "phases": {"detect": 1.0, "schedule": "x", "start": None, "restore": None, "first_step": None},
         "unknown": {"restore": "attempt 3's trainer did not report the end of its checkpoint load"}},
    ]}
    page = job_page(ref, job, store.get)
    failover, planned = page["recovery"]
    assert (failover["attempt"], failover["next_node"], failover["recovery_s"], failover["planned"]) == (
        1, "node-1", 2.64, False)
    assert [(name, value) for name, value, _ in failover["phases"]] == [
        ("detect", 0.8), ("schedule", 0.6), ("start", 0.7), ("restore", 0.4), ("first step", 0.14)]
    assert planned["planned"] and planned["recovery_s"] is None and planned["resumed_from_step"] is None
    assert planned["phases"][1][1] is None and "did not report" in planned["phases"][3][2]  # wrongly typed: unknown
    html = job_page_html(page)
    assert "<td><b>2.6 s</b></td><td>0.8 s</td><td>0.6 s</td><td>0.7 s</td><td>0.4 s</td><td>0.1 s</td>" in html
    assert "2 (node-1, planned restart to grow back)" in html
    assert "title='attempt 3&#39;s trainer did not report the end of its checkpoint load'>unknown</td>" in html
    assert "<b>100</b>" not in html
    store[JobRun(job, "manual__1").report_uri] = {"recovery": []}
    assert "nothing to recover from" in job_page_html(job_page(ref, job, store.get))


def test_a_stopped_jobs_header_says_how_long_it_ran_and_does_not_tick():
    """Issue 45.6: the job's status is Stopped while its DAG run still wraps up (uploads, finalize): the header says
    "ran" up to the Stopped entry, with nothing ticking, and the GPU-hours stay put; a running job's header ticks."""
    from sat_tasks.ui.pages import job_page_html

    job = _job("stop-job")
    layout = JobRun(job, "manual__1")
    running = {layout.status_uri: [{"status": "Running", "at": (T0 + timedelta(seconds=10)).isoformat(), "attempt": 1}]}
    now = T0 + timedelta(minutes=10)
    live = job_page(RunRef("stop-job", "manual__1", "running", start_date=T0), job, running.get, now=now)
    html = job_page_html(live)
    assert live["active"] and "running for <span class='duration ticking'" in html and "data-rate=" in html
    stopped = {layout.status_uri: running[layout.status_uri] + [
        {"status": "Stopped", "at": (T0 + timedelta(minutes=3, seconds=52)).isoformat(), "attempt": 1}]}
    page = job_page(RunRef("stop-job", "manual__1", "running", start_date=T0), job, stopped.get, now=now)
    html = job_page_html(page)
    assert not page["active"] and page["duration_s"] == 232.0
    assert "ran <span class='duration' id='run-duration'>" in html and "running for" not in html
    assert "ticking" not in html.split("id='run-usage'")[0].split("id='run-times'")[1] and "data-rate=" not in html


def test_goodput_is_rounded_as_the_job_report_rounds_it():
    """Issue 45.6: the list and the page said 87% where the report said 85.9%: one figure, one rounding."""
    from sat_tasks.ui.pages import job_page_html

    job = _job("goodput-job")
    page = job_page(RunRef("goodput-job", "manual__1", "success", start_date=T0, end_date=T0 + timedelta(hours=1)),
                    job, {}.get)
    page["goodput"] = 0.8594
    report = f"{page['goodput']:.1%}"  # as report_html writes it
    assert report == "85.9%" and f">{report}</span>" in job_page_html(page)
