"""The `launch` task of one attempt on the local backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from sat_tasks.backends.launch import AttemptLaunch
from sat_tasks.backends.local.launch import launch_attempt
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk.definitions.context import Context


class LocalLaunchOperator(AttemptLaunch, BaseOperator):
    """Run attempt `attempt` as processes on a local node (`LocalBackend.launch`).

    Call order (`execute`): `resolve_attempt` (skipped when the attempt is not needed),
    then `launch.launch_attempt` runs the attempt, stores its record and returns it; a non-zero exit
    fails the task (red in the grid, never retried), and `classify` runs anyway.

    One retry: a try whose task process died (killed, its worker lost) is run again, and the
    attempt resumes from its last committed checkpoint (`launch.find_interruption`), as it does
    when a service restart makes the scheduler run the orphaned task again.

    Args:
        attempt: 1-based attempt number.
        previous_decide_task_id: task id of the previous attempt's `decide` (None for attempt 1).
    """

    ui_color = "#d6e9f8"

    def __init__(self, *, attempt: int, previous_decide_task_id: str | None, **kwargs: Any) -> None:
        # A failed attempt ends in AirflowFailException: classified, not run again. A try that died resumes.
        kwargs["retries"] = 1
        super().__init__(**kwargs)
        self.attempt = attempt
        self.previous_decide_task_id = previous_decide_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        job, plan = self.resolve_attempt(context)
        try:
            record = launch_attempt(JobRun(job, context["run_id"]), plan, log=self.log.info)
        except SatError as exc:
            raise AirflowFailException(str(exc)) from None
        if record.exit_code != 0:
            raise AirflowFailException(
                f"attempt {plan.attempt} on {record.node} ended with exit status {record.exit_code}"
                + (f" (signal {record.signal})" if record.signal else ""))
        return {"attempt": plan.attempt, "node": record.node, "exit_code": record.exit_code, "signal": record.signal}
