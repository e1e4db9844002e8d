"""The `launch` task of one attempt on the local backend."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException

from sat_tasks import config
from sat_tasks.backends.launch import AttemptLaunch
from sat_tasks.backends.local import attempt_process
from sat_tasks.backends.local.attempt_trigger import AttemptEndTrigger
from sat_tasks.backends.local.launch import AttemptInterrupted, launch_attempt
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Plan
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk.definitions.context import Context


# An interrupted attempt's task asks to run again this soon (the scheduler's next loop after a restart).
RUN_AGAIN_AFTER = timedelta(seconds=5)
# How many times one attempt's task may die (kill -9, a lost worker) or be re-run after a service
# restart (the scheduler's orphan reset spends a try) and still resume.
LAUNCH_RETRIES = 3
#: The most of an attempt process's log one resumed task copies into its own log (its tail; the job log has all).
LOG_COPY_BYTES = 1 << 20
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+\+00:00 ")


class LocalLaunchOperator(AttemptLaunch, BaseOperator):
    """Run attempt `attempt` as processes on a local node (`LocalBackend.launch`).

    Call order (`execute`): `resolve_attempt` (skipped when the attempt is not needed),
    then `launch.launch_attempt` runs the attempt, stores its record and returns it; a non-zero exit
    fails the task (red in the grid, never retried), and `classify` runs anyway.

    Retries (`LAUNCH_RETRIES`): a try whose task process died (killed, its worker lost) is run
    again, and the attempt resumes from its last committed checkpoint (`launch.find_interruption`),
    as it does when a service restart makes the scheduler run the orphaned task again (that
    re-run counts as a try too). Asked to stop
    (`on_kill`: SIGTERM to the task, as a service stop sends it), the task passes SIGTERM on to
    the training (its final checkpoint) and asks to be run again (up for reschedule: no retry spent).

    With `[sat] local_launch_watch = triggerer` (ADR 0044) `execute` runs the attempt in a process
    of its own (`attempt_process`: the same `launch_attempt`) and defers to the triggerer
    (`AttemptEndTrigger`); `execute_complete` ends the task as `execute` does. No worker slot
    is held while the training runs; `on_kill` has nothing to stop then (a Stop goes through
    the stop request the attempt's process watches, a service stop sends that process SIGTERM).

    Args:
        attempt: 1-based attempt number.
        previous_decide_task_id: task id of the previous attempt's `decide` (None for attempt 1).
    """

    ui_color = "#d6e9f8"

    def __init__(self, *, attempt: int, previous_decide_task_id: str | None, **kwargs: Any) -> None:
        # A failed attempt ends in AirflowFailException: classified, not run again. A try that died resumes.
        kwargs["retries"] = LAUNCH_RETRIES
        super().__init__(**kwargs)
        self.attempt = attempt
        self.previous_decide_task_id = previous_decide_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        if config.sat_setting("local_launch_watch") == "triggerer":
            return self._execute_deferred(context)
        job, plan = self.resolve_attempt(context)
        self._interrupt = threading.Event()
        try:
            record = launch_attempt(JobRun(job, context["run_id"]), plan, log=self.log.info, interrupt=self._interrupt)
        except AttemptInterrupted as exc:  # a SatError too: first, it is run again, not failed
            self.log.info("%s; the task runs again and resumes it", exc)
            raise AirflowRescheduleException(datetime.now(UTC) + RUN_AGAIN_AFTER) from None
        except SatError as exc:
            raise AirflowFailException(str(exc)) from None
        return _ended(plan, record)

    # ---- `[sat] local_launch_watch = triggerer` (issue 48.3, ADR 0044) ---------------------------
    def _execute_deferred(self, context: Context) -> dict[str, Any]:
        """Start the attempt's own process (`attempt_process`) and defer to the triggerer until it ends.

        An attempt whose record is stored ends the task at once, as `launch_attempt` would; one whose
        process still runs (this task was run again: its worker was lost) is watched, not started twice.
        """
        job, plan = self.resolve_attempt(context)
        run = JobRun(job, context["run_id"])
        ended = run.load_record(plan.attempt)
        if ended is not None:
            self.log.info("[sat] attempt %s already ended (exit status %s) in an earlier run of this task: its record "
                          "stands, nothing is run again", plan.attempt, ended.exit_code)
            return _ended(plan, ended)
        supervisor = attempt_process.running(run, plan.attempt)
        if supervisor is None:
            supervisor = attempt_process.start(run, plan, self.log.info)
        else:
            self.log.info("[sat] attempt %s runs in process %s already: watched, not started again", plan.attempt,
                          supervisor.pid)
        self._defer_to(run, plan, supervisor, relaunches=0, announced=False, log_offset=0)
        raise AssertionError("unreachable: defer raises")  # pragma: no cover

    def _defer_to(self, run: JobRun, plan: Plan, supervisor: attempt_process.Supervisor, *, relaunches: int,
                  announced: bool, log_offset: int) -> None:
        self.defer(trigger=AttemptEndTrigger(
            attempts_dir=str(attempt_process.attempts_dir(run)), attempt=plan.attempt, pid=supervisor.pid,
            start_ticks=supervisor.start_ticks, host=supervisor.host, relaunches=relaunches, announced=announced,
            log_offset=log_offset), method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The trigger fired (`AttemptEndTrigger`): end as `execute` does, or defer again.

        The attempt's process ended it (`ended`): its record decides, as in `execute`. Its start
        (`started`): the run's summary is published (ADR 0022) and the task defers again. The
        process gone without an outcome (killed, the host restarted): started again, it resumes
        the attempt from its last committed checkpoint, `LAUNCH_RETRIES` times at most; stopped
        by SIGTERM (`interrupted`: a service stop): started again, no relaunch spent.
        """
        event = event or {}
        status = str(event.get("status"))
        job, plan = self.resolve_attempt(context)
        run = JobRun(job, context["run_id"])
        relaunches = int(event.get("relaunches") or 0)
        log_offset = self._copy_log(run, plan.attempt, int(event.get("log_offset") or 0))
        if status == "started":
            _publish_summary(run, self.log.info)
            supervisor = attempt_process.running(run, plan.attempt)
            if supervisor is not None:
                self._defer_to(run, plan, supervisor, relaunches=relaunches, announced=True, log_offset=log_offset)
            outcome = attempt_process.read_outcome(attempt_process.attempts_dir(run), plan.attempt)
            status = str(outcome.get("outcome")) if outcome else "gone"  # it ended meanwhile: its outcome decides
            event = {**event, "message": (outcome or {}).get("message") or ""}
        if status == attempt_process.ENDED:
            record = run.load_record(plan.attempt)
            if record is None:
                raise AirflowFailException(f"attempt {plan.attempt}: its process ended it, but no record of it is "
                                           f"stored at {run.attempt_uri(plan.attempt)}")
            _publish_summary(run, self.log.info)
            return _ended(plan, record)
        if status == attempt_process.FAILED:
            raise AirflowFailException(str(event.get("message") or f"attempt {plan.attempt} failed"))
        if status == "elsewhere":
            raise AirflowFailException(str(event.get("message")))
        if status == attempt_process.ERROR:  # an error of SAT's own: the task's retries run the attempt again
            raise RuntimeError(f"attempt {plan.attempt}: its process stopped with an error: {event.get('message')} "
                               f"(its log: {attempt_process.log_path(run, plan.attempt)})")
        if status == "gone" and (other := attempt_process.running(run, plan.attempt)) is not None:
            self.log.info("[sat] attempt %s runs in process %s (not %s): watched", plan.attempt, other.pid,
                          event.get("pid"))  # the task started one while another held the attempt's lock
            self._defer_to(run, plan, other, relaunches=relaunches, announced=False, log_offset=log_offset)
        if status == "gone":
            relaunches += 1
            if relaunches > LAUNCH_RETRIES:
                raise AirflowFailException(
                    f"attempt {plan.attempt}: its process was gone without an end {relaunches} times (killed, or "
                    f"its host restarted); not started again after {LAUNCH_RETRIES} (its log: "
                    f"{attempt_process.log_path(run, plan.attempt)})")
            self.log.info("[sat] attempt %s: its process %s is gone without an end (killed, or its host restarted): "
                          "started again (%s of %s), it resumes the attempt", plan.attempt, event.get("pid"),
                          relaunches, LAUNCH_RETRIES)
        elif status == attempt_process.INTERRUPTED:
            self.log.info("[sat] %s; started again, it resumes the attempt", event.get("message"))
        else:
            raise AirflowFailException(f"attempt {plan.attempt}: unknown event from its trigger: {event!r}")
        supervisor = attempt_process.start(run, plan, self.log.info)
        self._defer_to(run, plan, supervisor, relaunches=relaunches, announced=False, log_offset=log_offset)
        raise AssertionError("unreachable: defer raises")  # pragma: no cover

    def _copy_log(self, run: JobRun, attempt: int, offset: int) -> int:
        """Copy what the attempt's process logged since `offset` into this task's log (its tail, at most
        `LOG_COPY_BYTES`); the new offset."""
        path: Path = attempt_process.log_path(run, attempt)
        try:
            size = path.stat().st_size
            if size < offset:  # a new file
                offset = 0
            with open(path, "rb") as handle:
                skipped = max(0, size - offset - LOG_COPY_BYTES)
                handle.seek(offset + skipped)
                text = handle.read(size - offset - skipped).decode("utf-8", errors="replace")
        except OSError:
            return offset
        if skipped:
            self.log.info("[sat] (%s bytes of the attempt process's log left out here: %s has them)", skipped, path)
        for line in text.splitlines():
            self.log.info("%s", _STAMP.sub("", line, count=1))  # the task log has its own time stamps
        return size

    def on_kill(self) -> None:
        """SIGTERM to the task (a service stop, a host shutdown): the attempt's training stops, interrupted."""
        interrupt = getattr(self, "_interrupt", None)
        if interrupt is not None:
            interrupt.set()


def _ended(plan: Plan, record: AttemptRecord) -> dict[str, Any]:
    """The task's end for the attempt's record: its return value; AirflowFailException for a failed attempt."""
    if record.exit_code is None and record.termination_reason:  # it never started (its image: ImagePullBackOff)
        raise AirflowFailException(f"attempt {plan.attempt} on {record.node} did not start: "
                                   f"{record.termination_reason}: {record.termination_message}")
    if record.exit_code != 0:
        raise AirflowFailException(
            f"attempt {plan.attempt} on {record.node} ended with exit status {record.exit_code}"
            + (f" (signal {record.signal})" if record.signal else ""))
    return {"attempt": plan.attempt, "node": record.node, "exit_code": record.exit_code, "signal": record.signal}


def _publish_summary(run: JobRun, log) -> None:
    """Publish the run's summary from its status history (the attempt's process wrote it, outside any task)."""
    from sat_tasks.core import run_summary

    try:
        run_summary.publish(run_summary.summarize_history(run.history(log).entries()).to_dict())
    except Exception as error:  # noqa: BLE001 - the index is derived data: it never fails the task
        log(f"[sat] the run summary was not published: {type(error).__name__}: {error}")
