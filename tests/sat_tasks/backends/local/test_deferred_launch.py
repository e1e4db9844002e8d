"""`[sat] local_launch_watch = triggerer` (issue 48.3, ADR 0044): the attempt runs in a process of its own and the
`launch` task defers to the triggerer, holding no worker slot while the training runs.

The trigger's own rules run on files and a `sleep` process; the operator and the attempt's
process on the embedded S3 and the stand-in trainer (tests/e2e/scripts/fake_train.py); the
whole job with dag.test(), which runs a deferred task's trigger in line.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from ckpt_engine.contract import CONCURRENT_DIR, PROGRESS_NAME
from sat_tasks.backends.local import attempt_process, operator
from sat_tasks.backends.local.attempt_trigger import AttemptEndTrigger
from sat_tasks.backends.local.launch import stop_left_running
from sat_tasks.core.handoffs import Plan
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

FAKE_TRAIN = Path(__file__).resolve().parents[3] / "e2e" / "scripts" / "fake_train.py"
DEADLINE_S = 120.0


def _wait_for(what: str, ready, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while not (value := ready()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _fire(trigger: AttemptEndTrigger) -> dict:
    """Run the trigger as the triggerer does (its event loop) until it fires; the event's payload."""
    async def first():
        return await asyncio.wait_for(anext(trigger.run()), DEADLINE_S)

    return asyncio.run(first()).payload


# ---- the trigger ------------------------------------------------------------------------------------------------
@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _trigger(tmp_path: Path, proc, **kwargs) -> AttemptEndTrigger:
    ticks = attempt_process.process_start_ticks(proc.pid)
    assert ticks is not None
    return AttemptEndTrigger(attempts_dir=str(tmp_path), attempt=2, pid=proc.pid, start_ticks=ticks,
                             host=socket.gethostname(), poll_seconds=0.05, **kwargs)


def test_the_trigger_waits_while_the_process_runs_and_fires_on_its_outcome(tmp_path, sleeper):
    trigger = _trigger(tmp_path, sleeper, relaunches=1, log_offset=7)
    assert trigger.check() is None
    ended = threading.Timer(0.3, lambda: (tmp_path / "attempt-2.outcome.json").write_text(
        json.dumps({"outcome": "ended", "exit_code": 0})))
    ended.start()
    payload = _fire(trigger)
    assert payload == {"status": "ended", "attempt": 2, "pid": sleeper.pid, "relaunches": 1, "log_offset": 7,
                       "message": ""}


def test_the_trigger_fires_when_the_process_is_gone_without_an_outcome(tmp_path, sleeper):
    trigger = _trigger(tmp_path, sleeper)
    assert trigger.check() is None
    sleeper.kill()
    sleeper.wait()
    assert _fire(trigger)["status"] == "gone"
    # an outcome written just before it exited wins over its absence
    (tmp_path / "attempt-2.outcome.json").write_text(json.dumps({"outcome": "interrupted", "message": "why"}))
    assert trigger.check()["status"] == "interrupted" and trigger.check()["message"] == "why"


def test_a_reused_pid_is_not_the_process(tmp_path, sleeper):
    trigger = _trigger(tmp_path, sleeper)
    other = AttemptEndTrigger(**{**trigger.serialize()[1], "start_ticks": trigger.start_ticks - 1})
    assert trigger.check() is None and other.check()["status"] == "gone"


def test_the_trigger_announces_the_start_once(tmp_path, sleeper):
    (tmp_path / "attempt-2.started").write_text("now")
    assert _trigger(tmp_path, sleeper).check()["status"] == "started"
    assert _trigger(tmp_path, sleeper, announced=True).check() is None


def test_a_triggerer_on_another_host_says_so(tmp_path, sleeper):
    trigger = AttemptEndTrigger(**{**_trigger(tmp_path, sleeper).serialize()[1], "host": "elsewhere.example"})
    payload = trigger.check()
    assert payload["status"] == "elsewhere" and "elsewhere.example" in payload["message"]


def test_the_trigger_serializes_as_the_triggerer_stores_it(tmp_path, sleeper):
    from airflow.sdk._shared.module_loading import import_string
    from airflow.sdk.serde import deserialize, serialize

    trigger = _trigger(tmp_path, sleeper, relaunches=2, announced=True, log_offset=99)
    classpath, kwargs = trigger.serialize()
    assert classpath == "sat_tasks.backends.local.attempt_trigger.AttemptEndTrigger"
    again = import_string(classpath)(**deserialize(json.loads(json.dumps(serialize(kwargs)))))
    assert again.serialize() == (classpath, kwargs)
    assert again.check() is None


def test_on_kill_interrupts_the_process(tmp_path, sleeper):
    """A person's mark-failed on the deferred task: SIGTERM to the attempt's process (the task's on_kill before)."""
    asyncio.run(_trigger(tmp_path, sleeper).on_kill())
    assert sleeper.wait(DEADLINE_S) == -signal.SIGTERM


# ---- the operator and the attempt's process ---------------------------------------------------------------------
STEPS = 60
# an attempt whose process is killed runs this many slow steps (60 s at least): its next process, started on a busy
# machine, must find it still running
LONG_STEPS = 300


def _job(name: str, steps: int = STEPS, **fields):
    return parse_spec({
        "name": name, "nodes": 1, "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        # the step time is read when the training starts: a test slows or speeds each start
        "command": "FAKE_STEP_SECONDS=$(cat step_seconds) python fake_train.py",
        "env": {"FAKE_STEPS": str(steps), "FAKE_SAVE_EVERY": "5"},
        **fields,
    }).with_backend("local")


def _progress(run: JobRun) -> dict:
    try:
        return json.loads((run.output_dir / CONCURRENT_DIR / PROGRESS_NAME).read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def triggerer_mode(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_LAUNCH_WATCH", "triggerer")


@pytest.fixture
def run(s3_hook, demo_bucket, tmp_path, request, triggerer_mode):
    name = "defer-" + request.node.name[5:40].split("[")[0].replace("_", "-").strip("-")
    run = JobRun(_job(name, getattr(request, "param", STEPS)), f"manual__{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(FAKE_TRAIN, run.code_dir / "fake_train.py")
    (run.code_dir / "step_seconds").write_text("0.2")
    yield run
    supervisor = attempt_process.running(run, 1)  # a failed test leaves nothing running
    if supervisor is not None:
        os.kill(supervisor.pid, signal.SIGKILL)
    stop_left_running(run, 1, lambda _line: None)


def _launch(run: JobRun, monkeypatch) -> operator.LocalLaunchOperator:
    launch = operator.LocalLaunchOperator(task_id="launch", attempt=1, previous_decide_task_id=None)
    monkeypatch.setattr(launch, "resolve_attempt", lambda _context: (run.job, Plan(attempt=1)))
    return launch


def _deferred(call) -> AttemptEndTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        call()
    assert deferred.value.method_name == "execute_complete"
    return deferred.value.trigger


def _first_execute(run: JobRun, out: Path) -> None:
    """The launch task's first run, in a process of its own (forked): it defers and its process exits."""
    from unittest import mock

    launch = operator.LocalLaunchOperator(task_id="launch", attempt=1, previous_decide_task_id=None)
    with mock.patch.object(launch, "resolve_attempt", lambda _context: (run.job, Plan(attempt=1))):
        try:
            launch.execute({"run_id": run.run_id})
        except TaskDeferred as deferred:
            out.write_text(json.dumps(deferred.trigger.serialize()[1]))
    os._exit(0)


def _complete(launch, trigger: AttemptEndTrigger, run: JobRun) -> dict:
    """Run the trigger until it fires and resume the task with its event, until the task ends; its return value."""
    for _ in range(2 + operator.LAUNCH_RETRIES * 2):
        event = _fire(trigger)
        try:
            return launch.execute_complete({"run_id": run.run_id}, event)
        except TaskDeferred as deferred:
            trigger = deferred.trigger
    raise AssertionError("the task never ended")


def test_the_task_process_exits_while_the_training_runs_and_the_task_ends_as_the_attempt_did(run, monkeypatch,
                                                                                            tmp_path):
    out = tmp_path / "trigger.json"
    task = multiprocessing.get_context("fork").Process(target=_first_execute, args=(run, out), daemon=True)
    task.start()
    task.join(DEADLINE_S)
    assert task.exitcode == 0 and out.exists(), "the task deferred and its process exited"
    trigger = AttemptEndTrigger(**json.loads(out.read_text()))
    trigger.poll_seconds = 0.1
    step = _wait_for("the training's first step", lambda: _progress(run).get("step"))
    _wait_for("the training going on with no task process", lambda: (_progress(run).get("step") or 0) > step)
    assert attempt_process.running(run, 1) is not None

    (run.code_dir / "step_seconds").write_text("0.02")  # not read again: the same training runs to its end
    launch = _launch(run, monkeypatch)
    first = _fire(trigger)
    assert first["status"] == "started"  # the Running entry is recorded: the task publishes it and defers again
    with pytest.raises(TaskDeferred) as deferred:
        launch.execute_complete({"run_id": run.run_id}, first)
    assert deferred.value.trigger.announced and deferred.value.trigger.pid == trigger.pid
    assert _complete(launch, deferred.value.trigger, run) == {"attempt": 1, "node": "local-node-0", "exit_code": 0,
                                                         "signal": None}
    record = run.load_record(1)
    assert record.exit_code == 0 and record.progress["step"] == STEPS
    _wait_for("the attempt's process to exit after its outcome", lambda: attempt_process.running(run, 1) is None)
    assert "process" in attempt_process.log_path(run, 1).read_text()

    # run again (a retry after the record was stored): the record stands, nothing is started
    assert launch.execute({"run_id": run.run_id})["exit_code"] == 0
    assert run.job_log.read_text().count("Starting dataset initialization") == 1


# The mode is opt-in (ADR 0044): in make test, the trigger, the operator and the task-exits test cover the
# path; the DAG runs (failover, Stop, Spot) and the restart trials (25-80 s each on 2 cores) run in
# make test-slow until it is the default.
_OPT_IN_TRIAL = pytest.mark.slow


@_OPT_IN_TRIAL
@pytest.mark.parametrize("run", [LONG_STEPS], indirect=True)
def test_an_attempt_process_killed_mid_run_is_started_again_and_resumes(run, monkeypatch):
    launch = _launch(run, monkeypatch)
    trigger = _deferred(lambda: launch.execute({"run_id": run.run_id}))
    trigger.poll_seconds = 0.1
    _wait_for("a committed checkpoint", lambda: (_progress(run).get("last_committed_step") or 0) >= 10)
    os.kill(trigger.pid, signal.SIGKILL)  # its training goes on: the next process stops it (final checkpoint)
    (run.code_dir / "step_seconds").write_text("0.02")
    event = _fire(AttemptEndTrigger(**{**trigger.serialize()[1], "announced": True}))
    assert event["status"] == "gone"
    again = _deferred(lambda: launch.execute_complete({"run_id": run.run_id}, event))
    assert again.relaunches == 1 and again.pid != trigger.pid
    again.poll_seconds = 0.1
    assert _complete(launch, again, run)["exit_code"] == 0
    record = run.load_record(1)
    assert record.progress["resumed_from_step"] >= 10 and record.progress["step"] == LONG_STEPS
    why = run.history().entries()[-1]["reason"]
    assert why.startswith("attempt 1 was interrupted: its launch task died"), why  # its training was still running
    assert "process(es) of it stopped" in why


@_OPT_IN_TRIAL
@pytest.mark.parametrize("run", [LONG_STEPS], indirect=True)
def test_an_interrupted_attempt_process_is_started_again_without_spending_a_relaunch(run, monkeypatch):
    """SIGTERM to the attempt's process (a service stop): its training's final checkpoint, outcome interrupted."""
    launch = _launch(run, monkeypatch)
    trigger = _deferred(lambda: launch.execute({"run_id": run.run_id}))
    trigger.poll_seconds = 0.1
    _wait_for("a committed checkpoint", lambda: (_progress(run).get("last_committed_step") or 0) >= 10)
    os.kill(trigger.pid, signal.SIGTERM)
    event = _fire(AttemptEndTrigger(**{**trigger.serialize()[1], "announced": True}))
    assert event["status"] == "interrupted" and run.load_record(1) is None
    final = _progress(run)["last_committed_step"]
    (run.code_dir / "step_seconds").write_text("0.02")
    again = _deferred(lambda: launch.execute_complete({"run_id": run.run_id}, event))
    assert again.relaunches == 0
    again.poll_seconds = 0.1
    assert _complete(launch, again, run)["exit_code"] == 0
    assert run.load_record(1).progress["resumed_from_step"] == final


def test_a_process_gone_too_often_fails_the_task(run, monkeypatch):
    launch = _launch(run, monkeypatch)
    gone = {"status": "gone", "attempt": 1, "pid": 1, "relaunches": operator.LAUNCH_RETRIES, "log_offset": 0}
    with pytest.raises(AirflowFailException, match=f"gone without an end {operator.LAUNCH_RETRIES + 1} times"):
        launch.execute_complete({"run_id": run.run_id}, gone)
    assert attempt_process.running(run, 1) is None


def test_a_failed_attempt_fails_the_task_as_in_the_worker(run, monkeypatch):
    (run.code_dir / "fake_train.py").write_text("import sys; sys.exit(3)\n")
    launch = _launch(run, monkeypatch)
    trigger = _deferred(lambda: launch.execute({"run_id": run.run_id}))
    trigger.poll_seconds = 0.1
    with pytest.raises(AirflowFailException, match="ended with exit status 3"):
        _complete(launch, trigger, run)


# ---- the job's DAG run with dag.test() (it runs a deferred task's trigger in line, as the triggerer would) --------
@pytest.fixture(scope="module")
def scripts(s3_hook, demo_bucket, airflow_db):
    """The stand-in trainers in the demo bucket, under test-scripts/ (as test_job_dags's fixture puts them)."""
    from tests.e2e.test_job_dags import SCRIPTS

    for path in SCRIPTS.glob("*.py"):
        s3_hook.load_file(filename=path, key=f"test-scripts/{path.name}", bucket_name=demo_bucket, replace=True)


class _Watch:
    """What dag.test() did with the launch tasks: the state each run of one ended in (DEFERRED: it handed the
    watch to the trigger and its run ended), and the training's step when each trigger began and fired."""

    def __init__(self, monkeypatch, job, on_trigger=None) -> None:
        import airflow.sdk.definitions.dag as dag_module
        import airflow.sdk.execution_time.supervisor as supervisor_module

        self.job, self.on_trigger = job, on_trigger
        self.task_ends: list[tuple[str, str]] = []
        self.triggers: list[tuple[str, int, int]] = []
        run_task, run_trigger = supervisor_module.run_task_in_process, dag_module._run_inline_trigger

        def run_task_in_process(ti, task):
            result = run_task(ti=ti, task=task)
            if ti.task_id.endswith(".launch"):
                self.task_ends.append((ti.task_id, str(getattr(result.ti.state, "value", result.ti.state))))
            return result

        def run_inline_trigger(trigger, task_sdk_ti):
            run = JobRun.of(self.job, task_sdk_ti.dag_id, task_sdk_ti.run_id)
            if self.on_trigger is not None:
                self.on_trigger(run)
            before = _progress(run).get("step") or 0
            event = run_trigger(trigger, task_sdk_ti)
            self.triggers.append((task_sdk_ti.task_id, before, _progress(run).get("step") or 0))
            return event

        monkeypatch.setattr(supervisor_module, "run_task_in_process", run_task_in_process)
        monkeypatch.setattr(dag_module, "_run_inline_trigger", run_inline_trigger)


@_OPT_IN_TRIAL
def test_a_job_fails_over_and_completes_with_its_launch_tasks_deferred(scripts, s3_hook, triggerer_mode, monkeypatch):
    from tests.e2e.test_job_dags import make_job, statuses
    from tests.e2e.test_job_dags import run as run_dag

    job = make_job("defer-e2e-failover", faults=[{"kind": "hardware", "attempt": 1, "at_step": 17, "xid": 79}],
                   env={"FAKE_STEPS": "40", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.25"})
    watch = _Watch(monkeypatch, job)
    report, attempts = run_dag(job)
    assert report["status"] == "Completed", statuses(report)
    assert statuses(report) == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    assert [a["verdict"] for a in attempts] == ["HARDWARE", "SUCCEEDED"]
    assert attempts[1]["resumed_from"] == attempts[0]["last_committed_step"] >= 15
    results = report["results"][len("s3://sat-demo/"):]  # the outputs are uploaded as in the worker mode
    assert s3_hook.check_for_key(results + "output/trainer_state.json", bucket_name="sat-demo")
    # each launch task's runs ended deferred (their worker slot free) until the last, which ended the task
    for task, ended in (("attempt_1.launch", "failed"), ("attempt_2.launch", "success")):
        states = [state for name, state in watch.task_ends if name == task]
        assert states[:-1] and set(states[:-1]) == {"deferred"} and states[-1] == ended, watch.task_ends
    # and the training went on while a launch task was deferred, with no task process running
    assert any(after > before for _task, before, after in watch.triggers), watch.triggers
    # the attempts' processes wrote their Running entries outside any task: the launch tasks published them
    # (the run list's index, ADR 0022)
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from sat_tasks.core.run_summary import SUMMARY_KEY

    with create_session() as session:
        published = {task for (task,) in session.query(XComModel.task_id).filter(
            XComModel.run_id == report["run_id"], XComModel.key == SUMMARY_KEY,
            XComModel.task_id.like("attempt_%.launch"))}
    assert published == {"attempt_1.launch", "attempt_2.launch"}, published


@_OPT_IN_TRIAL
def test_a_stop_request_mid_training_ends_the_job_stopped(scripts, triggerer_mode, monkeypatch):
    from sat_tasks.pipeline.actions import request_stop
    from tests.e2e.test_job_dags import make_job, statuses
    from tests.e2e.test_job_dags import run as run_dag

    job = make_job("defer-e2e-stop", env={"FAKE_STEPS": "1500", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.1"})
    stopping: list[threading.Thread] = []

    def stop_once_training(run: JobRun) -> None:
        def stop() -> None:
            _wait_for("a committed checkpoint", lambda: (_progress(run).get("last_committed_step") or 0) >= 5)
            request_stop(run.hook(), run, "a test", via="the test")

        if not stopping:
            stopping.append(threading.Thread(target=stop, daemon=True))
            stopping[0].start()

    watch = _Watch(monkeypatch, job, on_trigger=stop_once_training)
    report, attempts = run_dag(job)
    assert report["status"] == "Stopped", statuses(report)
    assert [a["verdict"] for a in attempts] == ["STOPPED"]
    assert "a test" in report["history"][-1]["reason"]
    assert attempts[0]["last_committed_step"] is not None and attempts[0]["step_at_end"] < 1500
    assert ("attempt_1.launch", "deferred") in watch.task_ends


def test_a_second_process_for_a_running_attempt_exits_and_the_task_watches_the_first(run, monkeypatch):
    """A task that started one while another ran the attempt (it died between the start and its state file):
    the second cannot take the attempt's lock, exits with no outcome, and the task watches the first."""
    launch = _launch(run, monkeypatch)
    first = _deferred(lambda: launch.execute({"run_id": run.run_id}))
    _wait_for("the first process holding the attempt's lock", lambda: attempt_process.lock_path(run, 1).exists()
              and json.loads(attempt_process.lock_path(run, 1).read_text() or "{}").get("pid") == first.pid)
    second = attempt_process.start(run, Plan(attempt=1), lambda _line: None)
    trigger = AttemptEndTrigger(**{**first.serialize()[1], "pid": second.pid, "start_ticks": second.start_ticks,
                                   "poll_seconds": 0.1})
    event = _fire(trigger)
    assert event["status"] == "gone" and second.pid != first.pid
    assert "another process runs it" in attempt_process.log_path(run, 1).read_text()
    watched = _deferred(lambda: launch.execute_complete({"run_id": run.run_id}, event))
    assert (watched.pid, watched.relaunches) == (first.pid, 0)


@_OPT_IN_TRIAL
def test_a_preempted_spot_attempt_resumes_when_capacity_returns(scripts, triggerer_mode, monkeypatch):
    from tests.e2e.test_job_dags import make_job, statuses
    from tests.e2e.test_job_dags import run as run_dag

    job = make_job("defer-e2e-spot", learning_type="spot", job_failover=False,
                   faults=[{"kind": "preemption", "attempt": 1, "at_step": 12, "capacity_delay_seconds": 3}],
                   spot={"max_resumes": 3, "max_wait_seconds": 120, "poll_seconds": 1},
                   env={"FAKE_STEPS": "40", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.1"})
    watch = _Watch(monkeypatch, job)
    report, attempts = run_dag(job)
    assert report["status"] == "Completed", statuses(report)
    assert [a["verdict"] for a in attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert "Pending - preempted" in statuses(report)
    assert attempts[1]["resumed_from"] == attempts[0]["last_committed_step"] >= 10  # its final checkpoint
    assert ("attempt_1.launch", "deferred") in watch.task_ends and ("attempt_2.launch", "deferred") in watch.task_ends
