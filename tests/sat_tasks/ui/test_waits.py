"""Every wait has a reason (issue 45.5): a run that waits says for what, on its list row and its job page, the same.

Each wait is built as the deployment would have it: runs of the generic DAG triggered through the REST API (Airflow
runs in this process: test_api.py's app), their task instances made from the serialized DAG and put in the state the
wait leaves them in, the local pool's board file written as the launch's `PoolBoard` writes it. The list (its JSON
and its HTML) and the job page (its JSON and its HTML) then say why:

- queued behind N runs: the DAG's max_active_runs is reached, N runs of it were queued before;
- waiting for a node slot: the launch runs and its request waits on the board, every slot held;
- waiting for an Airflow worker slot: a task is scheduled, none of the run runs;
- waiting for Spot capacity: the `wait_for_capacity` sensor is up for reschedule after its checks.

And nothing is said of a run that works (its launch holds a node) or ended, nor of a job that ended while its DAG run
wraps up. `why_waiting` (the rule) is checked on
built facts too, the workspace's board and a paused DAG among them.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest

from sat_tasks.core.workspaces import Admission, SlotRequest
from sat_tasks.ui.waits import RunFacts, SpotFacts, TaskFacts, why_waiting
from tests.sat_tasks.ui.test_api import GENERIC, _good_form, _trigger, admin, app, client  # noqa: F401

LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)  # the runs of a test are first in line, whatever other tests left queued


# ---- the deployment's state ------------------------------------------------------------------------------
def _conf(name: str) -> dict:
    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.ui.create import validate_form

    result = validate_form(_good_form(name), exists=lambda _uri: True)
    assert result.job is not None, result.problems
    return params_from_spec(result.job)


def _run(run_id: str):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == GENERIC, DagRun.run_id == run_id))
        session.expunge(run)
        return run


def _start(run_id: str, *, run_after: datetime | None = None, state: str = "running", tasks: dict | None = None):
    """The run in `state`, its task instances made (as the scheduler makes them) and set to `tasks`' states."""
    from airflow.models.dag_version import DagVersion
    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == GENERIC, DagRun.run_id == run_id))
        run.state = state
        if run_after is not None:
            run.run_after = run_after
        if state == "running":
            run.start_date = datetime.now(UTC)
            run.dag = SerializedDagModel.get_dag(GENERIC, session=session)
            run.verify_integrity(session=session,
                                 dag_version_id=DagVersion.get_latest_version(GENERIC, session=session).id)
        session.flush()
        for task_id, task_state in (tasks or {}).items():
            session.execute(update(TaskInstance).where(
                TaskInstance.dag_id == GENERIC, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id)
                .values(state=task_state, scheduled_dttm=datetime.now(UTC)))


def _ti_id(run_id: str, task_id: str):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(TaskInstance.id).where(
            TaskInstance.dag_id == GENERIC, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id))


def _end(*run_ids: str) -> None:
    """The runs ended (failed), so that they hold no place in line for the tests after."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagRun).where(DagRun.dag_id == GENERIC, DagRun.run_id.in_(run_ids))
                        .values(state="failed", end_date=datetime.now(UTC)))


def _said(client, admin, run_id: str) -> str | None:  # noqa: F811
    """The line the list row and the job page say (JSON and HTML); asserts that all four say the same."""
    listed = client.get("/sat/api/jobs", headers=admin, params={"q": run_id})
    assert listed.status_code == 200, listed.text
    rows = [row for row in listed.json()["jobs"] if row["run_id"] == run_id]
    assert len(rows) == 1, listed.json()
    page = client.get(f"/sat/api/jobs/{GENERIC}/runs/{run_id}", headers=admin)
    assert page.status_code == 200, page.text
    line = rows[0]["waiting"]
    assert page.json()["waiting"] == line, (rows[0]["waiting"], page.json()["waiting"])
    list_html = unescape(client.get("/sat/jobs", headers=admin, params={"q": run_id}).text)
    page_html = unescape(client.get(f"/sat/jobs/{GENERIC}/runs/{run_id}", headers=admin).text)
    shown_row = re.findall(r"<small class='waiting' title='why it waits'>(.*?)</small>", list_html)
    shown_page = re.findall(r"<p id='waiting' class='waiting' title='why it waits'( hidden)?>(.*?)</p>", page_html)
    assert shown_row == ([line] if line else []), shown_row
    assert shown_page == [("" if line else " hidden", line or "")], shown_page
    return line


@pytest.fixture
def board(monkeypatch, tmp_path):
    """The local pool's board file of a pool of 2 nodes x 1 slot, written as `PoolBoard` writes it."""
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODES", "n0,n1")
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_NODE_SLOTS", "1")
    owner = {"host": socket.gethostname(), "pid": os.getpid()}

    def write(holding: list[tuple[str, str, str]], queued: list[tuple[str, str]]) -> None:
        def entry(job, run_id, n):
            return {"request": asdict(SlotRequest(ticket=f"{n:03d}", job=job, run_id=run_id, attempt=1, slots=1)),
                    "owner": owner, "since": LONG_AGO.isoformat()}

        state = {"holdings": [{**entry(job, run_id, n), "nodes": [node]}
                              for n, (job, run_id, node) in enumerate(holding)],
                 "queue": [entry(job, run_id, 100 + n) for n, (job, run_id) in enumerate(queued)]}
        (tmp_path / "local-pool").mkdir(exist_ok=True)
        (tmp_path / "local-pool" / "shared.slots.json").write_text(json.dumps(state))

    return write


# ---- each wait, on the list row and the page ---------------------------------------------------------------
def test_a_queued_run_says_how_many_runs_are_ahead_and_what_holds_them(client, admin):  # noqa: F811
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select, update

    running = _trigger(client, admin, GENERIC, _conf("wait-q-running"))
    _start(running)
    queued = [_trigger(client, admin, GENERIC, _conf(f"wait-q-{n}")) for n in range(3)]
    for n, run_id in enumerate(queued):
        _start(run_id, state="queued", run_after=LONG_AGO + timedelta(minutes=n))
    with create_session() as session:
        before = session.scalar(select(DagModel.max_active_runs).where(DagModel.dag_id == GENERIC))
        busy = session.scalar(select(func.count()).where(DagRun.dag_id == GENERIC, DagRun.state == "running"))
        session.execute(update(DagModel).where(DagModel.dag_id == GENERIC).values(max_active_runs=busy))
    try:
        assert _said(client, admin, queued[2]) == (
            f"Queued behind 2 runs: Airflow runs at most {busy} run{'' if busy == 1 else 's'} of {GENERIC} at once "
            f"(max_active_runs) and {busy} are running")
        assert _said(client, admin, queued[0]) == (
            f"Queued, next in line: Airflow runs at most {busy} run{'' if busy == 1 else 's'} of {GENERIC} at once "
            f"(max_active_runs) and {busy} are running")
        with create_session() as session:  # room for one more: it is the scheduler's turn, in order
            session.execute(update(DagModel).where(DagModel.dag_id == GENERIC).values(max_active_runs=busy + 1))
        assert _said(client, admin, queued[1]) == (
            f"Queued behind 1 run: the scheduler starts the runs of {GENERIC} in turn")
    finally:
        with create_session() as session:
            session.execute(update(DagModel).where(DagModel.dag_id == GENERIC).values(max_active_runs=before))
        _end(running, *queued)


def test_a_launch_in_line_on_the_board_says_it_waits_for_a_node_slot(client, admin, board):  # noqa: F811
    runs = {name: _trigger(client, admin, GENERIC, _conf(name)) for name in ("wait-n-a", "wait-n-b", "wait-n-c")}
    for run_id in runs.values():
        _start(run_id, tasks={"attempt_1.launch": "running"})
    board([("wait-n-a", runs["wait-n-a"], "n0"), ("other-job", "manual__other", "n1")],
          [("wait-n-b", runs["wait-n-b"]), ("wait-n-c", runs["wait-n-c"])])
    try:
        assert _said(client, admin, runs["wait-n-c"]) == (
            "Waiting for a node slot: 2 healthy node(s) x 1 slot(s), all in use (by other-job, wait-n-a), "
            "1 job(s) queued ahead")
        assert _said(client, admin, runs["wait-n-b"]).startswith("Waiting for a node slot: 2 healthy node(s)")
        assert _said(client, admin, runs["wait-n-a"]) is None  # it holds n0 and trains: no wait
        board([("wait-n-a", runs["wait-n-a"], "n0")], [("wait-n-b", runs["wait-n-b"]), ("wait-n-c", runs["wait-n-c"])])
        assert _said(client, admin, runs["wait-n-b"]) is None  # n1 is free: it is admitted at its next look
        assert _said(client, admin, runs["wait-n-c"]).endswith("1 job(s) queued ahead")
    finally:
        _end(*runs.values())


def test_a_launch_deferred_to_the_triggerer_trains_and_its_run_is_stopped_through_its_request(client,  # noqa: F811
                                                                                               admin):  # noqa: F811
    """`[sat] local_launch_watch = triggerer` (ADR 0044): the launch task is deferred while its attempt's own process
    trains. The run says no wait, and Stop counts the training as launched (its request, not the run's end)."""
    from airflow.utils.session import create_session

    from sat_tasks.ui import dag_runs

    run_id = _trigger(client, admin, GENERIC, _conf("wait-deferred"))
    _start(run_id, tasks={"attempt_1.launch": "deferred"})
    try:
        assert _said(client, admin, run_id) is None
        with create_session() as session:
            assert dag_runs.training_launched(session, GENERIC, run_id)
        _start(run_id, tasks={"attempt_1.launch": "up_for_retry"})
        with create_session() as session:
            assert not dag_runs.training_launched(session, GENERIC, run_id)
    finally:
        _end(run_id)


def test_a_scheduled_task_with_nothing_running_waits_for_an_airflow_worker_slot(client, admin):  # noqa: F811
    from airflow.configuration import conf

    run_id = _trigger(client, admin, GENERIC, _conf("wait-w"))
    _start(run_id, tasks={"validate_spec": "scheduled"})
    try:
        line = _said(client, admin, run_id)
        assert re.fullmatch(
            r"Waiting for an Airflow worker slot: task validate_spec is scheduled since \d\d:\d\d:\d\d UTC; "
            rf"\d+ of {conf.getint('core', 'parallelism')} worker slots \(\[core\] parallelism\) in use", line), line
        _start(run_id, tasks={"validate_spec": "queued"})
        assert "task validate_spec is queued for a worker" in _said(client, admin, run_id)
        _start(run_id, tasks={"validate_spec": "running"})
        assert _said(client, admin, run_id) is None  # a task of it works
    finally:
        _end(run_id)


def test_a_spot_sensor_up_for_reschedule_says_it_waits_for_spot_capacity(client, admin):  # noqa: F811
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    run_id = _trigger(client, admin, GENERIC, _conf("wait-s"))
    _start(run_id, tasks={"attempt_1.launch": "failed", "attempt_2.wait_for_capacity": "up_for_reschedule"})
    first = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    ti_id = _ti_id(run_id, "attempt_2.wait_for_capacity")
    with create_session() as session:
        for n in range(3):
            start = first + timedelta(seconds=30 * n)
            session.add(TaskReschedule(ti_id, start, start + timedelta(seconds=1), start + timedelta(seconds=30)))
    try:
        assert _said(client, admin, run_id) == (
            "Waiting for Spot capacity: 3 check(s) found none since 10:00:00 UTC; next check at 10:01:30 UTC "
            "(attempt_2.wait_for_capacity)")
    finally:
        _end(run_id)


def test_a_run_that_ended_says_no_wait(client, admin):  # noqa: F811
    run_id = _trigger(client, admin, GENERIC, _conf("wait-e"))
    _start(run_id, tasks={"validate_spec": "scheduled"})
    assert _said(client, admin, run_id) is not None
    _end(run_id)
    assert _said(client, admin, run_id) is None


def test_a_job_that_ended_while_its_dag_run_wraps_up_says_no_wait(client, admin):  # noqa: F811
    from airflow.utils.session import create_session
    from sqlalchemy import update

    from sat_tasks.ui.run_index import INDEX, C

    run_id = _trigger(client, admin, GENERIC, _conf("wait-c"))
    _start(run_id, tasks={"cleanup_run": "scheduled"})
    try:
        assert _said(client, admin, run_id).startswith("Waiting for an Airflow worker slot: task cleanup_run ")
        with create_session() as session:  # the job's last status, as finalize's summary brings it to the index
            session.execute(update(INDEX).where(C.dag_id == GENERIC, C.run_id == run_id).values(status="Completed"))
        assert _said(client, admin, run_id) is None  # beside Completed, the DAG run's cleanup is no wait of the job
    finally:
        _end(run_id)


# ---- the rule, on built facts ------------------------------------------------------------------------------
def _wait(reason: str, position: int = 1) -> Admission:
    return Admission(None, reason, position=position)


def test_the_rule_names_each_wait():
    assert why_waiting(RunFacts("d", "queued", paused=True, ahead=4)) == (
        "Queued: the DAG d is paused; Airflow starts none of its runs until it is unpaused")
    assert why_waiting(RunFacts("d", "queued", ahead=1, running_runs=10, max_active_runs=10)) == (
        "Queued behind 1 run: Airflow runs at most 10 runs of d at once (max_active_runs) and 10 are running")
    assert why_waiting(RunFacts("d", "queued")) == "Queued: next to start; the scheduler has not started it yet"
    assert why_waiting(RunFacts("d", "running", workspace="team-a", workspace_wait=_wait(
        "queued in workspace team-a: position 2, behind j1"))) == (
        "Waiting for workspace team-a: queued in workspace team-a: position 2, behind j1")
    launch = TaskFacts("attempt_1.launch", "running")
    assert why_waiting(RunFacts("d", "running", tasks=(launch,))) is None
    # a launch deferred to the triggerer while its attempt's own process runs the training (ADR 0044): no wait
    assert why_waiting(RunFacts("d", "running", tasks=(TaskFacts("attempt_1.launch", "deferred"),))) is None
    assert why_waiting(RunFacts("d", "running", tasks=(TaskFacts("notify", "deferred"),))) == (
        "Waiting on Airflow's triggerer: task notify is deferred")
    assert why_waiting(RunFacts("d", "running", tasks=(TaskFacts("attempt_2.wait_for_capacity", "up_for_reschedule"),),
                                spot=SpotFacts(0))) == (
        "Waiting for Spot capacity: 0 check(s) found none (attempt_2.wait_for_capacity)")
    pooled = TaskFacts("attempt_1.launch", "scheduled", pool="team-a", pool_slots=2)
    assert why_waiting(RunFacts("d", "running", tasks=(pooled,), workspace="team-a", pools={"team-a": (3, 4)})) == (
        "Waiting for workspace team-a: task attempt_1.launch needs 2 of its 4 slot(s), 3 in use")
    assert why_waiting(RunFacts("d", "running", tasks=(TaskFacts("stage_data", "up_for_retry"),))) == (
        "Waiting to retry task stage_data (its last try failed; Airflow retries it after its delay)")
    assert why_waiting(RunFacts("d", "success")) is None


def test_the_workspace_board_is_read_with_the_workspaces_rule(tmp_path, monkeypatch):
    from sat_tasks.backends.local.pool import workspace_waits

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "defs"))
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "team-a.yaml").write_text(
        "name: team-a\nresources: {server_type: cpu, gpus_per_node: 0}\nnodes: 1\n"
        "contract: {start: '2026-01-01', end: '2099-12-31'}\n")
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    holder = SlotRequest("t1", "j1", "r1", 1, 1)
    waiter = SlotRequest("t2", "j2", "r2", 1, 1)
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / "team-a.slots.json").write_text(json.dumps({
        "holdings": [{"request": asdict(holder), "owner": owner, "nodes": ["team-a-node-0"]}],
        "queue": [{"request": asdict(waiter), "owner": owner},
                  {"request": asdict(SlotRequest("t3", "gone", "r3", 1, 1)), "owner": {**owner, "pid": 2 ** 22 + 7}}]}))
    waits = workspace_waits("team-a", tmp_path / "boards")
    assert set(waits) == {("j2", "r2")}  # the entry of a process that died is left out, as the board drops it
    assert waits[("j2", "r2")].reason == "workspace team-a: 1 node(s) needed, 0 free of 1 (1 used by j1)"


def test_one_request_looks_the_backend_up_once_for_every_board(monkeypatch):
    from sat_tasks import backends
    from sat_tasks.backends.base import QueuesOnSlots
    from sat_tasks.ui.waits import Boards

    asked: list[str | None] = []
    looked_up: list[str] = []

    class Board(QueuesOnSlots):
        def slot_waits(self, workspace):
            asked.append(workspace)
            return {}

        def concurrent_attempts(self, setting):  # pragma: no cover - not asked here
            return None

    def get_backend(name):
        looked_up.append(name)
        return Board()

    monkeypatch.setattr(backends, "get_backend", get_backend)
    boards = Boards()
    for workspace in (None, "team-a", "team-b", None, "team-a"):
        boards.waits(workspace)
    assert asked == [None, "team-a", "team-b"] and len(looked_up) == 1
