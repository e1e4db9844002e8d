"""An attempt whose `launch` task died (a service restart, the task process killed) resumes when the task runs again.

The first run of the task is a forked process running `launch_attempt` with the fake trainer;
it is SIGKILLed once a checkpoint is committed. For a service restart the training is then
stopped as `make down` stops it (SIGTERM: its final checkpoint); for a task killed alone the
training goes on, and the second run must stop it before it resumes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from ckpt_engine.contract import CONCURRENT_DIR, PROGRESS_NAME
from sat_tasks.backends.local.launch import (
    AttemptInterrupted,
    launch_attempt,
    procs_file,
)
from sat_tasks.backends.local.runner import ATTEMPT_TAG_ENV, SIDECAR_TAG_ENV
from sat_tasks.classify import classify
from sat_tasks.core.handoffs import Action, Plan
from sat_tasks.core.policy import decide_next
from sat_tasks.core.procs import marked, state_of, terminate
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

FAKE_TRAIN = Path(__file__).resolve().parents[3] / "e2e" / "scripts" / "fake_train.py"
STEPS = 60
SLOW, FAST = "0.2", "0.02"  # seconds per step: the first run of the task (12 s in all: it is stopped), the next
DEADLINE_S = 60.0


def _job(name: str):
    return parse_spec({
        "name": name, "nodes": 1, "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/results/"},
        # each run of the task reads its step time when it starts: the first is slow (killed mid-run), the next fast
        "command": "FAKE_STEP_SECONDS=$(cat step_seconds) python fake_train.py",
        "env": {"FAKE_STEPS": str(STEPS), "FAKE_SAVE_EVERY": "5"},
    }).with_backend("local")


def _first_try(run: JobRun) -> None:
    """The first run of the `launch` task (in a forked process: the test kills it)."""
    launch_attempt(JobRun(run.job, run.run_id), Plan(attempt=1), lambda _m: None)
    os._exit(0)


def _progress(run: JobRun) -> dict:
    try:
        return json.loads((run.output_dir / CONCURRENT_DIR / PROGRESS_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _wait_for(what: str, ready) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _kill_the_task_mid_run(run: JobRun) -> tuple[list[int], list[int]]:
    """Start the first try, SIGKILL its task process once step 10 is committed; the pids of its training
    and of its metrics sidecar."""
    task = multiprocessing.get_context("fork").Process(target=_first_try, args=(run,), daemon=True)
    task.start()
    _wait_for("a committed checkpoint", lambda: (_progress(run).get("last_committed_step") or 0) >= 10)
    tag = json.loads(procs_file(run, 1).read_text())["tag"]
    training = marked(ATTEMPT_TAG_ENV, tag)
    assert training, "the first try's training is running"
    os.kill(task.pid, signal.SIGKILL)
    task.join(10)
    assert _progress(run)["step"] < STEPS, "the first try was killed mid-run"
    return training, marked(SIDECAR_TAG_ENV, tag)


@pytest.fixture
def run(s3_hook, demo_bucket, tmp_path, request):
    case = request.node.callspec.id if hasattr(request.node, "callspec") else "task-stopped"
    run = JobRun(_job("resume-" + case), f"manual__{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(FAKE_TRAIN, run.code_dir / "fake_train.py")
    (run.code_dir / "step_seconds").write_text(SLOW)
    return run


@pytest.mark.parametrize("how", [
    pytest.param("service-restart", id="service-restart"),
    pytest.param("task-killed", id="task-killed"),
])
def test_an_interrupted_attempt_resumes_from_its_last_checkpoint_without_a_failover(run, how):
    training, sidecar = _kill_the_task_mid_run(run)
    if how == "service-restart":  # `make down` stops the training too (SIGTERM: its final checkpoint), and the sidecar
        terminate(training, grace=20)
        terminate(sidecar, grace=20)
    else:
        assert all(state_of(pid) for pid in training), "a task killed alone leaves its training running"

    (run.code_dir / "step_seconds").write_text(FAST)
    lines: list[str] = []
    record = launch_attempt(run, Plan(attempt=1), lines.append)  # Airflow runs the task again

    assert not any(state_of(pid) for pid in training + sidecar), "nothing of the first try is left running"
    resumed = record.progress["resumed_from_step"]
    committed = record.progress["committed_steps"]
    assert resumed is not None and resumed >= 10
    assert f"[Concurrent Checkpoint] Resuming from checkpoint-{resumed} (CKPT_LAST_STEP={resumed})" in lines
    assert record.exit_code == 0 and record.progress["step"] == STEPS
    assert committed == sorted(committed), "never back to step 0 (a fresh start would commit 5, 10, ... again)"

    entries = [e for e in run.history().entries() if e["attempt"] == 1]
    assert [e["status"] for e in entries] == ["Running", "Running"]
    why = entries[-1]["reason"]
    if how == "service-restart":
        assert why.startswith("attempt 1 was interrupted by a service restart at 20")
    else:
        assert why.startswith("attempt 1 was interrupted: its launch task died (last heard from at 20")
        assert "process(es) of it stopped" in why
    assert why.endswith(f"; resumed from checkpoint-{resumed} (not a failover: none spent)")
    log = run.job_log.read_text()
    assert f"[sat] {why}" in log and log.count("Starting dataset initialization") == 2

    decision = decide_next(run.job, Plan(attempt=1), classify(record), now=time.time())
    assert decision.action is Action.UPLOAD and decision.failovers == 0
    assert not procs_file(run, 1).exists()


def test_an_attempt_that_already_ended_is_not_run_again(s3_hook, demo_bucket, tmp_path):
    """Its record was stored before its task died: the record stands, nothing is started."""
    run = JobRun(_job("resume-ended"), f"manual__{tmp_path.name}")
    run.code_dir.mkdir(parents=True, exist_ok=True)
    (run.code_dir / "fake_train.py").write_text("print('ran')\n")
    (run.code_dir / "step_seconds").write_text(FAST)
    first = launch_attempt(run, Plan(attempt=1), lambda _m: None)
    lines: list[str] = []
    again = launch_attempt(run, Plan(attempt=1), lines.append)
    assert again == first and "ran" not in lines
    assert run.job_log.read_text().count("Starting dataset initialization") == 1


def test_a_launch_task_asked_to_stop_interrupts_its_attempt_and_the_next_run_resumes_it(run):
    """A service stop sends the task SIGTERM (its on_kill sets `interrupt`): the training takes its final
    checkpoint, no record is stored (the attempt has not ended), and the task's next run resumes from it."""
    interrupt, ended = threading.Event(), {}

    def first_try():
        try:
            launch_attempt(run, Plan(attempt=1), lambda _m: None, interrupt=interrupt)
        except AttemptInterrupted as exc:
            ended["error"] = exc

    task = threading.Thread(target=first_try, daemon=True)
    task.start()
    _wait_for("a committed checkpoint", lambda: (_progress(run).get("last_committed_step") or 0) >= 10)
    interrupt.set()
    task.join(DEADLINE_S)
    assert isinstance(ended.get("error"), AttemptInterrupted) and run.load_record(1) is None
    final = _progress(run)["last_committed_step"]  # the final checkpoint SIGTERM asked for
    assert "attempt 1 ended: exit status 143 (interrupted: it resumes when its launch task runs again)" in (
        run.job_log.read_text())

    (run.code_dir / "step_seconds").write_text(FAST)
    lines: list[str] = []
    record = launch_attempt(run, Plan(attempt=1), lines.append)
    assert record.exit_code == 0 and record.progress["resumed_from_step"] == final
    assert f"[Concurrent Checkpoint] Resuming from checkpoint-{final} (CKPT_LAST_STEP={final})" in lines
    why = run.history().entries()[-1]["reason"]
    assert why.startswith("attempt 1 was interrupted by a service restart at 20")
    assert why.endswith(f"resumed from checkpoint-{final} (not a failover: none spent)")


def test_the_launch_task_asked_to_stop_asks_to_run_again_without_spending_its_retry(monkeypatch):
    from airflow.sdk.exceptions import AirflowRescheduleException

    from sat_tasks.backends.local import operator

    launch = operator.LocalLaunchOperator(task_id="launch", attempt=1, previous_decide_task_id=None)
    assert launch.retries == operator.LAUNCH_RETRIES >= 1  # a task process that died (kill -9) is retried: it resumes
    monkeypatch.setattr(launch, "resolve_attempt", lambda _context: (_job("resume-operator"), Plan(attempt=1)))

    def stopped_while_running(run, plan, log, interrupt):
        launch.on_kill()  # what the task runner calls on SIGTERM
        assert interrupt.is_set()
        raise AttemptInterrupted("attempt 1 on local-node-0 was interrupted")

    monkeypatch.setattr(operator, "launch_attempt", stopped_while_running)
    with pytest.raises(AirflowRescheduleException):
        launch.execute({"run_id": "manual__operator"})


def test_the_attempts_cleanup_stops_a_training_its_dead_task_left_running(run):
    """A launch task that died with no retry left: `cleanup` (ALL_DONE) stops what it left, so nothing outlives the run."""
    from sat_tasks.backends.local import BACKEND

    training, sidecar = _kill_the_task_mid_run(run)
    deleted = BACKEND.cleanup_attempt(run, 1, lambda _m: None)
    assert deleted == [f"{len(training)} training process(es) of attempt 1 left running"]
    assert not any(state_of(pid) for pid in training + sidecar)
    assert BACKEND.cleanup_attempt(run, 1, lambda _m: None) == []
