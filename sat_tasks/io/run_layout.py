"""Where one run of a Training Job keeps its files: the local work directory and `<results>/<job>/<run_id>/`.

Object Storage holds everything a later task (on any worker) needs: the status history,
each attempt's record, verdict and log section, the engine's mirrored progress and
checkpoints, the outputs, the job log and the report. The names are the runtime contract's
(`ckpt_engine.contract`, ADR 0018); this module turns them into URIs:

    <results>/<job>/<run_id>/
        status.json                      the status history (StatusHistory)
        attempts/attempt-<k>.json        the attempt record (AttemptRecord)
        attempts/attempt-<k>.verdict.json
        attempts/attempt-<k>.log         Kubernetes: the attempt's section of job.log
        checkpoints/                     the engine's mirror (checkpoint-<step>/, progress.json)
        metrics/attempt-<k>/<node>/<series>.jsonl   per-job metrics (ckpt_engine.metrics; io.metrics reads them)
        output/                          the training outputs (upload_results)
        task-failures/<task>.json        why a task failed (an error outside SAT's own stops)
        stop.json                        a person's stop request (who, when), from the Training Jobs view
        tags.json                        the run's tags as edited in the Training Jobs view
        job.log, report.json, report.html
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_engine import contract
from sat_tasks import config
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.contracts import Log, Plan, Verdict
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.io import object_storage as storage
from sat_tasks.spec import TrainingJob, split_s3_uri

if TYPE_CHECKING:  # pragma: no cover
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook



@dataclass(frozen=True)
class RunLayout:
    """Where one run of a Training Job keeps its files and objects: paths and URIs only, no I/O."""

    job: TrainingJob
    run_id: str

    # ---- this worker's disk (the local backend's node disk) ----------------------------------
    @property
    def run_dir(self) -> Path:
        return config.run_dir(self.job.name, self.run_id)

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    @property
    def code_dir(self) -> Path:
        return self.run_dir / "code"

    @property
    def output_dir(self) -> Path:
        return self.run_dir / "output"

    @property
    def job_log(self) -> Path:
        return self.run_dir / contract.JOB_LOG_NAME

    @property
    def vendor_dir(self) -> Path:
        return self.run_dir / "checkpoint_vendor"

    @property
    def metrics_dir(self) -> Path:
        """Where the local backend's training processes write their metrics (copied to `metrics_uri`)."""
        return self.run_dir / "metrics"

    def node_dir(self, node: str) -> Path:
        return self.run_dir / "nodes" / node

    # ---- Object Storage ------------------------------------------------------------------------
    @property
    def results_uri(self) -> str:
        """`<results>/<job>/<run_id>/`: one prefix per run, so no run overwrites another."""
        base = self.job.results.destination.rstrip("/")
        return f"{base}/{self.job.name}/{config.safe_run_id(self.run_id)}/"

    @property
    def mirror_uri(self) -> str:
        """Where the engine mirrors committed checkpoints and its progress (`CKPT_MIRROR_URL`)."""
        return self.results_uri + contract.MIRROR_DIR

    @property
    def progress_uri(self) -> str:
        """The engine's progress.json as its mirror keeps it (read by the Kubernetes backend)."""
        return self.mirror_uri + contract.PROGRESS_NAME

    @property
    def metrics_uri(self) -> str:
        """The job's metrics series (`SAT_METRICS_URL`): `attempt-<k>/<node>/<series>.jsonl`."""
        return self.results_uri + contract.METRICS_DIR

    @property
    def report_html_uri(self) -> str:
        return self.results_uri + contract.REPORT_HTML_NAME

    @property
    def output_uri(self) -> str:
        return self.results_uri + contract.OUTPUT_DIR

    def attempt_uri(self, attempt: int) -> str:
        return self.results_uri + contract.attempt_record_name(attempt)

    def verdict_uri(self, attempt: int) -> str:
        return self.results_uri + contract.verdict_name(attempt)

    def attempt_log_uri(self, attempt: int) -> str:
        """Kubernetes: the attempt's section of job.log (its pods' logs), kept by classify."""
        return self.results_uri + contract.attempt_log_name(attempt)

    def task_failure_uri(self, task_id: str) -> str:
        """Why a task failed, as it noted it (what `finalize` quotes)."""
        return self.results_uri + contract.task_failure_name(task_id)

    @property
    def status_uri(self) -> str:
        return self.results_uri + contract.STATUS_NAME

    @property
    def report_uri(self) -> str:
        return self.results_uri + contract.REPORT_NAME

    @property
    def stop_uri(self) -> str:
        """A person's request to stop the run: `{"by": user, "at": iso time, "via": ...}`."""
        return self.results_uri + contract.STOP_NAME

    @property
    def tags_uri(self) -> str:
        """The run's tags as edited after it started (the spec's tags until then)."""
        return self.results_uri + contract.TAGS_NAME


class RunRecords:
    """One run's records in Object Storage (status history, attempt records, verdicts, stop request,
    progress), read and written through the one S3Hook it holds (given, or made on first use)."""

    def __init__(self, layout: RunLayout, hook: S3Hook | None = None) -> None:
        self.layout = layout
        self._hook = hook

    def hook(self) -> S3Hook:
        """The S3Hook of SAT's Object Storage connection (`[sat] object_storage_conn_id`), made on first use.

        Each new hook resolves the connection and builds a boto3 session (~0.3 s, more on a busy
        machine): finalize alone asked for eleven, so a run's records share one.
        """
        if self._hook is None:
            self._hook = storage.object_storage_hook(config.sat_setting("object_storage_conn_id"))
        return self._hook

    def stop_request(self) -> dict[str, Any] | None:
        """The stop request of this run, or None (nobody asked)."""
        request = storage.read_json(self.hook(), self.layout.stop_uri)
        return request if isinstance(request, dict) else None

    def history(self, log: Log = print) -> StatusHistory:
        """The status history, kept in Object Storage under the run's results prefix."""
        hook = self.hook()
        return StatusHistory(
            load=lambda: storage.read_json(hook, self.layout.status_uri),
            save=lambda entries: storage.write_json(hook, self.layout.status_uri, entries),
            log=log,
        )

    def record_attempt_start(self, plan: Plan, log: Log = print, where: str = "") -> None:
        """Job status Running (one entry per attempt); the plan's exclusions and resume step in the log."""
        self.history(log).record(
            JobStatus.RUNNING, f"attempt {plan.attempt} started" + (f" on {where}" if where else ""),
            attempt=plan.attempt, task="launch")
        if plan.exclude_nodes:
            log(f"avoiding nodes of failed attempts: {', '.join(plan.exclude_nodes)}")
        if plan.resume_step is not None:
            log(f"resuming with {contract.LAST_STEP_ENV}={plan.resume_step}")

    def store_record(self, record: AttemptRecord) -> None:
        """Keep the attempt record in Object Storage (classify and the report read it from there)."""
        storage.write_json(self.hook(), self.layout.attempt_uri(record.attempt), record.model_dump(mode="json"))

    def load_record(self, attempt: int) -> AttemptRecord | None:
        """The stored record of an attempt, or None when the attempt never launched."""
        data = storage.read_json(self.hook(), self.layout.attempt_uri(attempt))
        return None if data is None else AttemptRecord.model_validate(data)

    def store_verdict(self, verdict: Verdict) -> None:
        storage.write_json(self.hook(), self.layout.verdict_uri(verdict.attempt or 0), verdict.to_xcom())

    def load_verdict(self, attempt: int) -> Verdict | None:
        return Verdict.from_xcom(storage.read_json(self.hook(), self.layout.verdict_uri(attempt)))

    def read_progress(self) -> dict[str, Any] | None:
        """The engine's progress as its mirror last wrote it (None before the first write)."""
        return storage.read_json(self.hook(), self.layout.progress_uri)

    def upload_file(self, path: Path, uri: str) -> None:
        """Put one local file at `uri` (replacing what is there)."""
        bucket, key = split_s3_uri(uri)
        self.hook().load_file(filename=path, key=key, bucket_name=bucket, replace=True)


class JobRun(RunLayout):
    """One run of a Training Job as callers construct it (`JobRun(job, run_id)`): its layout (the
    paths and URIs it inherits) and its records (`records`, made on first use: one hook per JobRun).

    JobRun is no dataclass of its own: only the layout's fields are frozen, `records` is an
    ordinary cached attribute. The records' methods are forwarded, so `run.history()` and
    `run.hook()` read as before (ADR 0018 says why JobRun stays the name callers use).
    """

    @cached_property
    def records(self) -> RunRecords:
        return RunRecords(self)

    def hook(self) -> S3Hook:
        return self.records.hook()

    def stop_request(self) -> dict[str, Any] | None:
        return self.records.stop_request()

    def history(self, log: Log = print) -> StatusHistory:
        return self.records.history(log)

    def record_attempt_start(self, plan: Plan, log: Log = print, where: str = "") -> None:
        self.records.record_attempt_start(plan, log, where)

    def store_record(self, record: AttemptRecord) -> None:
        self.records.store_record(record)

    def load_record(self, attempt: int) -> AttemptRecord | None:
        return self.records.load_record(attempt)

    def store_verdict(self, verdict: Verdict) -> None:
        self.records.store_verdict(verdict)

    def load_verdict(self, attempt: int) -> Verdict | None:
        return self.records.load_verdict(attempt)

    def read_progress(self) -> dict[str, Any] | None:
        return self.records.read_progress()

    def upload_file(self, path: Path, uri: str) -> None:
        self.records.upload_file(path, uri)
