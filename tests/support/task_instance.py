"""A task instance as SAT's launch operators read it in `execute`: XComs by task id, pushes kept, no metadata DB."""

from __future__ import annotations

from typing import Any

SPEC_TASK_ID = "validate_spec"


class TaskInstanceStub:
    """`ti` of an operator's context: `xcom_pull(task_ids=...)` answers from `xcoms`; `xcom_push` is kept in `pushed`."""

    def __init__(self, task_id: str, xcoms: dict[str, Any] | None = None, *, dag_id: str = "sat-test-job") -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = dag_id, task_id, -1, 1
        self._xcoms = dict(xcoms or {})
        self.pushed: dict[str, Any] = {}

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value") -> Any:
        return self._xcoms.get(task_ids) if task_ids is not None else None

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def spec_ti(task_id: str, spec: dict[str, Any], *, dag_id: str = "sat-test-job") -> TaskInstanceStub:
    """A task instance whose only XCom is the validated spec (what a launch task pulls first)."""
    return TaskInstanceStub(task_id, {SPEC_TASK_ID: spec}, dag_id=dag_id)
