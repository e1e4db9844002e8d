"""The Training Jobs list's cost per request does not grow with the number of spec files (issue 48.5).

Counted, not timed: the files of the jobs directory a request stats or lists, the SQL statements it
sends and the parameters they bind, at 20 specs and at 300 (each spec's DAG in the metadata DB, as
the DAG processor leaves it, so the person may read every one). Before: a stat per spec file, and
an `IN` of every readable spec's DAG id in the sync's, the count's, the page's and the usage's queries.

Uses the app, client and people of test_api.py (the same module-scoped API server app).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from tests.sat_tasks.ui.test_api import GENERIC, ROOT, _good_form, admin, app, client  # noqa: F401

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
DEMO_SPEC = ROOT / "include" / "jobs" / "tiny-llama-demo.yaml"
PREFIX = "cost-spec-"


def _write_specs(jobs_dir, first: int, last: int) -> None:
    text = DEMO_SPEC.read_text()
    for n in range(first, last):
        (jobs_dir / f"{PREFIX}{n:05d}.yaml").write_text(text.replace("name: tiny-llama-demo", f"name: {PREFIX}{n:05d}"))


def _age(path, seconds: float = 60.0) -> None:
    """Set `path`'s mtime `seconds` back (a directory nobody wrote just now)."""
    stamp = datetime.now(UTC).timestamp() - seconds
    os.utime(path, (stamp, stamp))


class Cost:
    """What one request did: jobs-directory listings and file stats, SQL statements and their parameters."""

    def __init__(self, jobs_dir) -> None:
        self.jobs_dir = str(jobs_dir)
        self.listings = self.stats = self.statements = self.parameters = 0

    def audit(self, event: str, args: tuple) -> None:
        if event in ("os.scandir", "os.listdir") and args and str(args[0]) == self.jobs_dir:
            self.listings += 1

    def stat(self, path) -> None:
        if os.path.dirname(os.fspath(path)) == self.jobs_dir:
            self.stats += 1

    def sql(self, parameters) -> None:
        self.statements += 1
        self.parameters += len(parameters) if isinstance(parameters, (tuple, list, dict)) else 0

    def __repr__(self) -> str:
        return (f"listings={self.listings} stats={self.stats} statements={self.statements} "
                f"parameters={self.parameters}")


_counting: list[Cost] = []  # the Cost counting now (an audit hook cannot be removed: it looks here)
_hooked: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _counting:
        _counting[-1].audit(event, args)


@pytest.fixture
def counted(monkeypatch):
    """`count(jobs_dir, call)`: the `Cost` of `call()`."""
    import sys

    from airflow import settings
    from sqlalchemy import event

    if not _hooked:  # once per process
        sys.addaudithook(_audit)
        _hooked.append(True)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if _counting:
            _counting[-1].stat(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)

    def before(_conn, _cursor, _statement, parameters, _context, _many):
        if _counting:
            _counting[-1].sql(parameters)

    event.listen(settings.engine, "before_cursor_execute", before)

    def count(jobs_dir, call) -> Cost:
        cost = Cost(jobs_dir)
        _counting.append(cost)
        try:
            call()
        finally:
            _counting.pop()
        return cost

    yield count
    event.remove(settings.engine, "before_cursor_execute", before)


@pytest.fixture
def spec_dags():
    """`add(first, last)`: the DAGs of specs `first`..`last - 1` in the metadata DB (removed afterwards)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    def add(first: int, last: int) -> None:
        with create_session() as session:
            for n in range(first, last):
                session.add(DagModel(dag_id=f"{PREFIX}{n:05d}", bundle_name="dags-folder", fileloc=str(DEMO_SPEC)))

    yield add
    with create_session() as session:
        session.execute(delete(DagModel).where(DagModel.dag_id.startswith(PREFIX)))


def test_a_list_request_costs_the_same_at_20_and_at_300_specs(client, admin, counted, spec_dags, tmp_path,  # noqa: F811
                                                                 monkeypatch):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.ui import run_index, sources
    from sat_tasks.ui.create import validate_form

    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    _write_specs(jobs_dir, 0, 20)
    spec_dags(0, 20)
    _age(jobs_dir)
    monkeypatch.setenv("AIRFLOW__SAT__JOBS_DIR", str(jobs_dir))
    # the service's cache, its clock stopped: no recheck of each file falls inside the counted requests
    monkeypatch.setattr(sources, "SPECS", run_index.SpecCache(recheck_s=run_index.SPEC_RECHECK_S, clock=lambda: 0.0))
    conf = params_from_spec(validate_form(_good_form("cost-job"), exists=lambda uri: True).job)
    with create_session() as session:
        for n in range(60):
            session.add(DagRun(dag_id=GENERIC, run_id=f"cost__{n:04d}", run_type="manual", conf=conf, state="success",
                               queued_at=T0 + timedelta(minutes=n), run_after=T0 + timedelta(minutes=n),
                               triggering_user_name="cost"))

    def requests() -> None:
        listed = client.get("/sat/api/jobs", headers=admin, params={"q": "cost-job"})
        assert listed.status_code == 200 and listed.json()["total"] == 60, listed.text
        page = client.get("/sat/jobs", headers=admin, params={"q": "cost-job"})
        assert page.status_code == 200, page.text

    requests()  # parses the specs, indexes the runs
    small = counted(jobs_dir, requests)

    _write_specs(jobs_dir, 20, 300)
    spec_dags(20, 300)
    _age(jobs_dir, 30.0)  # another mtime than the last look's: the new files count at once
    requests()
    assert len(sources.job_specs()) == 300
    large = counted(jobs_dir, requests)

    assert (large.listings, large.stats) == (small.listings, small.stats) == (0, 0), (small, large)
    assert (large.statements, large.parameters) == (small.statements, small.parameters), (small, large)


def test_the_spec_cache_stats_the_directory_and_each_file_only_when_it_may_have_changed(tmp_path):
    from sat_tasks.spec import load_spec
    from sat_tasks.ui.run_index import RACY_NS, SpecCache

    parsed: list[str] = []

    def load(path):
        parsed.append(path.name)
        return load_spec(path)

    now = [100.0]
    _write_specs(tmp_path, 0, 3)
    _age(tmp_path)
    wall = [os.stat(tmp_path).st_mtime_ns + RACY_NS]  # the directory changed 2 s before the cache looks: not racy
    cache = SpecCache(load, recheck_s=5.0, clock=lambda: now[0], wall_ns=lambda: wall[0])
    assert len(cache.jobs(tmp_path)) == 3 and cache.full_looks == 1 and len(parsed) == 3
    now[0] += 4.0
    assert len(cache.jobs(tmp_path)) == 3 and cache.full_looks == 1  # one stat of the directory

    # a file added: the directory's mtime says so at once
    _write_specs(tmp_path, 3, 4)
    os.utime(tmp_path, ns=(wall[0] - 10 * RACY_NS, wall[0] - 10 * RACY_NS))
    assert f"{PREFIX}00003" in cache.jobs(tmp_path) and cache.full_looks == 2 and parsed[-1] == f"{PREFIX}00003.yaml"

    # a file rewritten in place (the directory unchanged): seen when the recheck is due, parsed again alone
    (tmp_path / f"{PREFIX}00001.yaml").write_text(DEMO_SPEC.read_text().replace(
        "name: tiny-llama-demo", f"name: {PREFIX}00001").replace("nodes: 1", "nodes: 2"))
    assert cache.jobs(tmp_path)[f"{PREFIX}00001"].nodes == 1 and cache.full_looks == 2
    now[0] += 5.0
    assert cache.jobs(tmp_path)[f"{PREFIX}00001"].nodes == 2 and cache.full_looks == 3
    assert parsed[-1] == f"{PREFIX}00001.yaml" and len(parsed) == 5

    # a directory that changed just before the look may change again in the same mtime tick: each call looks
    os.utime(tmp_path, ns=(wall[0] - RACY_NS // 2, wall[0] - RACY_NS // 2))
    cache.jobs(tmp_path)
    cache.jobs(tmp_path)
    assert cache.full_looks == 5
    wall[0] += RACY_NS  # now it is older than that: one stat again
    cache.jobs(tmp_path)
    cache.jobs(tmp_path)
    assert cache.full_looks == 6

    # a file removed
    (tmp_path / f"{PREFIX}00000.yaml").unlink()
    os.utime(tmp_path, ns=(wall[0] - 20 * RACY_NS, wall[0] - 20 * RACY_NS))
    assert set(cache.jobs(tmp_path)) == {f"{PREFIX}{n:05d}" for n in (1, 2, 3)} and cache.full_looks == 7


def test_the_spec_cache_without_a_recheck_time_looks_at_each_file_on_each_call(tmp_path):
    from sat_tasks.ui.run_index import SpecCache

    _write_specs(tmp_path, 0, 2)
    _age(tmp_path)
    cache = SpecCache()
    cache.jobs(tmp_path)
    cache.jobs(tmp_path)
    assert cache.full_looks == 2


def test_a_scheduled_jobs_row_gets_its_next_run_from_the_page_dags_alone(client, spec_dags, monkeypatch):  # noqa: F811
    import yaml
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    from sat_tasks.spec import parse_spec
    from sat_tasks.ui import run_index

    spec = yaml.safe_load(DEMO_SPEC.read_text())
    nightly = parse_spec({**spec, "name": f"{PREFIX}00000", "schedule": "@daily"})
    plain = parse_spec({**spec, "name": f"{PREFIX}00001"})
    spec_dags(0, 2)
    asked: list[set[str]] = []
    real = run_index.next_runs
    monkeypatch.setattr(run_index, "next_runs", lambda session, dag_ids: asked.append(set(dag_ids)) or real(session, dag_ids))
    with create_session() as session:
        session.get(DagModel, f"{PREFIX}00000").next_dagrun_create_after = T0
        session.flush()
        rows = [{"dag_id": f"{PREFIX}00000", "next_run": None}, {"dag_id": f"{PREFIX}00001", "next_run": None},
                {"dag_id": GENERIC, "next_run": None}]
        jobs = {nightly.name: nightly, plain.name: plain, **{f"other-{n}": nightly for n in range(50)}}
        run_index.note_next_runs(session, rows, jobs)
    assert asked == [{f"{PREFIX}00000"}]
    assert [row["next_run"] for row in rows] == [T0.isoformat(), None, None]
