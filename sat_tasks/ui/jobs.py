"""What the Training Jobs view shows: one row per run of a SAT DAG, and a job page per run, in the service's words.

The DAG run (state, start, end, conf) comes from Airflow's metadata DB; everything the
service knows about the job comes from what its tasks wrote to Object Storage under
`<results>/<job>/<run_id>/`: `status.json` (the status history), `attempts/attempt-N.json`
and `.verdict.json` (node, exit status, verdict, evidence), the mirrored `progress.json`
(committed checkpoints). Reading is injected (`read_json(uri) -> object | None`), so this
module needs neither a DB nor a bucket to be tested.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SpecError, TrainingJob, parse_spec

ReadJson = Callable[[str], Any]

# What the status is while the service has written nothing yet (or could not), by DAG-run state.
_STATUS_BEFORE_HISTORY = {"queued": JobStatus.PENDING.value, "running": JobStatus.PENDING.value,
                          "failed": JobStatus.FAILED.value, "success": JobStatus.COMPLETED.value}


@dataclass(frozen=True)
class RunRef:
    """One DAG run, as the metadata DB has it."""

    dag_id: str
    run_id: str
    state: str
    start_date: datetime | None = None
    end_date: datetime | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    next_run: datetime | None = None  # the DAG's next scheduled run, for scheduled jobs


def job_of(run: RunRef, jobs: dict[str, TrainingJob], generic_dag_id: str) -> TrainingJob | None:
    """The Training Job a run ran: its spec file's (job DAGs), or the form's conf (the generic DAG)."""
    if run.dag_id in jobs:
        return jobs[run.dag_id]
    if run.dag_id != generic_dag_id or not run.conf:
        return None
    from sat_tasks.airflow.params import spec_from_params

    try:
        return parse_spec(spec_from_params(run.conf), source=f"{run.dag_id}/{run.run_id}")
    except SpecError:
        return None  # the run stopped at validate_spec; the row says so through the DAG-run state


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def job_row(run: RunRef, job: TrainingJob, read_json: ReadJson, *, now: datetime | None = None) -> dict[str, Any]:
    """The list's row for one run: name, type, framework, nodes, status, attempt, checkpoint, times, tags."""
    layout = JobRun(job, run.run_id)
    history = read_json(layout.status_uri) or []
    progress = read_json(layout.progress_uri) or {}
    attempts = [entry["attempt"] for entry in history if entry.get("attempt")]
    status = history[-1]["status"] if history else _STATUS_BEFORE_HISTORY.get(run.state, JobStatus.PENDING.value)
    end = run.end_date or (now or datetime.now(timezone.utc))
    return {
        "job": job.name, "dag_id": run.dag_id, "run_id": run.run_id, "run_state": run.state,
        "learning_type": job.learning_type.value, "framework": job.framework.value, "nodes": job.nodes,
        "status": status, "attempt": max(attempts) if attempts else None,
        "last_checkpoint_step": progress.get("last_committed_step"),
        "started": _iso(run.start_date),
        "duration_s": round((end - run.start_date).total_seconds(), 1) if run.start_date else None,
        "tags": dict(job.tags), "schedule": job.schedule, "next_run": _iso(run.next_run),
        "results": layout.results_uri, "grid": f"/dags/{run.dag_id}/runs/{run.run_id}",
    }


def list_rows(runs: list[RunRef], jobs: dict[str, TrainingJob], read_json: ReadJson, generic_dag_id: str, *,
              status: str | None = None) -> list[dict[str, Any]]:
    """Rows for `runs` (queued ones first, then newest start first), SAT DAGs only, filtered by status word."""
    rows = []
    for run in runs:
        job = job_of(run, jobs, generic_dag_id)
        if job is None:
            continue
        row = job_row(run, job, read_json)
        if status is None or row["status"] == status:
            rows.append(row)
    # Newest first: runs not started yet (queued) on top, then by start, latest first.
    rows.sort(key=lambda row: (row["started"] is None, row["started"] or ""), reverse=True)
    return rows


def job_log_uri(job: TrainingJob, run_id: str) -> str:
    """Where the run's single job log (every attempt, with the "Starting dataset initialization" markers) lands."""
    return JobRun(job, run_id).results_uri + "job.log"


def job_page(run: RunRef, job: TrainingJob, read_json: ReadJson) -> dict[str, Any]:
    """The job page of one run: its row, the spec, the status history, and every attempt with its verdict."""
    read_json = functools.lru_cache(maxsize=None)(read_json)  # the row and the page read status and progress once
    layout = JobRun(job, run.run_id)
    row = job_row(run, job, read_json)
    attempts = []
    for number in range(1, (row["attempt"] or 0) + 1):
        record = read_json(layout.attempt_uri(number)) or {}
        verdict = read_json(layout.verdict_uri(number)) or {}
        progress = record.get("progress") or {}
        attempts.append({
            "attempt": number, "node": record.get("node"), "exit_code": record.get("exit_code"),
            "started_at": record.get("started_at"), "finished_at": record.get("finished_at"),
            "verdict": verdict.get("kind"), "reason": verdict.get("reason"), "evidence": verdict.get("evidence", []),
            "resumed_from_step": progress.get("resumed_from_step"),
            "last_committed_step": progress.get("last_committed_step"),
        })
    progress = read_json(layout.progress_uri) or {}
    return {**row, "spec": job.to_dict(), "log": job_log_uri(job, run.run_id), "history": read_json(layout.status_uri) or [], "attempts": attempts,
            "checkpoints": {"committed_steps": progress.get("committed_steps", []),
                            "last_mirrored_step": progress.get("last_mirrored_step")}}
