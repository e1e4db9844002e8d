"""The jobs list's query layer: filters, sort and pages in SQL over every run, GPU-hours, the spec cache (ADR 0022).

The index table lives in an in-memory SQLite DB here (the query reads that table only);
`sync` against Airflow's own tables is covered by the API tests (test_jobs_list_api.py).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session

from sat_tasks.core.run_summary import (
    RunSummary,
    gpu_hours,
    running_seconds,
    short_node_seconds,
    summarize_history,
    usage,
)
from sat_tasks.spec import parse_spec
from sat_tasks.ui import run_index
from sat_tasks.ui.run_index import (
    INDEX,
    ListQuery,
    ListQueryError,
    SpecCache,
    list_runs,
    parse_query,
)
from tests.sat_tasks.spec.test_spec import BASE

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
DAGS = {"sat_training_job", "team-a-job"}


def _record(n: int, **fields) -> dict:
    record = {
        "dag_id": "sat_training_job", "run_id": f"manual__{n:04d}", "listed": True, "job": f"job-{n:04d}",
        "learning_type": "on-demand", "framework": "pytorch", "nodes": 1, "gpus_per_node": 0, "workspace": None,
        "creator": "admin", "status": "Completed", "run_state": "success",
        "submitted_at": T0 + timedelta(minutes=n), "queued_at": T0 + timedelta(minutes=n),
        "start_date": T0 + timedelta(minutes=n, seconds=30), "end_date": T0 + timedelta(minutes=n + 5),
        "running_s": 0.0, "running_since": None, "tags": "{}", "tags_text": "\n", "short_node_s": 0.0,
        "running_short_nodes": 0,
    }
    tags = fields.pop("tag_map", None)
    if tags is not None:
        record.update(tags=json.dumps(tags), tags_text="\n" + "".join(f"{k}={v}\n" for k, v in tags.items()))
    record.update(fields)
    return record


@pytest.fixture
def session():
    engine = create_engine("sqlite://")
    run_index.metadata.create_all(engine)
    with Session(engine) as db:
        yield db


def _seed(session, records: list[dict]) -> None:
    session.execute(insert(INDEX), records)
    session.commit()


def test_pages_cover_every_run_past_200_newest_first(session):
    _seed(session, [_record(n) for n in range(1, 251)])
    first = list_runs(session, ListQuery(per_page=100), DAGS, now=T0)
    assert first.total == 250 and first.pages == 3
    assert first.rows[0]["run_id"] == "manual__0250" and first.rows[-1]["run_id"] == "manual__0151"
    last = list_runs(session, ListQuery(page=3, per_page=100), DAGS, now=T0)
    assert [row["run_id"] for row in last.rows] == [f"manual__{n:04d}" for n in range(50, 0, -1)]


def test_status_filters_over_every_run_not_the_newest_200(session):
    _seed(session, [_record(n, status="Failed" if n <= 3 else "Completed") for n in range(1, 301)])
    found = list_runs(session, ListQuery(status="Failed"), DAGS, now=T0)
    assert found.total == 3 and {row["run_id"] for row in found.rows} == {"manual__0001", "manual__0002", "manual__0003"}


@pytest.mark.parametrize(("query", "expected"), [
    pytest.param(ListQuery(q="JOB-0002"), {2}, id="name-search-ignores-case"),
    pytest.param(ListQuery(q="100%"), set(), id="like-wildcards-are-literal"),
    pytest.param(ListQuery(tag="team=vision"), {1}, id="tag-pair"),
    pytest.param(ListQuery(tag="team"), {1, 2}, id="tag-key"),
    pytest.param(ListQuery(tag="team=vis"), set(), id="tag-value-is-whole"),
    pytest.param(ListQuery(framework="deepspeed"), {3}, id="framework"),
    pytest.param(ListQuery(learning_type="spot"), {4}, id="learning-type"),
    pytest.param(ListQuery(workspace="ws-a"), {2, 3}, id="workspace"),
    pytest.param(ListQuery(creator="bob"), {4}, id="creator"),
    pytest.param(ListQuery(since=T0 + timedelta(minutes=3)), {3, 4}, id="since"),
    pytest.param(ListQuery(until=T0 + timedelta(minutes=2, seconds=1)), {1, 2}, id="until"),
    pytest.param(ListQuery(workspace="ws-a", framework="pytorch"), {2}, id="filters-combine"),
])
def test_filters_run_in_the_query(session, query, expected):
    _seed(session, [
        _record(1, tag_map={"team": "vision", "project": "x"}),
        _record(2, tag_map={"team": "nlp"}, workspace="ws-a"),
        _record(3, framework="deepspeed", workspace="ws-a"),
        _record(4, learning_type="spot", creator="bob"),
        _record(5, listed=False),  # a generic run without a valid spec: never a row
        _record(6, dag_id="someone-elses-dag"),  # a DAG the person may not read
    ])
    found = list_runs(session, query, DAGS, now=T0)
    assert {int(row["run_id"][-4:]) for row in found.rows} == expected
    assert found.total == len(expected)


def test_sort_by_any_column_both_ways_with_queued_runs_last(session):
    _seed(session, [_record(1, job="b-job", start_date=None, end_date=None, run_state="queued", status="Pending"),
                    _record(2, job="a-job"), _record(3, job="c-job")])
    by_name = list_runs(session, ListQuery(sort="job", order="asc"), DAGS, now=T0)
    assert [row["job"] for row in by_name.rows] == ["a-job", "b-job", "c-job"]
    started = list_runs(session, ListQuery(sort="started", order="asc"), DAGS, now=T0)
    assert [row["job"] for row in started.rows] == ["a-job", "c-job", "b-job"]  # not started: last either way


def test_gpu_hours_count_every_running_interval_failovers_included():
    history = [
        {"status": "Pending", "at": "2026-12-01T10:00:00+00:00"},
        {"status": "Running", "at": "2026-12-01T10:01:00+00:00", "attempt": 1},
        {"status": "Running", "at": "2026-12-01T10:05:00+00:00", "attempt": 1},  # a note: the same interval
        {"status": "Pending - failoverinprogress", "at": "2026-12-01T10:31:00+00:00", "attempt": 1},
        {"status": "Running", "at": "2026-12-01T10:33:00+00:00", "attempt": 2},
        {"status": "Completed", "at": "2026-12-01T11:03:00+00:00"},
    ]
    summary = summarize_history(history)
    assert summary == RunSummary(status="Completed", status_at="2026-12-01T11:03:00+00:00", attempt=2,
                                 running_s=3600.0, running_since=None)
    assert gpu_hours(2, 4, summary.running_s) == 8.0  # 2 nodes x 4 GPUs x (30 + 30 minutes)


def test_a_running_job_adds_its_open_interval_up_to_now(session):
    history = [{"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 1},
               {"status": "Pending - failoverinprogress", "at": "2026-12-01T10:30:00+00:00", "attempt": 1},
               {"status": "Running", "at": "2026-12-01T10:40:00+00:00", "attempt": 2}]
    summary = summarize_history(history)
    assert summary.running_s == 1800.0 and summary.running_since == "2026-12-01T10:40:00+00:00"
    now = datetime(2026, 12, 1, 11, 10, tzinfo=UTC)
    assert running_seconds(summary.running_s, datetime.fromisoformat(summary.running_since), now) == 3600.0
    _seed(session, [_record(1, nodes=2, gpus_per_node=8, workspace="ws-a", running_s=summary.running_s,
                            running_since=datetime.fromisoformat(summary.running_since), end_date=None,
                            run_state="running", status="Running"),
                    _record(2, nodes=1, gpus_per_node=1, workspace="ws-a", running_s=7200.0),
                    _record(3, nodes=1, gpus_per_node=2, running_s=1800.0)])
    found = list_runs(session, ListQuery(sort="job", order="asc"), DAGS, now=now)
    assert [row["gpu_hours"] for row in found.rows] == [16.0, 2.0, 1.0]
    assert found.rows[0]["running"] and found.rows[0]["duration_s"] == (now - (T0 + timedelta(minutes=1, seconds=30))).total_seconds()
    assert found.gpu_hours_by_workspace == {"": 1.0, "ws-a": 18.0}


def test_summaries_tolerate_what_they_cannot_read():
    assert summarize_history([]) == RunSummary()
    assert summarize_history([{"status": "Running", "at": "not a time"}, "junk"]).running_s == 0.0
    assert RunSummary.from_dict({"status": 3, "attempt": True, "running_s": "x"}) == RunSummary()


@pytest.mark.parametrize(("params", "field"), [
    pytest.param({"status": "Sleeping"}, "status", id="status-word"),
    pytest.param({"sort": "secret"}, "sort", id="sort-column"),
    pytest.param({"order": "up"}, "order", id="order"),
    pytest.param({"page": "0"}, "page", id="page-from-1"),
    pytest.param({"per_page": "5000"}, "per_page", id="per-page-bounded"),
    pytest.param({"since": "yesterday"}, "since", id="date"),
    pytest.param({"since": "2026-12-03", "until": "2026-12-02"}, "until", id="start-after-end"),
    pytest.param({"since": "2026-12-02T10:00:00", "until": "2026-12-02T09:00:00"}, "until", id="start-after-end-time"),
])
def test_a_bad_query_names_the_field_and_the_rule(params, field):
    with pytest.raises(ListQueryError) as caught:
        parse_query(params)
    assert caught.value.field == field and caught.value.rule


def test_a_date_range_of_one_day_is_not_refused():
    query = parse_query({"since": "2026-12-02", "until": "2026-12-02"})
    assert (query.since, query.until) == (datetime(2026, 12, 2, tzinfo=UTC), datetime(2026, 12, 3, tzinfo=UTC))


def test_a_query_round_trips_through_its_links():
    query = parse_query({"q": "llama", "status": "Running", "until": "2026-12-02", "sort": "job", "order": "asc",
                         "page": "2", "framework": ""})
    assert query.until == datetime(2026, 12, 3, tzinfo=UTC)  # the whole day asked for
    assert parse_query(query.params()) == query
    assert query.params(page=1)["q"] == "llama" and "page" not in query.params(page=1)


def _write_spec(path, name: str, **fields) -> None:
    import yaml

    spec = copy.deepcopy(BASE)
    spec.update(name=name, **fields)
    path.write_text(yaml.safe_dump(spec))


def test_the_spec_cache_parses_a_file_again_only_when_it_changes(tmp_path):
    from sat_tasks.spec import load_spec

    parsed: list[str] = []

    def load(path):
        parsed.append(path.name)
        return load_spec(path)

    _write_spec(tmp_path / "a.yaml", "job-a")
    _write_spec(tmp_path / "b.yaml", "job-b")
    (tmp_path / "bad.yaml").write_text("name: [")
    cache = SpecCache(load)
    assert set(cache.jobs(tmp_path)) == {"job-a", "job-b"}
    assert set(cache.jobs(tmp_path)) == {"job-a", "job-b"} and sorted(parsed) == ["a.yaml", "b.yaml", "bad.yaml"]
    parsed.clear()
    _write_spec(tmp_path / "b.yaml", "job-b", nodes=2, tags={"changed": "yes"})
    jobs = cache.jobs(tmp_path)
    assert parsed == ["b.yaml"] and jobs["job-b"].nodes == 2
    (tmp_path / "a.yaml").unlink()
    assert set(cache.jobs(tmp_path)) == {"job-b"} and parsed == ["b.yaml"]


def test_the_spec_cache_keeps_the_first_file_of_a_name(tmp_path):
    _write_spec(tmp_path / "a.yaml", "same-name")
    _write_spec(tmp_path / "b.yaml", "same-name", nodes=3)
    assert SpecCache().jobs(tmp_path)["same-name"].nodes == BASE.get("nodes", 1)


def test_the_list_page_shows_the_services_words_escapes_and_links_pages(session):
    from sat_tasks.ui.pages import list_page

    _seed(session, [_record(n, tag_map={"team": "<script>alert(1)</script>"} if n == 60 else None,
                            workspace="ws-a" if n == 60 else None, status="Running" if n == 60 else "Completed",
                            running_since=T0, end_date=None if n == 60 else T0 + timedelta(hours=1),
                            run_state="running" if n == 60 else "success")
                    for n in range(1, 61)])
    found = list_runs(session, ListQuery(), DAGS, now=T0 + timedelta(hours=2))
    html = list_page(found, {"workspace": ["ws-a"], "creator": ["admin"]})
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "href='/sat/jobs/sat_training_job/runs/manual__0060'" in html and ">Running</span>" in html
    assert "Runs 1&ndash;50 of 60" in html and "href='/sat/jobs?page=2'" in html
    assert "class='duration ticking'" in html and "<time class='when'" in html and "On-Demand" in html
    assert "<a href='/sat/workspaces#ws-ws-a' class='workspace'>ws-a</a>" in html
    assert "href='/sat/jobs?sort=job&amp;order=asc'" in html  # a name sorts A-Z first
    assert "href='/sat/jobs?sort=gpu_hours&amp;order=desc'" in html  # an amount, largest first
    assert "href='/sat/jobs?sort=started&amp;order=asc'" in html  # the sorted column flips
    filtered = list_runs(session, ListQuery(status="Failed"), DAGS, now=T0)
    assert "No Training Jobs match these filters." in list_page(filtered)
    selected = list_page(list_runs(session, ListQuery(status="Running"), DAGS, now=T0))
    assert "<option value='Running' selected>" in selected


@pytest.fixture
def heard():
    """What the published summaries were, through a listener registered for the test."""
    from sat_tasks.core import run_summary

    class Recorder(run_summary.SummaryListener):
        def __init__(self) -> None:
            self.seen: list[dict] = []

        def summary_published(self, fields):
            self.seen.append(fields)

    recorder = Recorder()
    run_summary.LISTENERS.append(recorder)
    yield recorder.seen
    run_summary.LISTENERS.remove(recorder)


def test_each_status_change_the_pipeline_saves_is_published(demo_bucket, s3_hook, heard):
    from sat_tasks.core.status import JobStatus
    from sat_tasks.io.run_layout import RunLayout, RunRecords

    job = parse_spec({**copy.deepcopy(BASE), "name": "published-job",
                      "results": {"destination": "s3://sat-demo/results/"}})
    history = RunRecords(RunLayout(job, "manual__published"), hook=s3_hook).history(log=lambda _line: None)
    history.record(JobStatus.RUNNING, "attempt 1 started", attempt=1, task="launch")
    history.record(JobStatus.FAILOVER_IN_PROGRESS, "Xid 79", attempt=1, task="decide")
    assert [fields["status"] for fields in heard] == ["Running", "Pending - failoverinprogress"]
    assert heard[-1]["attempt"] == 1 and heard[-1]["running_since"] is None and heard[-1]["running_s"] >= 0


def test_the_xcom_listener_pushes_in_a_task_merges_finalizes_goodput_and_is_quiet_elsewhere(monkeypatch):
    import airflow.sdk

    from sat_tasks.airflow.summary_xcom import XComSummaryListener
    from sat_tasks.core.run_summary import SUMMARY_KEY

    class TaskInstance:
        dag_id, run_id, task_id, map_index, try_number = "d", "r", "finalize", -1, 1

        def __init__(self) -> None:
            self.pushed: list = []

        def xcom_push(self, key, value):
            self.pushed.append((key, value))

    listener = XComSummaryListener()
    monkeypatch.setattr(XComSummaryListener, "pushed", {})

    def no_context():
        raise RuntimeError("Current context was requested but no context was found!")

    monkeypatch.setattr(airflow.sdk, "get_current_context", no_context)
    listener.summary_published({"status": "Stopped"})  # the API server's Stop: nothing, no error
    ti = TaskInstance()
    monkeypatch.setattr(airflow.sdk, "get_current_context", lambda: {"ti": ti})
    listener.summary_published({"status": "Failed", "attempt": 2})
    listener.summary_published({"goodput": 0.9})
    assert ti.pushed == [(SUMMARY_KEY, {"status": "Failed", "attempt": 2}),
                         (SUMMARY_KEY, {"status": "Failed", "attempt": 2, "goodput": 0.9})]


# ---- elastic attempts on fewer nodes, CPU jobs, and an older deployment's table (ADR 0033) -------------------------
def test_an_elastic_attempt_on_fewer_nodes_counts_only_the_nodes_it_held():
    history = [
        {"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 1, "reason": "attempt 1 started on a, b"},
        {"status": "Pending - failoverinprogress", "at": "2026-12-01T10:30:00+00:00", "attempt": 1},
        {"status": "Running", "at": "2026-12-01T10:40:00+00:00", "attempt": 2,
         "reason": "attempt 2 started on b; resumed on 1 of 2 nodes (a excluded: HARDWARE)", "task": "launch",
         "nodes_held": 1, "nodes": 2},
        {"status": "Completed", "at": "2026-12-01T11:10:00+00:00", "attempt": 2},
    ]
    summary = summarize_history(history)
    assert (summary.running_s, summary.short_node_s, summary.running_short_nodes) == (3600.0, 1800.0, 0)
    # 2 nodes x 30 min + 1 node x 30 min = 1.5 node-hours; x 8 GPUs = 12 GPU-hours (not 16)
    assert usage(2, 8, summary.running_s, summary.short_node_s) == {"gpu_hours": 12.0, "node_hours": 1.5,
                                                                    "cpu_only": False}
    running = summarize_history(history[:3])  # the shrunk attempt runs now: its open interval is 1 node short
    assert (running.short_node_s, running.running_short_nodes) == (0.0, 1)
    now = datetime(2026, 12, 1, 11, 10, tzinfo=UTC)
    since = datetime.fromisoformat(running.running_since)
    short = short_node_seconds(running.short_node_s, running.running_short_nodes, since, now)
    assert usage(2, 8, running_seconds(running.running_s, since, now), short)["gpu_hours"] == 12.0
    assert RunSummary.from_dict(summary.to_dict()) == summary


def test_a_cpu_job_has_no_gpu_hours_and_says_its_node_hours(session):
    assert usage(3, 0, 1200.0) == {"gpu_hours": 0.0, "node_hours": 1.0, "cpu_only": True}
    _seed(session, [_record(1, nodes=3, gpus_per_node=0, workspace="cpu-ws", running_s=1200.0),
                    _record(2, nodes=2, gpus_per_node=4, workspace="gpu-ws", running_s=1800.0, short_node_s=900.0),
                    _record(3, nodes=1, gpus_per_node=0, workspace="cpu-ws", running_s=600.0, listed=False)])
    found = list_runs(session, ListQuery(sort="job", order="asc"), DAGS, now=T0)
    assert [(r["gpu_hours"], r["node_hours"], r["cpu_only"]) for r in found.rows] == [(0.0, 1.0, True),
                                                                                       (3.0, 0.75, False)]
    assert run_index.usage_by_workspace(session, DAGS, now=T0) == {
        "cpu-ws": {"gpu_hours": 0.0, "node_hours": 1.0, "runs": 1},
        "gpu-ws": {"gpu_hours": 3.0, "node_hours": 0.75, "runs": 1}}
    sorted_by_use = list_runs(session, ListQuery(sort="gpu_hours", order="desc"), DAGS, now=T0)
    assert [r["job"] for r in sorted_by_use.rows] == ["job-0002", "job-0001"]


def test_a_run_that_ended_while_running_counts_up_to_its_end():
    since, end = T0, T0 + timedelta(minutes=20)
    assert run_index.closed_at_end(600.0, since, 300.0, 1, end) == {
        "running_s": 1800.0, "running_since": None, "short_node_s": 1500.0, "running_short_nodes": 0}
    assert run_index.closed_at_end(600.0, None, None, None, end)["running_s"] == 600.0


# The table as the first release (2e47b7e) created it: without the columns ADR 0033 added.
FIRST_RELEASE_COLUMNS = ("short_node_s", "running_short_nodes")


def _first_release_table(engine) -> None:
    from sqlalchemy import Column, MetaData, Table

    old = MetaData()
    Table(run_index.TABLE_NAME, old, *[Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                                        for c in INDEX.c if c.name not in FIRST_RELEASE_COLUMNS])
    old.create_all(engine)


def test_an_existing_table_without_the_new_columns_gets_them_and_keeps_its_rows(tmp_path, monkeypatch):
    from sqlalchemy import inspect, text

    engine = create_engine(f"sqlite:///{tmp_path / 'airflow.db'}")
    _first_release_table(engine)
    with engine.begin() as connection:
        connection.execute(text(f"INSERT INTO {run_index.TABLE_NAME} (dag_id, run_id, listed, job, nodes, "
                                "gpus_per_node, tags, tags_text, status, running_s, workspace) VALUES "
                                "('sat_training_job', 'manual__0001', 1, 'old-job', 2, 4, '{}', '\n', 'Completed', "
                                "3600.0, 'ws-a')"))
    monkeypatch.setattr(run_index, "_created", set())
    with Session(engine) as db:
        run_index.ensure_table(db)  # what the API server does on its first list
        assert set(FIRST_RELEASE_COLUMNS) <= {c["name"] for c in inspect(engine).get_columns(run_index.TABLE_NAME)}
        found = list_runs(db, ListQuery(), DAGS, now=T0)  # the old row: NULL shortfall reads as none
        assert [(r["job"], r["gpu_hours"], r["node_hours"]) for r in found.rows] == [("old-job", 8.0, 2.0)]
        assert found.usage_by_workspace == {"ws-a": {"gpu_hours": 8.0, "node_hours": 2.0, "runs": 1}}
    assert run_index.add_missing_columns(engine) == []  # idempotent: a second API server adds nothing


def test_a_column_another_server_added_meanwhile_is_not_an_error(tmp_path, monkeypatch):
    engine = create_engine(f"sqlite:///{tmp_path / 'airflow.db'}")
    _first_release_table(engine)
    real = run_index._columns
    looks: list[set[str]] = []

    def stale_first(bind):  # the first look misses the columns; by its ALTER another server has added them
        looks.append(real(bind))
        if len(looks) == 1:
            _add_behind_its_back(bind)
        return looks[-1]

    monkeypatch.setattr(run_index, "_columns", stale_first)
    assert run_index.add_missing_columns(engine) == []  # its ALTERs lost the race: no error, nothing added twice
    assert set(FIRST_RELEASE_COLUMNS) <= real(engine)


def _add_behind_its_back(engine) -> None:
    from sqlalchemy import text

    with engine.begin() as connection:
        for name, kind in (("short_node_s", "FLOAT"), ("running_short_nodes", "INTEGER")):
            connection.execute(text(f"ALTER TABLE {run_index.TABLE_NAME} ADD COLUMN {name} {kind}"))


def test_an_elastic_job_that_grows_back_runs_short_only_until_the_next_attempt():
    """ADR 0029's grow back: the status stays Running from the shrunk attempt to the next, which holds every node."""
    history = [
        {"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 2,
         "reason": "attempt 2 started on b; resumed on 1 of 2 nodes (a excluded: HARDWARE)", "task": "launch",
         "nodes_held": 1, "nodes": 2},
        {"status": "Running", "at": "2026-12-01T10:20:00+00:00", "attempt": 2,
         "reason": "planned restart to grow back from 1 to 2 of 2 nodes: capacity is back (a released); attempt 3 "
                   "resumes from checkpoint 20 (not a failover: 1 of 3 used)"},
        {"status": "Running", "at": "2026-12-01T10:21:00+00:00", "attempt": 3, "reason": "attempt 3 started on a, b"},
        {"status": "Completed", "at": "2026-12-01T10:51:00+00:00", "attempt": 3},
    ]
    summary = summarize_history(history)
    # one interval of 51 minutes; the first 21 (attempt 2 to the start of attempt 3) one node short
    assert (summary.running_s, summary.short_node_s) == (3060.0, 1260.0)
    assert usage(2, 1, summary.running_s, summary.short_node_s)["node_hours"] == round((2 * 3060 - 1260) / 3600, 3)


def test_a_stopped_row_whose_dag_run_still_wraps_up_does_not_tick(session):
    """Issue 45.6: Stopped at 3m 52s after its start, the DAG run still running (uploads): the row ran 3m 52s."""
    start = T0 + timedelta(minutes=1, seconds=30)
    _seed(session, [_record(1, status="Stopped", status_at=(start + timedelta(seconds=232)).isoformat(),
                            run_state="running", end_date=None),
                    _record(2, status="Running", status_at=None, run_state="running", end_date=None)])
    now = start + timedelta(minutes=10)
    rows = {row["job"]: row for row in list_runs(session, ListQuery(), DAGS, now=now).rows}
    assert (rows["job-0001"]["running"], rows["job-0001"]["duration_s"]) == (False, 232.0)
    assert (rows["job-0002"]["running"], rows["job-0002"]["duration_s"]) == (True, 540.0)  # it started a minute later
