"""The `launch` task of one attempt on the local backend."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException

from sat_tasks.backends.launch import AttemptLaunch
from sat_tasks.backends.local.launch import AttemptInterrupted, launch_attempt
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk.definitions.context import Context


# An interrupted attempt's task asks to run again this soon (the scheduler's next loop after a restart).
RUN_AGAIN_AFTER = timedelta(seconds=5)
# How many times one attempt's task may die (kill -9, a lost worker) or be re-run after a service
# restart (the scheduler's orphan reset spends a try) and still resume.
LAUNCH_RETRIES = 3


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
        job, plan = self.resolve_attempt(context)
        self._interrupt = threading.Event()
        try:
            record = launch_attempt(JobRun(job, context["run_id"]), plan, log=self.log.info, interrupt=self._interrupt)
        except AttemptInterrupted as exc:  # a SatError too: first, it is run again, not failed
            self.log.info("%s; the task runs again and resumes it", exc)
            raise AirflowRescheduleException(datetime.now(UTC) + RUN_AGAIN_AFTER) from None
        except SatError as exc:
            raise AirflowFailException(str(exc)) from None
        if record.exit_code is None and record.termination_reason:  # it never started (its image: ImagePullBackOff)
            raise AirflowFailException(f"attempt {plan.attempt} on {record.node} did not start: "
                                       f"{record.termination_reason}: {record.termination_message}")
        if record.exit_code != 0:
            raise AirflowFailException(
                f"attempt {plan.attempt} on {record.node} ended with exit status {record.exit_code}"
                + (f" (signal {record.signal})" if record.signal else ""))
        return {"attempt": plan.attempt, "node": record.node, "exit_code": record.exit_code, "signal": record.signal}

    def on_kill(self) -> None:
        """SIGTERM to the task (a service stop, a host shutdown): the attempt's training stops, interrupted."""
        interrupt = getattr(self, "_interrupt", None)
        if interrupt is not None:
            interrupt.set()
