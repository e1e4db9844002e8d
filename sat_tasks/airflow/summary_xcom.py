"""The listener that carries each published run summary to the metadata DB as the running task's XCom (ADR 0022)."""

from __future__ import annotations

from typing import Any, ClassVar

from sat_tasks.core import run_summary


class XComSummaryListener(run_summary.SummaryListener):
    """Push the summary as the XCom `sat_summary` of the task that wrote the status; outside a task, nothing.

    One XCom per task instance: a later change in the same task replaces it (the summary
    is of the whole history, so the newest is complete). A partial summary (finalize's
    goodput) is merged into what this task pushed before (kept in this process: a task
    instance runs in one process).
    """

    pushed: ClassVar[dict[tuple, dict[str, Any]]] = {}

    def summary_published(self, fields: dict[str, Any]) -> None:
        from airflow.sdk import get_current_context

        try:
            ti = get_current_context()["ti"]
        except Exception:  # noqa: BLE001 - not in a task (the API server's Stop, the CLI, a test)
            return
        key = (ti.dag_id, ti.run_id, ti.task_id, ti.map_index, getattr(ti, "try_number", None))
        merged = {**self.pushed.get(key, {}), **fields}
        ti.xcom_push(run_summary.SUMMARY_KEY, merged)
        self.pushed[key] = merged


def install() -> None:
    """Register the listener (once per process; the DAG factory calls it when it is imported)."""
    run_summary.register(XComSummaryListener())
