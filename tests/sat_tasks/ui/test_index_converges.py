"""The Training Jobs list converges (issue 45.2): after one sync, every run's row says what its job page says (status,
attempt, goodput, last checkpoint, GPU- and node-hours), whatever order creates, state changes and the pipeline's
summaries arrived in, and wherever the syncs fell between them.

Two runs of the generic DAG, each created, started (its history says Running, a checkpoint committed, the launch's
summary XCom) and ended (Completed, a later checkpoint, finalize's summary with goodput, the DAG run `success`), with
one sync somewhere between the events: every interleaving that keeps each run's own events in order (140). The XComs'
times are the events' own, not the order they are committed in: one run's summaries land after the other's newer
ones were applied (as commits do under load). The job pages read an in-memory Object Storage; the list the index.

A running job's last checkpoint is compared once it ended: the engine mirrors progress.json while it trains and the
list reads it when the run ends (the steady path reads the metadata DB only, ADR 0022).
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.sat_tasks.ui.test_api import GENERIC, _good_form

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
RUNS = {  # name: (started, ended, goodput): run "b" starts later but ends sooner, its XComs older than a's end
    "conv-a": (T0 + timedelta(seconds=60), T0 + timedelta(seconds=600), 0.74),
    "conv-b": (T0 + timedelta(seconds=120), T0 + timedelta(seconds=300), 0.79),
}
EVENTS = [(name, step) for name in RUNS for step in ("create", "start", "end")] + [("*", "sync")]
ORDERS = [order for order in itertools.permutations(EVENTS)
          if all([step for run, step in order if run == name] == ["create", "start", "end"] for name in RUNS)]
COMPARED = ("status", "attempt", "goodput", "last_checkpoint_step", "gpu_hours", "node_hours")


class World:
    """The metadata DB's runs and an in-memory Object Storage, moved by the events."""

    def __init__(self, session):
        from sat_tasks.airflow.params import params_from_spec
        from sat_tasks.ui.create import validate_form

        self.session, self.store, self.runs, self.history, self.conf, self.serial = session, {}, {}, {}, {}, 0
        self.prefix = uuid.uuid4().hex[:8]  # run ids of this test's own
        self.made: list[tuple[int, str]] = []  # (DagRun.id, run_id) of every run made: what `clear` deletes
        for name in RUNS:
            result = validate_form(_good_form(name, nodes="2", **{"resources.server_type": "g3",
                                                                   "resources.gpus_per_node": "4"}),
                                   exists=lambda _uri: True)
            assert result.job is not None, result.problems
            self.conf[name] = params_from_spec(result.job)

    def job(self, name):
        from sat_tasks.ui import dag_runs
        from sat_tasks.ui.jobs import job_of
        from sat_tasks.ui.sources import job_specs

        return job_of(dag_runs.recorded_run_ref(self.session, self.runs[name]), job_specs(), GENERIC)

    def layout(self, name):
        from sat_tasks.io.run_layout import RunLayout

        return RunLayout(self.job(name), self.runs[name].run_id)

    def summary(self, name, task_id, fields, at):
        from airflow.models.xcom import XComModel
        from sqlalchemy import update

        from sat_tasks.core.run_summary import SUMMARY_KEY

        run = self.runs[name]
        XComModel.set(SUMMARY_KEY, fields, dag_id=GENERIC, task_id=task_id, run_id=run.run_id, session=self.session)
        self.session.execute(update(XComModel).where(XComModel.dag_run_id == run.id, XComModel.task_id == task_id,
                                                     XComModel.key == SUMMARY_KEY).values(timestamp=at))

    def apply(self, name, step):
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from sqlalchemy import insert

        from sat_tasks.core.run_summary import summarize_history

        started, ended, goodput = RUNS.get(name, (None, None, None))
        if step == "create":  # as a trigger leaves it: the DAG run queued, its task instances (whose XComs follow)
            self.serial += 1
            run = DagRun(dag_id=GENERIC, run_id=f"conv__{self.prefix}_{self.serial:05d}", run_type="manual", conf=self.conf[name],
                         state="queued", queued_at=T0, run_after=T0, triggering_user_name="ana")
            self.session.add(run)
            self.session.flush()
            self.session.execute(insert(TaskInstance), [
                {"task_id": task_id, "dag_id": GENERIC, "run_id": run.run_id, "map_index": -1, "pool": "default_pool"}
                for task_id in ("validate_spec", "finalize")])
            self.runs[name] = run
            self.made.append((run.id, run.run_id))
            self.history[name] = []
        elif step == "start":
            run, layout = self.runs[name], self.layout(name)
            run.state, run.start_date = "running", started
            self.history[name].append({"status": "Running", "at": started.isoformat(), "attempt": 1})
            self.store[layout.status_uri] = list(self.history[name])
            self.store[layout.progress_uri] = {"step": 10, "last_committed_step": 10, "committed_steps": [10]}
            self.summary(name, "validate_spec", summarize_history(self.history[name]).to_dict(), started)
        elif step == "end":
            run, layout = self.runs[name], self.layout(name)
            self.history[name].append({"status": "Completed", "at": ended.isoformat(), "attempt": 1})
            self.store[layout.status_uri] = list(self.history[name])
            self.store[layout.progress_uri] = {"step": 20, "last_committed_step": 20, "committed_steps": [10, 20]}
            self.summary(name, "finalize", {**summarize_history(self.history[name]).to_dict(), "goodput": goodput},
                         ended)
            run.state, run.end_date = "success", ended + timedelta(seconds=5)
        self.session.flush()  # one session: the sync sees each event as committed (commits would only cost fsyncs)
        if step == "sync":
            self.sync()

    def sync(self):
        from sat_tasks.ui import run_index
        from sat_tasks.ui.sources import job_specs

        run_index.sync(self.session, job_specs(), GENERIC, read_json=lambda: self.store.get)

    def compare(self, order):
        """Each run's list row against its page, on the fields both show."""
        from sat_tasks.ui import dag_runs, run_index
        from sat_tasks.ui.jobs import job_page

        for name, run in self.runs.items():
            found = run_index.list_runs(self.session, run_index.ListQuery(q=run.run_id), {GENERIC}, now=NOW).rows
            assert len(found) == 1, (name, order)
            page = {**job_page(dag_runs.recorded_run_ref(self.session, run), self.job(name), self.store.get, now=NOW),
                    **run_index.run_facts(self.session, run)}
            fields = COMPARED if run.end_date is not None else tuple(f for f in COMPARED if f != "last_checkpoint_step")
            row = {field: found[0][field] for field in fields}
            assert row == {field: page[field] for field in fields}, (name, order)

    def clear(self):
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from sqlalchemy import delete

        ids, run_ids = [made[0] for made in self.made], [made[1] for made in self.made]
        self.made.clear()
        self.session.execute(delete(XComModel).where(XComModel.dag_run_id.in_(ids)))
        self.session.execute(delete(TaskInstance).where(TaskInstance.dag_id == GENERIC,
                                                        TaskInstance.run_id.in_(run_ids)))
        self.session.execute(delete(DagRun).where(DagRun.id.in_(ids)), execution_options={"synchronize_session": False})
        self.session.expunge_all()
        self.session.commit()
        self.sync()  # the index forgets them


@pytest.fixture
def world(airflow_db):
    from airflow.utils.session import create_session

    from sat_tasks.ui import run_index

    with create_session() as session:
        run_index.ensure_table(session)  # before the events hold SQLite's write lock
        world = World(session)
        yield world
        session.rollback()
        world.clear()  # what a failed test left


def test_every_interleaving_of_events_and_a_sync_converges_to_the_pages(world):
    assert len(ORDERS) == 140
    for order in ORDERS:
        world.runs.clear()
        world.store.clear()
        for name, step in order:
            world.apply(name, step)
            if step == "sync":
                world.compare(order)  # the runs created so far: their rows already say what their pages say
        world.sync()
        world.compare(order)
        assert set(world.runs) == set(RUNS)
        world.clear()


def test_a_run_first_seen_ended_gets_its_last_checkpoint_and_goodput(world):
    for name, step in EVENTS[:3]:
        world.apply(name, step)
    world.sync()
    from sat_tasks.ui import run_index

    row = run_index.list_runs(world.session, run_index.ListQuery(q=world.runs["conv-a"].run_id), {GENERIC},
                              now=NOW).rows[0]
    assert (row["status"], row["last_checkpoint_step"], row["goodput"], row["running"]) == ("Completed", 20, 0.74,
                                                                                          False)
    world.clear()
