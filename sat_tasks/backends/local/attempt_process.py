"""One attempt on the local backend run by a detached process of its own, not by its `launch` task (issue 48.3).

With `[sat] local_launch_watch = triggerer` (ADR 0044) the `launch` task starts this process
and defers: the watch goes to the triggerer (`attempt_trigger.AttemptEndTrigger`), and no
worker slot is held while the training runs. The process runs exactly what the task ran
before (`launch.launch_attempt`: pick the nodes, record Running, run and watch the training,
store the record), in a session of its own (`warm.spawn_detached`), so it outlives the task
process that started it.

Its files, beside the attempt's record in the run's `attempts/` folder on this host's disk:

    attempt-<k>.supervisor-input.json   what to run (the job, the plan, the run id), 0600: the task writes it
    attempt-<k>.supervisor.json         its pid, the pid's start time and the host: the task writes it
    attempt-<k>.supervisor.lock         held while it runs (one process per attempt), with the same three
    attempt-<k>.supervisor.log          what it logs (today's task log lines of the attempt)
    attempt-<k>.started                 written once the attempt's Running entry is recorded
    attempt-<k>.outcome.json            written last: ended | interrupted | failed | error

SIGTERM to it is what `on_kill` was to the task: the training takes its final checkpoint and
the attempt is interrupted (`outcome` interrupted, no record); the next run of it resumes the
attempt (`launch.find_interruption`), as it does after the process was killed outright.

Run as `python -m sat_tasks.backends.local.attempt_process <input file>`.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.clock import now_utc
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob

#: The outcomes the process writes last (`outcome.json`'s `outcome`).
ENDED, INTERRUPTED, FAILED, ERROR = "ended", "interrupted", "failed", "error"


def attempt_file(attempts_dir: Path, attempt: int, suffix: str) -> Path:
    """`attempts/attempt-<k><suffix>` (the names the module's docstring lists)."""
    return attempts_dir / f"attempt-{attempt}{suffix}"


def attempts_dir(run: JobRun) -> Path:
    return run.run_dir / "attempts"


def input_path(run: JobRun, attempt: int) -> Path:
    return attempt_file(attempts_dir(run), attempt, ".supervisor-input.json")


def state_path(run: JobRun, attempt: int) -> Path:
    return attempt_file(attempts_dir(run), attempt, ".supervisor.json")


def lock_path(run: JobRun, attempt: int) -> Path:
    return attempt_file(attempts_dir(run), attempt, ".supervisor.lock")


def log_path(run: JobRun, attempt: int) -> Path:
    return attempt_file(attempts_dir(run), attempt, ".supervisor.log")


def started_path(attempts: Path, attempt: int) -> Path:
    return attempt_file(attempts, attempt, ".started")


def outcome_path(attempts: Path, attempt: int) -> Path:
    return attempt_file(attempts, attempt, ".outcome.json")


@dataclass(frozen=True)
class Supervisor:
    """A started attempt process: its pid, the pid's start time (clock ticks since boot) and its host."""

    pid: int
    start_ticks: int
    host: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "host": self.host}


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started (field 22 of /proc/<pid>/stat, clock ticks since boot); None when it is gone.

    With the pid it names one process: a pid the kernel hands out again has another start time.
    A zombie counts as gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    try:
        return None if fields[0] == "Z" else int(fields[19])
    except (IndexError, ValueError):
        return None


def is_alive(pid: int, start_ticks: int) -> bool:
    """Whether the process `pid` that started at `start_ticks` still runs (not a reused pid)."""
    return pid > 0 and process_start_ticks(pid) == start_ticks


def running(run: JobRun, attempt: int) -> Supervisor | None:
    """The attempt's process when one runs on this host; else None.

    The one holding the attempt's lock first (it wrote itself there), then the one the task
    started (its state file): a process only just started has not taken the lock yet.
    """
    for path in (lock_path(run, attempt), state_path(run, attempt)):
        try:
            noted = json.loads(path.read_text(encoding="utf-8"))
            found = Supervisor(int(noted["pid"]), int(noted["start_ticks"]), str(noted["host"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if found.host == socket.gethostname() and is_alive(found.pid, found.start_ticks):
            return found
    return None


def _hold_lock(run: JobRun, attempt: int) -> IO[str] | None:
    """Take the attempt's lock for this process's life and write this process into it; None when another
    process of the attempt holds it (two would stop each other's training: only one runs an attempt)."""
    handle = open(lock_path(run, attempt), "a+", encoding="utf-8")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    ticks = process_start_ticks(os.getpid())
    handle.write(json.dumps(Supervisor(os.getpid(), -1 if ticks is None else ticks, socket.gethostname()).to_json()))
    handle.flush()
    return handle


def read_outcome(attempts: Path, attempt: int) -> dict[str, Any] | None:
    """What the attempt's last process wrote when it ended (`outcome.json`); None while none did."""
    try:
        outcome = json.loads(outcome_path(attempts, attempt).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return outcome if isinstance(outcome, dict) else None


def start(run: JobRun, plan: Plan, log: Log) -> Supervisor:
    """Start the attempt's process for `plan` (detached: adopted by init, in a session of its own); it.

    The files of an earlier process of the attempt (its outcome, its started mark) go first; its
    log is appended to.
    """
    from sat_tasks.backends.local.warm import spawn_detached

    attempts = attempts_dir(run)
    attempts.mkdir(parents=True, exist_ok=True)
    outcome_path(attempts, plan.attempt).unlink(missing_ok=True)
    started_path(attempts, plan.attempt).unlink(missing_ok=True)
    source = input_path(run, plan.attempt)
    # the job's env may hold what its owner keeps private: only this user reads it (as the XCom it comes from)
    descriptor = os.open(source, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"job": run.job.to_dict(), "run_id": run.run_id,
                   "plan": plan.model_dump(mode="json")}, handle)
    pid = spawn_detached([sys.executable, "-m", __name__, str(source)], dict(os.environ))
    ticks = process_start_ticks(pid)
    if ticks is None:  # it has ended already (it found nothing to do, or failed at once): its outcome says how
        ticks = -1
    supervisor = Supervisor(pid, ticks, socket.gethostname())
    state_path(run, plan.attempt).write_text(json.dumps(supervisor.to_json()), encoding="utf-8")
    log(f"[sat] attempt {plan.attempt} runs in process {pid} on {supervisor.host} (its log: "
        f"{log_path(run, plan.attempt)}); the launch task hands the watch to the triggerer")
    return supervisor


class _SupervisedRun(JobRun):
    """The run as the attempt's process sees it: recording the attempt's start also marks it `started`."""

    def record_attempt_start(self, plan: Plan, log: Log = print, where: str = "",
                             nodes_held: int | None = None) -> None:
        super().record_attempt_start(plan, log, where, nodes_held)
        started_path(attempts_dir(self), plan.attempt).write_text(now_utc().isoformat(), encoding="utf-8")


def _write_outcome(attempts: Path, attempt: int, outcome: dict[str, Any]) -> None:
    """Written whole or not at all (a rename): the trigger never reads half of it."""
    path = outcome_path(attempts, attempt)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps({**outcome, "at": now_utc().isoformat()}), encoding="utf-8")
    partial.replace(path)


def supervise(run: JobRun, plan: Plan, log: Log, interrupt: threading.Event) -> dict[str, Any]:
    """Run the attempt (`launch.launch_attempt`) and say how it ended, as `outcome.json` holds it."""
    from sat_tasks.backends.local.launch import AttemptInterrupted, launch_attempt

    try:
        record: AttemptRecord = launch_attempt(run, plan, log=log, interrupt=interrupt)
    except AttemptInterrupted as exc:  # a SatError too: first
        log(f"[sat] {exc}; the attempt resumes when it runs again")
        return {"outcome": INTERRUPTED, "message": str(exc)}
    except SatError as exc:
        return {"outcome": FAILED, "message": str(exc)}
    return {"outcome": ENDED, "exit_code": record.exit_code}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    source = Path(args[0])
    given = json.loads(source.read_text(encoding="utf-8"))
    run = _SupervisedRun(TrainingJob.model_validate(given["job"]), given["run_id"])
    plan = Plan.model_validate(given["plan"])
    interrupt = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: interrupt.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(log_path(run, plan.attempt), "a", encoding="utf-8", buffering=1) as handle:
        def log(line: str) -> None:
            handle.write(f"{now_utc().isoformat()} {line}\n")

        lock = _hold_lock(run, plan.attempt)
        if lock is None:  # no outcome: the task finds the one that runs (`running`) and watches it
            log(f"[sat] attempt {plan.attempt}: another process runs it; process {os.getpid()} exits")
            return 0
        with lock:
            log(f"[sat] attempt {plan.attempt} of {run.job.name} ({run.run_id}): process {os.getpid()} starts")
            try:
                outcome = supervise(run, plan, log, interrupt)
            except BaseException as exc:  # noqa: BLE001 - said in the outcome: the task reports it and is retried
                log("".join(traceback.format_exception(exc)).rstrip())
                outcome = {"outcome": ERROR, "message": f"{type(exc).__name__}: {exc}"}
            log(f"[sat] attempt {plan.attempt}: process {os.getpid()} ends ({outcome['outcome']})")
            _write_outcome(attempts_dir(run), plan.attempt, outcome)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a process (the tests start it so)
    sys.exit(main())
