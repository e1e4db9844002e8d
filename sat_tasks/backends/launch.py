"""The part every backend's `launch` operator shares: read the spec and the previous decision, and plan.

A backend's launch operator subclasses its Airflow operator and this mixin, then calls
`resolve_attempt(context)` first in `execute`: it returns the job and the attempt's Plan,
or skips the task when the attempt is not needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowSkipException

from sat_tasks.core.handoffs import Decision, Plan
from sat_tasks.core.policy import plan_attempt
from sat_tasks.errors import NotApplicable
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk.definitions.context import Context

SPEC_TASK_ID = "validate_spec"
# Task states after which a task (retries = 0) does nothing more: a launch that creates no pod, runs nothing.
ENDED_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


def state_name(state: Any) -> str | None:
    """A task state as the task SDK returns it (an enum or a string) as its name; None for none."""
    return None if state is None else str(getattr(state, "value", state))


def ended_task_state(ti: Any, run_id: str, task_id: str) -> str | None:
    """The state of `task_id` in run `run_id` once it has ended (`ENDED_STATES`); None while not, or unreadable.

    Read through the task SDK's `ti.get_task_states` (any task of the same DAG run).
    """
    try:
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[task_id], run_ids=[run_id])
    except Exception:  # noqa: BLE001 - no answer is no end: the caller's own deadline or evidence decides
        return None
    state = state_name(((states or {}).get(run_id) or {}).get(task_id) if isinstance(states, dict) else None)
    return state if state in ENDED_STATES else None


class AttemptLaunch:
    """Mixin for launch operators. Set `attempt`, `previous_decide_task_id`, `spec_task_id` in `__init__`."""

    attempt: int
    previous_decide_task_id: str | None
    spec_task_id: str = SPEC_TASK_ID

    def resolve_attempt(self, context: Context) -> tuple[TrainingJob, Plan]:
        """The validated job and this attempt's plan; AirflowSkipException when there is nothing to run."""
        ti = context["ti"]
        spec = ti.xcom_pull(task_ids=self.spec_task_id)
        if spec is None:
            raise AirflowSkipException("no validated spec (validate_spec did not succeed)")
        job = TrainingJob.model_validate(spec)
        previous = None
        if self.previous_decide_task_id:
            previous = Decision.from_xcom(ti.xcom_pull(task_ids=self.previous_decide_task_id))
        try:
            return job, plan_attempt(job, self.attempt, previous)
        except NotApplicable as exc:
            raise AirflowSkipException(str(exc)) from None
