"""What the Training Jobs view shows: one row per run of a SAT DAG, and a job page per run, in the service's words.

The DAG run (state, start, end, conf) comes from Airflow's metadata DB; everything the
service knows about the job comes from what its tasks wrote to Object Storage under
`<results>/<job>/<run_id>/`: `status.json` (the status history), `attempts/attempt-N.json`
and `.verdict.json` (node, exit status, verdict, evidence), the mirrored `progress.json`
(committed checkpoints) and the mirrored checkpoints themselves (their manifests, and the
Trainer's `log_history` for the Monitoring tab), `tags.json` and `stop.json` (what people did
in this view). Reading is injected (`read_json(uri) -> object | None`, `list_sizes(prefix) ->
{name: size}`), so this module needs neither a DB nor a bucket to be tested.

The names and record models are the runtime contract's (`ckpt_engine.contract`, ADR 0018)
and the tasks' (`AttemptRecord`, `Verdict`). What is read is untrusted: a record that does
not validate shows as unreadable and the page still renders; how many attempts the page
reads is bounded by the job (`max_attempts`), not by what the records claim.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ckpt_engine.contract import (
    JOB_LOG_NAME,
    MANIFEST_NAME,
    TRAINER_STATE_NAME,
    Manifest,
    ProgressRecord,
    checkpoint_dir,
)
from ckpt_engine.errors import CheckpointError
from sat_tasks.airflow.params import generic_params, spec_from_params
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Verdict, VerdictKind
from sat_tasks.core.policy import GROW_BACK
from sat_tasks.core.run_summary import (
    running_seconds,
    short_node_seconds,
    summarize_history,
    usage,
)
from sat_tasks.core.status import TERMINAL, JobStatus
from sat_tasks.core.where_ran import runtime_of
from sat_tasks.io.run_layout import JobRun, ownership_problem, scoped
from sat_tasks.pipeline.report import PLANNED_RESTART, RECOVERY_PHASES
from sat_tasks.spec import SpecError, TrainingJob, parse_spec

ReadJson = Callable[[str], Any]
TERMINAL_WORDS = frozenset(status.value for status in TERMINAL)
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
    validated: dict[str, Any] | None = None  # validate_spec's XCom: the job as the run's tasks use it (ADR 0024)


def job_of(run: RunRef, jobs: dict[str, TrainingJob], generic_dag_id: str) -> TrainingJob | None:
    """The Training Job a run ran; None when it is not a SAT DAG's run, has no valid spec, or its recorded results
    are not its DAG's (ADR 0024).

    Validated: the job validate_spec recorded (its XCom), the one every later task used, whatever
    the run's conf leaves out (Airflow fills it from the DAG's Params) or its spec file says today.
    Not validated yet (or validate_spec refused it): its spec file's job (job DAGs), or the form's
    conf merged with the generic DAG's Params defaults, as Airflow merges them for the run's tasks;
    scoped by the run's own DAG, where validate_spec will put its results.
    """
    if run.dag_id not in jobs and run.dag_id != generic_dag_id:
        return None
    if run.validated is not None:
        job = recorded_job(run)
    elif run.dag_id in jobs:
        job = scoped(jobs[run.dag_id], run.dag_id)
    else:
        try:
            job = scoped(parse_spec(spec_from_params({**generic_defaults(), **run.conf}),
                                    source=f"{run.dag_id}/{run.run_id}"), run.dag_id)
        except SpecError:
            return None  # the run stops at validate_spec; the row says so through the DAG-run state
    if job is None or ownership_problem(JobRun(job, run.run_id), run.dag_id, set(jobs)) is not None:
        return None
    return job


@functools.cache
def generic_defaults() -> dict[str, Any]:
    """The generic DAG's Params defaults: what Airflow gives a run for each form field its conf leaves out."""
    return {name: param.value for name, param in generic_params().items()}


def recorded_job(run: RunRef) -> TrainingJob | None:
    """The job `run` recorded at validate_spec (destination, DAG; legacy runs: no DAG); None when there is no record,
    or it does not validate (nothing of it is read)."""
    if run.validated is None:
        return None
    try:
        return TrainingJob.model_validate(run.validated)
    except ValidationError:
        return None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _time(value: Any) -> datetime | None:
    """An ISO time as written in a record (naive: UTC); None when it is not one."""
    try:
        stamp = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _int(value: Any) -> int | None:
    """``value`` when it is an integer (not a bool), else None: a wrongly typed field reads as absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """``value`` when it is a number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_progress(read_json: ReadJson, uri: str) -> ProgressRecord:
    """The mirrored progress.json, its wrongly typed fields read as absent (an unreadable file: an empty record)."""
    progress = ProgressRecord.from_dict(read_json(uri))
    return ProgressRecord(
        step=_int(progress.step), last_committed_step=_int(progress.last_committed_step),
        committed_steps=[s for s in progress.committed_steps if _int(s) is not None]
        if isinstance(progress.committed_steps, list) else [],
        in_flight_step=_int(progress.in_flight_step), last_mirrored_step=_int(progress.last_mirrored_step),
        updated_at=progress.updated_at if isinstance(progress.updated_at, str) else "",
        resumed_from_step=_int(progress.resumed_from_step), attempt=_int(progress.attempt))


def read_history(read_json: ReadJson, uri: str) -> list[dict[str, Any]]:
    """status.json's entries that are objects with a status word (anything else is left out)."""
    history = read_json(uri)
    if not isinstance(history, list):
        return []
    return [entry for entry in history if isinstance(entry, dict) and isinstance(entry.get("status"), str)]


def job_row(run: RunRef, job: TrainingJob, read_json: ReadJson, *, now: datetime | None = None) -> dict[str, Any]:
    """The list's row for one run: name, type, framework, nodes, status, attempt, checkpoint, times, tags."""
    layout = JobRun(job, run.run_id)
    history = read_history(read_json, layout.status_uri)
    progress = read_progress(read_json, layout.progress_uri)
    attempts = [number for entry in history if (number := _int(entry.get("attempt")))]
    edited_tags = read_json(layout.tags_uri)
    status = history[-1]["status"] if history else _STATUS_BEFORE_HISTORY.get(run.state, JobStatus.PENDING.value)
    # A job whose status ended (Stopped, Completed) while its DAG run still wraps up ran until that status.
    finished = _time(history[-1].get("at")) if history and status in TERMINAL_WORDS else None
    end = run.end_date or finished or (now or datetime.now(UTC))
    return {
        "job": job.name, "dag_id": run.dag_id, "run_id": run.run_id, "run_state": run.state,
        "learning_type": job.learning_type.value, "framework": job.framework.value, "nodes": job.nodes,
        "status": status, "attempt": max(attempts) if attempts else None,
        "last_checkpoint_step": progress.last_committed_step,
        "started": _iso(run.start_date), "ended": _iso(run.end_date),
        "duration_s": round((end - run.start_date).total_seconds(), 1) if run.start_date else None,
        "active": run.state in ("queued", "running") and run.end_date is None and finished is None,
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
    return JobRun(job, run_id).results_uri + JOB_LOG_NAME


def job_page(run: RunRef, job: TrainingJob, read_json: ReadJson, list_sizes: ListSizes | None = None, *,
             now: datetime | None = None) -> dict[str, Any]:
    """The job page of one run: its row, the spec, the status history, attempts, checkpoints and monitoring; its
    durations and GPU-hours up to `now` while it runs.

    The attempts read are those the status history names, at most the job's `max_attempts()`
    (a status.json claiming 400 attempts does not make the page read 800 objects).
    """
    read_json = functools.lru_cache(maxsize=None)(read_json)  # the row and the page read status and progress once
    layout = JobRun(job, run.run_id)
    row = job_row(run, job, read_json, now=now)
    history = read_history(read_json, layout.status_uri)
    attempts = [attempt_row(number, read_json(layout.attempt_uri(number)), read_json(layout.verdict_uri(number)))
                for number in range(1, min(row["attempt"] or 0, job.max_attempts()) + 1)]
    progress = read_progress(read_json, layout.progress_uri)
    stop = read_json(layout.stop_uri)
    return {**row, "spec": job.to_dict(), "log": job_log_uri(job, run.run_id),
            "history": history, "attempts": attempts,
            **run_usage(run, job, history, held_nodes(job, attempts), now=now),
            "recovery": recovery_rows(read_json(layout.report_uri)),
            "stop_requested": stop if isinstance(stop, dict) else None,
            "checkpoints": {"committed_steps": progress.committed_steps,
                            "last_mirrored_step": progress.last_mirrored_step,
                            "steps": checkpoint_rows(layout, progress, read_json, list_sizes)},
            "monitoring": monitoring(layout, progress, attempts, read_json)}


def held_nodes(job: TrainingJob, attempts: list[dict[str, Any]]) -> dict[int, int]:
    """An elastic job's attempts -> the nodes their records list: what an older history's entries did not record."""
    if job.elastic is None:
        return {}  # a job without elastic runs on its nodes, whatever its records list (the local backend lists one)
    return {row["attempt"]: len(row["nodes"]) for row in attempts if row.get("nodes")}


def run_usage(run: RunRef, job: TrainingJob, history: list[dict[str, Any]], held: dict[int, int] | None = None, *,
              now: datetime | None = None) -> dict[str, Any]:
    """Time in `Running` over every attempt (failovers included) and the GPU-/node-hours it makes (less what elastic
    attempts on fewer nodes did not hold), from the status history; while the job runs, up to `now`
    (`running_since`: the open interval's start). A run that ended while its history still said `Running` counts
    up to the run's end, as the list does. `held` (`held_nodes`): the nodes of the attempts whose start entries do
    not say (a history written before they did)."""
    summary = summarize_history(history, held, job.nodes)
    since = datetime.fromisoformat(summary.running_since) if summary.running_since else None
    ended = run.state not in ("queued", "running")
    until = (run.end_date if ended else None) or now or datetime.now(UTC)
    seconds = running_seconds(summary.running_s, since, until)
    short = short_node_seconds(summary.short_node_s, summary.running_short_nodes, since, until)
    return {"running_s": round(seconds, 1), "running_since": None if ended else summary.running_since,
            **usage(job.nodes, job.resources.gpus_per_node, seconds, short)}


def attempt_row(number: int, raw_record: Any, raw_verdict: Any) -> dict[str, Any]:
    """The Attempts tab's row for attempt `number`, from its record and verdict as read (None: not written yet).

    A record or verdict that does not validate shows as unreadable; the rest of the row stays.
    """
    unreadable: list[str] = []
    record: AttemptRecord | None = None
    verdict: Verdict | None = None
    if raw_record is not None:
        try:
            record = AttemptRecord.model_validate(raw_record)
        except ValidationError:
            unreadable.append("attempt record")
    if raw_verdict is not None:
        try:
            verdict = Verdict.model_validate(raw_verdict)
        except ValidationError:
            unreadable.append("verdict")
    progress = ProgressRecord.from_dict(record.progress if record else None)
    started = record.started_at.isoformat() if record and record.started_at else None
    finished = record.finished_at.isoformat() if record and record.finished_at else None
    reason = verdict.reason if verdict else None
    if unreadable:
        reason = f"{' and '.join(unreadable)} unreadable (not in the shape this SAT writes)"
    return {
        "attempt": number, "node": record.node if record else None, "nodes": list(record.nodes) if record else [],
        "exit_code": record.exit_code if record else None,
        "started_at": started, "finished_at": finished, "duration_s": _seconds_between(started, finished),
        "verdict": verdict.kind.value if verdict else None, "reason": reason,
        "evidence": list(verdict.evidence) if verdict else [],
        "resumed_from_step": _int(progress.resumed_from_step),
        "last_committed_step": _int(progress.last_committed_step),
        "stopped_by": record.stopped_by if record else None, "unreadable": unreadable,
        **(runtime_of(record) if record else {"runtime": None, "image": None, "image_digest": None}),
    }


def recovery_rows(raw_report: Any) -> list[dict[str, Any]] | None:
    """The Attempts tab's recovery table: each fault's and planned restart's recovery by phase, from report.json.

    None before the run's report is written (finalize measures recovery from the run's series). The report lies
    under the run's results, where its training may write too: only numbers and strings of the expected fields are
    taken, anything else reads as unknown.
    """
    if not isinstance(raw_report, dict):
        return None
    entries = [e for key in ("recovery", "planned_restarts") if isinstance(raw_report.get(key), list)
               for e in raw_report[key] if isinstance(e, dict)]
    rows = []
    for entry in sorted(entries, key=lambda e: _int(e.get("attempt")) or 0):
        phases = entry.get("phases") if isinstance(entry.get("phases"), dict) else {}
        unknown = entry.get("unknown") if isinstance(entry.get("unknown"), dict) else {}
        rows.append({
            "attempt": _int(entry.get("attempt")), "next_attempt": _int(entry.get("next_attempt")),
            "node": _text(entry.get("node")), "next_node": _text(entry.get("next_node")),
            "verdict": _text(entry.get("verdict")), "planned": entry.get("verdict") == PLANNED_RESTART,
            "resumed_from_step": _int(entry.get("resumed_from_step")), "recovery_s": _number(entry.get("recovery_s")),
            "phases": [(name.replace("_", " "), _number(phases.get(name)), _text(unknown.get(name)))
                       for name, _, _ in RECOVERY_PHASES],
        })
    return rows


def _text(value: Any) -> str | None:
    """``value`` when it is a string, else None."""
    return value if isinstance(value, str) else None


def _seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 1)
    except (TypeError, ValueError):
        return None


def checkpoint_rows(layout: JobRun, progress: ProgressRecord, read_json: ReadJson,
                    list_sizes: ListSizes | None) -> list[dict[str, Any]]:
    """One row per committed checkpoint, newest first: step, size, mirrored, verified.

    Mirrored: its manifest is in Object Storage (the engine's mirror copies every file,
    checking its checksum on the way, and writes the manifest last). Verified: every file
    the manifest names is there with the manifest's size. A manifest that does not
    validate (`Manifest.from_dict`) is not a mirrored checkpoint; the row says why.
    """
    rows = []
    for step in sorted(set(progress.committed_steps), reverse=True):
        prefix = f"{layout.mirror_uri}{checkpoint_dir(step)}/"
        raw = read_json(prefix + MANIFEST_NAME)
        row: dict[str, Any] = {"step": step, "size_bytes": None, "files": None, "mirrored": False,
                               "verified": None, "note": "committed on the node; not in Object Storage (yet)"}
        manifest: Manifest | None = None
        if raw is not None:
            try:
                manifest = Manifest.from_dict(raw)
            except CheckpointError as exc:
                row["note"] = f"its manifest in Object Storage is unreadable: {exc}"
        if manifest is not None:
            row.update(size_bytes=manifest.total_bytes, files=len(manifest.files),
                       mirrored=True, note="in Object Storage; checksums checked on the copy")
            if list_sizes is not None:
                stored = list_sizes(prefix)
                wrong = sorted(name for name, entry in manifest.files.items() if stored.get(name) != entry.size)
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


# A marker's words for the verdict an attempt ended with, where its name would mislead (the rest: the name).
_AFTER = {VerdictKind.PLANNED_RESTART.value: f"a {GROW_BACK}"}


def monitoring(layout: JobRun, progress: ProgressRecord, attempts: list[dict[str, Any]],
               read_json: ReadJson) -> dict[str, Any]:
    """Loss by step and steps/s over time, from the Trainer's log in the newest mirrored checkpoint.

    The HF integration stamps each log entry with `sat_time` and `sat_attempt`; steps/s is
    the step difference over the time difference of consecutive entries of one attempt.
    Markers: where each later attempt started (time) and the step it resumed from.
    """
    step = progress.last_mirrored_step
    source = f"{layout.mirror_uri}{checkpoint_dir(step)}/{TRAINER_STATE_NAME}" if step is not None else None
    state = read_json(source) if source else None
    history = state.get("log_history") if isinstance(state, dict) else None
    loss = [{"step": e["step"], "loss": _number(e["loss"]), "t": _number(e.get("sat_time")),
             "attempt": e.get("sat_attempt") if isinstance(e.get("sat_attempt"), (int, str)) else None}
            for e in (history if isinstance(history, list) else [])
            if isinstance(e, dict) and _number(e.get("loss")) is not None and _int(e.get("step")) is not None]
    rate = [{"t": b["t"], "step": b["step"], "attempt": b["attempt"],
             "steps_per_second": round((b["step"] - a["step"]) / (b["t"] - a["t"]), 3)}
            for a, b in itertools.pairwise(loss)
            if a["t"] and b["t"] and b["t"] > a["t"] and a["attempt"] == b["attempt"] and b["step"] > a["step"]]
    markers = []
    for previous, current in itertools.pairwise(attempts):
        markers.append({"attempt": current["attempt"], "at": _epoch(current["started_at"]),
                        "step": current["resumed_from_step"],
                        "label": f"attempt {current['attempt']}"
                                 + (f" after {_AFTER.get(previous['verdict'], previous['verdict'])}"
                                    if previous.get("verdict") else "")
                                 + (f", resumed from step {current['resumed_from_step']}"
                                    if current.get("resumed_from_step") is not None else "")})
    note = None if loss else ("no loss logged yet: the Trainer's log reaches Object Storage with each mirrored "
                              "checkpoint" if source else "no checkpoint mirrored yet")
    return {"loss": loss, "steps_per_second": rate, "markers": markers, "source": source, "note": note}
