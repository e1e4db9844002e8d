"""The local backend: node pool, the subprocess, the job log, faults, the attempt record."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from sat_tasks.backends.local.runner import LocalAttempt, NoHealthyNodeError, pick_node
from sat_tasks.classify import classify
from sat_tasks.spec import Fault
from tests.support.slow_rank import RANK, running

POOL = ["n0", "n1", "n2"]

TRAINER = textwrap.dedent(
    """
    # a fault (SIGSTOP, SIGKILL) between a truncate and a write would leave an empty file
    import json, os, sys, time
    out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
    os.makedirs(out, exist_ok=True)
    print("env", os.environ["SAT_JOB_NAME"], os.environ.get("CKPT_LAST_STEP"), flush=True)
    open(os.path.join(out, "worker.pid"), "w").write(str(os.getpid()))
    for step in range(1, int(sys.argv[1]) + 1):
        time.sleep(0.02)
        with open(os.path.join(out, "progress.json.tmp"), "w") as f:  # atomic, as the engine writes it:
            json.dump({"step": step, "last_committed_step": step - step % 5}, f)
        os.replace(os.path.join(out, "progress.json.tmp"), os.path.join(out, "progress.json"))
    print("done", flush=True)
    """
)


def attempt(tmp_path: Path, *, command: str, faults=(), heartbeat=30.0, grace=5.0, attempt_no=1,
            startup=1800.0) -> LocalAttempt:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "t.py").write_text(TRAINER)
    return LocalAttempt(
        job="unit-job", attempt=attempt_no, node="n1", command=command,
        env={"SAT_OUTPUT_DIR": str(tmp_path / "out"), "SAT_JOB_NAME": "unit-job", "CKPT_LAST_STEP": "-1"},
        cwd=tmp_path / "code", output_dir=tmp_path / "out", job_log=tmp_path / "job.log",
        node_dir=tmp_path / "nodes" / "n1", faults=list(faults), heartbeat_timeout=heartbeat, grace_seconds=grace,
        poll_seconds=0.05, startup_timeout=startup,
    )


def test_pick_node_skips_failed_nodes():
    assert pick_node(POOL, []) == "n0"
    assert pick_node(POOL, ["n0", "n2"]) == "n1"
    with pytest.raises(NoHealthyNodeError, match="no healthy node left"):
        pick_node(POOL, POOL)


def test_success_record_log_and_environment(tmp_path):
    lines: list[str] = []
    record = attempt(tmp_path, command="python t.py 20").run(lines.append)
    assert record.exit_code == 0 and record.signal is None and record.node == "n1"
    assert record.progress == {"step": 20, "last_committed_step": 20}
    assert "env unit-job -1" in record.log_tail and "done" in record.log_tail
    assert classify(record).kind.value == "SUCCEEDED"
    log = (tmp_path / "job.log").read_text()
    assert "Starting dataset initialization" in log and "ended: exit status 0" in log
    first, last = log.splitlines()[0], log.splitlines()[-1]
    assert re.fullmatch(r"\S+ \[sat\] attempt 1 of job unit-job on node n1: Starting dataset initialization", first)
    assert re.fullmatch(r"\S+ \[sat\] attempt 1 ended: exit status 0", last)
    assert any("Starting dataset initialization" in line for line in lines)
    # A second attempt appends to the same job log.
    attempt(tmp_path, command="python t.py 2", attempt_no=2).run(lambda _: None)
    assert (tmp_path / "job.log").read_text().count("Starting dataset initialization") == 2


def test_hardware_fault_writes_xid_and_kills(tmp_path):
    fault = Fault(kind="hardware", at_step=10, xid=48)
    record = attempt(tmp_path, command="python t.py 400", faults=[fault]).run(lambda _: None)
    assert record.signal == 9 and record.exit_code == 137
    assert any("Xid" in line and ": 48," in line for line in record.node_log)
    assert 10 <= record.progress["step"] < 400
    verdict = classify(record)
    assert verdict.kind.value == "HARDWARE"
    assert any("48" in line for line in verdict.evidence)


def test_fault_for_another_attempt_is_ignored(tmp_path):
    fault = Fault(kind="hardware", attempt=2, at_step=3)
    record = attempt(tmp_path, command="python t.py 10", faults=[fault]).run(lambda _: None)
    assert record.exit_code == 0 and record.node_log == []


def test_preemption_sends_sigterm_then_notes_it(tmp_path):
    fault = Fault(kind="preemption", after_seconds=0.5)
    record = attempt(tmp_path, command="python t.py 2000", faults=[fault]).run(lambda _: None)
    assert record.preemption_notice and record.signal == 15
    assert classify(record).kind.value == "PREEMPTED"


def test_a_stop_request_reaches_the_training_as_sigterm_and_names_who_asked(tmp_path):
    """Stop from the Training Jobs view: SIGTERM (the engine's final checkpoint), then the record says who."""
    asked: list[float] = []
    progress = tmp_path / "out" / "concurrent_checkpoint" / "progress.json"

    def stop_requested():
        asked.append(1)
        return {"by": "alice", "at": "2026-12-01T10:00:00+00:00"} if progress.exists() else None

    runner = attempt(tmp_path, command="python t.py 5000")
    runner.stop_requested, runner.stop_poll_seconds = stop_requested, 0.1
    lines: list[str] = []
    record = runner.run(lines.append)
    assert record.signal == 15 and record.stopped_by == "alice"
    assert 1 <= record.progress["step"] < 5000  # it was training, and it did not run to the end
    assert any("stop requested by alice" in line and "SIGTERM" in line for line in lines)
    assert len(asked) >= 1


def test_an_unreadable_stop_request_does_not_stop_training(tmp_path):
    def broken():
        raise ConnectionError("object storage down")

    runner = attempt(tmp_path, command="python t.py 20")
    runner.stop_requested, runner.stop_poll_seconds = broken, 0.05
    lines: list[str] = []
    record = runner.run(lines.append)
    assert record.exit_code == 0 and record.stopped_by is None
    assert any("could not read the stop request (ConnectionError)" in line for line in lines)


def test_hang_is_caught_by_the_heartbeat(tmp_path):
    fault = Fault(kind="hang", at_step=5)
    record = attempt(tmp_path, command="python t.py 2000", faults=[fault], heartbeat=1.0).run(lambda _: None)
    assert record.heartbeat_timeout
    assert classify(record).kind.value == "HARDWARE"


# ---- start-up, then heartbeat (ADR 0010) -----------------------------------------------------------
def test_a_quiet_start_up_is_not_a_hang(tmp_path):
    """Loading a model prints nothing for longer than the heartbeat: before the first step only the start-up deadline counts."""
    record = attempt(tmp_path, command="sleep 3 && python t.py 20", heartbeat=1.0, startup=60).run(lambda _: None)
    assert record.exit_code == 0 and not record.heartbeat_timeout and not record.startup_timeout
    assert classify(record).kind.value == "SUCCEEDED"


def test_a_start_up_that_runs_out_is_reported_as_such_not_as_hardware(tmp_path):
    lines: list[str] = []
    record = attempt(tmp_path, command="echo loading; sleep 120", heartbeat=0.5, startup=2).run(lines.append)
    assert record.startup_timeout and not record.heartbeat_timeout and record.exit_code == 137
    verdict = classify(record)
    assert verdict.kind.value == "INTERNAL" and "start-up" in verdict.reason
    assert any("no training step within startup_timeout_seconds=2s" in line for line in lines)


def test_an_earlier_attempts_progress_does_not_count_as_this_attempts_start(tmp_path):
    progress = tmp_path / "out" / "concurrent_checkpoint" / "progress.json"
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps({"step": 50, "last_committed_step": 40, "attempt": 1}))
    # The engine stamps its attempt: a file touched now, but by attempt 1, is not attempt 2's first step.
    record = attempt(tmp_path, command=f"sleep 1; touch {progress}; sleep 120", attempt_no=2, heartbeat=0.5,
                     startup=3).run(lambda _: None)
    assert record.startup_timeout and not record.heartbeat_timeout
    assert record.progress == {"last_committed_step": 40}  # the commits outlive attempt 1; its step does not


def test_without_a_start_up_deadline_the_heartbeat_counts_from_the_start(tmp_path):
    """`startup_timeout_seconds: 0` (a script that reports no steps): output lines are the heartbeat from the start."""
    record = attempt(tmp_path, command="sleep 120", heartbeat=1.0, startup=0).run(lambda _: None)
    assert record.heartbeat_timeout and not record.startup_timeout


def test_node_loss_sets_node_condition(tmp_path):
    fault = Fault(kind="node_loss", at_step=3)
    record = attempt(tmp_path, command="python t.py 2000", faults=[fault]).run(lambda _: None)
    assert record.node_conditions[0]["type"] == "Ready" and record.node_conditions[0]["status"] == "Unknown"
    assert classify(record).kind.value == "HARDWARE"


def test_user_error_is_internal(tmp_path):
    record = attempt(tmp_path, command="python -c 'import nonexistent_module_xyz'").run(lambda _: None)
    assert record.exit_code == 1
    verdict = classify(record)
    assert verdict.kind.value == "INTERNAL"
    assert any("ModuleNotFoundError" in line for line in verdict.evidence)
    assert json.loads(record.model_dump_json())["job"] == "unit-job"


def test_attempt_repr_hides_the_environment(tmp_path):
    runner = attempt(tmp_path, command="true")
    runner.env["AWS_SECRET_ACCESS_KEY"] = "do-not-print-me"
    assert "do-not-print-me" not in repr(runner)


@pytest.mark.parametrize(("save_s", "grace", "committed"), [
    # longer than the 10 s the log reader waits for the pipe's writers (the launcher's own
    # child keeps it open), which alone kept a short final checkpoint alive before
    pytest.param(12.0, 20.0, True, id="within-grace"),
    pytest.param(60.0, 5.0, False, id="past-grace"),
])
def test_deepspeed_launcher_ranks_get_the_grace_period_after_the_launcher_exits(tmp_path, save_s, grace, committed):
    """The real `deepspeed` launcher dies on SIGTERM at once; its rank still writes its final checkpoint."""
    import time

    runner = attempt(tmp_path, command=f"deepspeed --no_local_rank --num_gpus 1 rank.py {save_s}",
                     faults=[Fault(kind="preemption", at_step=1)], grace=grace)
    (tmp_path / "code" / "rank.py").write_text(RANK)
    lines: list[str] = []
    seen: dict[str, float] = {}  # when each line arrived

    def log(line: str) -> None:
        seen.setdefault(line, time.monotonic())
        lines.append(line)

    record = runner.run(log)
    ended = time.monotonic()
    final = tmp_path / "out" / "concurrent_checkpoint" / "final"
    assert final.exists() is committed, "\n".join(lines[-20:])
    assert not running(int((tmp_path / "out" / "concurrent_checkpoint" / "rank.pid").read_text()))
    assert record.preemption_notice and record.exit_code == 143
    assert any("waiting for the processes it started" in line for line in lines)
    assert ("rank: final checkpoint committed" in record.log_tail) is committed
    if committed:
        assert any("the command's processes have exited" in line for line in lines)
    else:  # SIGKILLed when the grace period ran out, and the attempt ended then
        assert any("killing the processes the command left running" in line for line in lines)
        # Ended at the kill, not when the rank's save would have: that ran save_s (60 s) from the
        # launcher's exit; the grace period is 5 s (a busy machine may add some, never 55 s).
        waiting = next(t for line, t in seen.items() if "waiting for the processes it started" in line)
        assert ended - waiting < save_s, f"the attempt ended {ended - waiting:.0f} s after the launcher exited"


def test_processes_left_behind_by_a_finished_command_are_killed(tmp_path):
    pid_file = tmp_path / "orphan.pid"
    lines: list[str] = []
    record = attempt(tmp_path, command=f"(sleep 300 & echo $! > {pid_file}); echo launched").run(lines.append)
    assert record.exit_code == 0 and "launched" in record.log_tail
    assert not running(int(pid_file.read_text()))
    assert any("killing the processes the command left running" in line for line in lines)


@pytest.mark.parametrize("kind", ["hardware", "hang"])
def test_faults_reach_torchrun_workers_in_their_own_sessions(tmp_path, kind):
    """torchrun starts its workers with setsid: a fault stops or kills them too, and none outlives the attempt."""
    fault = Fault(kind=kind, at_step=20)
    record = attempt(tmp_path, command="torchrun --nproc-per-node 1 t.py 1500", faults=[fault],
                     heartbeat=2.0).run(lambda _: None)
    worker = int((tmp_path / "out" / "concurrent_checkpoint" / "worker.pid").read_text())
    assert not running(worker)  # before: the worker trained on, orphaned, beside the next attempt
    assert 20 <= record.progress["step"] < 1500  # a hung worker made no more progress
    assert classify(record).kind.value == "HARDWARE"
    assert record.heartbeat_timeout is (kind == "hang")


@pytest.mark.parametrize(("shutdown_timeout", "committed"), [pytest.param("15", True, id="sized-by-sat"),
                                                             pytest.param("2", False, id="too-short")])
def test_torchrun_waits_out_the_final_checkpoint_for_its_shutdown_timeout(tmp_path, shutdown_timeout, committed):
    """What SAT relies on when it launches multi-node jobs (DeepSpeed too) with torchrun.

    torchrun passes SIGTERM to its workers and SIGKILLs them `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`
    seconds later; SAT sets it from the grace period (runtime_env). A rank that needs 5 s
    for its final checkpoint gets it with 15 s and loses it with 2 s.
    """
    runner = attempt(tmp_path, command="torchrun --nproc-per-node 1 rank.py 5",
                     faults=[Fault(kind="preemption", at_step=1)], grace=25.0)
    runner.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = shutdown_timeout
    (tmp_path / "code" / "rank.py").write_text(RANK)
    record = runner.run(lambda _: None)
    assert (tmp_path / "out" / "concurrent_checkpoint" / "final").exists() is committed, record.log_tail[-20:]
    assert record.preemption_notice
    assert not running(int((tmp_path / "out" / "concurrent_checkpoint" / "rank.pid").read_text()))
