"""What the Training Jobs view shows: one row per run of a SAT DAG, and a job page per run, in the service's words.

The DAG run (state, start, end, conf) comes from Airflow's metadata DB; everything the
service knows about the job comes from what its tasks wrote to Object Storage under
`<results>/<job>/<run_id>/`: `status.json` (the status history), `attempts/attempt-N.json`
and `.verdict.json` (node, exit status, verdict, evidence), the mirrored `progress.json`
(committed checkpoints) and the mirrored checkpoints themselves (their manifests, and the
Trainer's `log_history` for the Monitoring tab), `tags.json` and `stop.json` (what people did
in this view). Reading is injected (`read_json(uri) -> object | None`, `list_sizes(prefix) ->
{name: size}`), so this module needs neither a DB nor a bucket to be tested.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from sat_tasks.airflow.params import spec_from_params
from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SpecError, TrainingJob, parse_spec

ReadJson = Callable[[str], Any]
ListSizes = Callable[[str], dict[str, int]]  # the objects under an s3:// prefix: relative name -> size
LIST_READERS = 8  # rows of the list read in parallel (each is a few small Object Storage reads)

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
    edited_tags = read_json(layout.tags_uri)
    status = history[-1]["status"] if history else _STATUS_BEFORE_HISTORY.get(run.state, JobStatus.PENDING.value)
    end = run.end_date or (now or datetime.now(timezone.utc))
    return {
        "job": job.name, "dag_id": run.dag_id, "run_id": run.run_id, "run_state": run.state,
        "learning_type": job.learning_type.value, "framework": job.framework.value, "nodes": job.nodes,
        "status": status, "attempt": max(attempts) if attempts else None,
        "last_checkpoint_step": progress.get("last_committed_step"),
        "started": _iso(run.start_date),
        "duration_s": round((end - run.start_date).total_seconds(), 1) if run.start_date else None,
        "tags": dict(edited_tags) if isinstance(edited_tags, dict) else dict(job.tags), "schedule": job.schedule, "next_run": _iso(run.next_run),
        "results": layout.results_uri, "grid": f"/dags/{run.dag_id}/runs/{run.run_id}",
    }


def list_rows(runs: list[RunRef], jobs: dict[str, TrainingJob], read_json: ReadJson, generic_dag_id: str, *,
              status: str | None = None) -> list[dict[str, Any]]:
    """Rows for `runs` (queued ones first, then newest start first), SAT DAGs only, filtered by status word."""
    known = [(run, job) for run in runs if (job := job_of(run, jobs, generic_dag_id)) is not None]
    with ThreadPoolExecutor(max_workers=LIST_READERS) as pool:
        every = list(pool.map(lambda pair: job_row(pair[0], pair[1], read_json), known))
    rows = [row for row in every if status is None or row["status"] == status]
    # Newest first: runs not started yet (queued) on top, then by start, latest first.
    rows.sort(key=lambda row: (row["started"] is None, row["started"] or ""), reverse=True)
    return rows


def job_log_uri(job: TrainingJob, run_id: str) -> str:
    """Where the run's single job log (every attempt, with the "Starting dataset initialization" markers) lands."""
    return JobRun(job, run_id).results_uri + "job.log"


def job_page(run: RunRef, job: TrainingJob, read_json: ReadJson, list_sizes: ListSizes | None = None
             ) -> dict[str, Any]:
    """The job page of one run: its row, the spec, the status history, attempts, checkpoints and monitoring."""
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
            "duration_s": _seconds_between(record.get("started_at"), record.get("finished_at")),
            "verdict": verdict.get("kind"), "reason": verdict.get("reason"), "evidence": verdict.get("evidence", []),
            "resumed_from_step": progress.get("resumed_from_step"),
            "last_committed_step": progress.get("last_committed_step"), "stopped_by": record.get("stopped_by"),
        })
    progress = read_json(layout.progress_uri) or {}
    stop = read_json(layout.stop_uri)
    return {**row, "spec": job.to_dict(), "log": job_log_uri(job, run.run_id),
            "history": read_json(layout.status_uri) or [], "attempts": attempts,
            "stop_requested": stop if isinstance(stop, dict) else None,
            "checkpoints": {"committed_steps": progress.get("committed_steps", []),
                            "last_mirrored_step": progress.get("last_mirrored_step"),
                            "steps": checkpoint_rows(layout, progress, read_json, list_sizes)},
            "monitoring": monitoring(layout, progress, attempts, read_json)}


def _seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 1)
    except (TypeError, ValueError):
        return None


def checkpoint_rows(layout: JobRun, progress: dict[str, Any], read_json: ReadJson,
                    list_sizes: ListSizes | None) -> list[dict[str, Any]]:
    """One row per committed checkpoint, newest first: step, size, mirrored, verified.

    Mirrored: its manifest is in Object Storage (the engine's mirror copies every file,
    checking its checksum on the way, and writes the manifest last). Verified: every file
    the manifest names is there with the manifest's size.
    """
    rows = []
    for step in sorted({int(s) for s in progress.get("committed_steps") or []}, reverse=True):
        prefix = f"{layout.mirror_uri}checkpoint-{step}/"
        manifest = read_json(prefix + "manifest.json")
        row: dict[str, Any] = {"step": step, "size_bytes": None, "files": None, "mirrored": False,
                               "verified": None, "note": "committed on the node; not in Object Storage (yet)"}
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if isinstance(files, dict):
            row.update(size_bytes=sum(int(entry.get("size") or 0) for entry in files.values()), files=len(files),
                       mirrored=True, note="in Object Storage; checksums checked on the copy")
            if list_sizes is not None:
                stored = list_sizes(prefix)
                wrong = sorted(name for name, entry in files.items() if stored.get(name) != entry.get("size"))
                row["verified"] = not wrong
                if wrong:
                    row["note"] = f"{len(wrong)} file(s) missing or of another size: {', '.join(wrong[:3])}"
        rows.append(row)
    return rows


def _epoch(value: str | None) -> float | None:
    try:
        return datetime.fromisoformat(value).timestamp() if value else None
    except ValueError:
        return None


def monitoring(layout: JobRun, progress: dict[str, Any], attempts: list[dict[str, Any]],
               read_json: ReadJson) -> dict[str, Any]:
    """Loss by step and steps/s over time, from the Trainer's log in the newest mirrored checkpoint.

    The HF integration stamps each log entry with `sat_time` and `sat_attempt`; steps/s is
    the step difference over the time difference of consecutive entries of one attempt.
    Markers: where each later attempt started (time) and the step it resumed from.
    """
    step = progress.get("last_mirrored_step")
    source = f"{layout.mirror_uri}checkpoint-{step}/trainer_state.json" if step is not None else None
    state = read_json(source) if source else None
    history = state.get("log_history") if isinstance(state, dict) else None
    loss = [{"step": int(e["step"]), "loss": float(e["loss"]), "t": e.get("sat_time"), "attempt": e.get("sat_attempt")}
            for e in history or [] if isinstance(e, dict) and isinstance(e.get("loss"), (int, float))
            and isinstance(e.get("step"), int)]
    rate = [{"t": b["t"], "step": b["step"], "attempt": b["attempt"],
             "steps_per_second": round((b["step"] - a["step"]) / (b["t"] - a["t"]), 3)}
            for a, b in zip(loss, loss[1:])
            if a["t"] and b["t"] and b["t"] > a["t"] and a["attempt"] == b["attempt"] and b["step"] > a["step"]]
    markers = []
    for previous, current in zip(attempts, attempts[1:]):
        markers.append({"attempt": current["attempt"], "at": _epoch(current["started_at"]),
                        "step": current["resumed_from_step"],
                        "label": f"attempt {current['attempt']}"
                                 + (f" after {previous['verdict']}" if previous.get("verdict") else "")
                                 + (f", resumed from step {current['resumed_from_step']}"
                                    if current.get("resumed_from_step") is not None else "")})
    note = None if loss else ("no loss logged yet: the Trainer's log reaches Object Storage with each mirrored "
                              "checkpoint" if source else "no checkpoint mirrored yet")
    return {"loss": loss, "steps_per_second": rate, "markers": markers, "source": source, "note": note}
