"""Where one run of a Training Job keeps its files: the local work directory and its results prefix.

The results prefix is `<destination>/<dag_id>/<job>/<run_key(run_id)>/` (ADR 0024): the DAG's
id scopes it (no run of one DAG shares another DAG's prefix, whatever job name or destination
a person chose) and the run id is encoded reversibly (`config.run_key`), so distinct runs
never share one. `validate_spec` records the DAG in the validated job (`results.dag_id`, the
XCom every later task reads: `scoped`); a job without it is a run validated before this rule
and keeps the legacy prefix `<destination>/<job>/<safe_run_id>/`. `ownership_problem` says
whether a run's layout may be used for a DAG's run (the view's reads and actions).

Object Storage holds everything a later task (on any worker) needs: the status history,
each attempt's record, verdict and log section, the engine's mirrored progress and
checkpoints, the outputs, the job log and the report. The names are the runtime contract's
(`ckpt_engine.contract`, ADR 0018); this module turns them into URIs:

    <results prefix>/
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

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ckpt_engine import contract
from sat_tasks import config
from sat_tasks.core import run_summary
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Log, Plan, Verdict
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.io import object_storage as storage
from sat_tasks.spec import TrainingJob, split_s3_uri

if TYPE_CHECKING:  # pragma: no cover
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook


def results_prefix(destination: str, dag_id: str, job_name: str, run_id: str) -> str:
    """The one rule: `<destination>/<dag_id>/<job>/<run_key(run_id)>/` (ADR 0024).

    Injective: the last three segments hold no `/` (a DAG id, a job name, an encoded run id), so
    the prefix gives back its destination, DAG, job and run; two runs share a prefix only when
    they are the same run of the same DAG.
    """
    if not dag_id or "/" in dag_id:
        raise ValueError(f"dag_id {dag_id!r}: must be a DAG id (no '/')")
    return f"{destination.rstrip('/')}/{dag_id}/{job_name}/{config.run_key(run_id)}/"


def legacy_results_prefix(destination: str, job_name: str, run_id: str) -> str:
    """`<destination>/<job>/<safe_run_id>/`: where runs validated before ADR 0024 keep their results."""
    return f"{destination.rstrip('/')}/{job_name}/{config.safe_run_id(run_id)}/"


def scoped(job: TrainingJob, dag_id: str) -> TrainingJob:
    """`job` with its run's DAG recorded (`results.dag_id`), replacing whatever the spec said there.

    `validate_spec` returns this job: every later task builds its layout from it, and the view
    reads it back (validate_spec's XCom) as the run's recorded prefix.
    """
    data = job.to_dict()
    return TrainingJob.model_validate({**data, "results": {**data["results"], "dag_id": dag_id}})


def ownership_problem(layout: RunLayout, dag_id: str, job_dag_ids: Collection[str]) -> str | None:
    """Why `layout` is not the run's of DAG `dag_id` to read or act on, or None when it is.

    A scoped layout belongs to the DAG it names. A legacy one (`<destination>/<job>/...`) is a job
    DAG's own when the job is that DAG's (a job DAG's id is its job's name); a run of another DAG
    (the generic one) whose job takes a job DAG's name would reach that DAG's objects, so it owns
    none (`job_dag_ids`: the ids of the job DAGs).
    """
    recorded = layout.job.results.dag_id
    if recorded is not None:
        return None if recorded == dag_id else f"its results belong to the DAG {recorded!r}, not {dag_id!r}"
    if layout.job.name == dag_id or layout.job.name not in job_dag_ids:
        return None
    return (f"it was validated before results were scoped by DAG, and its job name {layout.job.name!r} is the "
            f"job DAG {layout.job.name!r}'s: its legacy prefix would reach that DAG's results")


@dataclass(frozen=True)
class RunLayout:
    """Where one run of a Training Job keeps its files and objects: paths and URIs only, no I/O.

    `job` is the validated job (validate_spec's XCom): its `results.dag_id` scopes the layout;
    `RunLayout.of(job, dag_id, run_id)` scopes a job read from elsewhere (a spec file, a conf).
    """

    job: TrainingJob
    run_id: str

    @classmethod
    def of(cls, job: TrainingJob, dag_id: str, run_id: str) -> Self:
        """The layout of run `run_id` of DAG `dag_id` (the job's own `results.dag_id` replaced)."""
        return cls(scoped(job, dag_id), run_id)

    @property
    def dag_id(self) -> str | None:
        """The DAG whose run this is; None for a run validated before results were scoped (legacy)."""
        return self.job.results.dag_id

    # ---- this worker's disk (the local backend's node disk) ----------------------------------
    @property
    def run_dir(self) -> Path:
        return config.run_dir(self.job.name, self.run_id, self.dag_id)

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
        """The run's results prefix as an s3:// URI (ending in `/`): `results_prefix`, or the legacy rule's.

        Everything the run keeps in Object Storage is under it (what a per-run credential may write).
        """
        results = self.job.results
        if results.dag_id is None:
            return legacy_results_prefix(results.destination, self.job.name, self.run_id)
        return results_prefix(results.destination, results.dag_id, self.job.name, self.run_id)

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

        def save(entries: list[dict]) -> None:  # then the list's index hears of it (ADR 0022)
            storage.write_json(hook, self.layout.status_uri, entries)
            run_summary.publish(run_summary.summarize_history(entries).to_dict())

        return StatusHistory(load=lambda: storage.read_json(hook, self.layout.status_uri), save=save, log=log)

    def record_attempt_start(self, plan: Plan, log: Log = print, where: str = "",
                             nodes_held: int | None = None) -> None:
        """Job status Running (one entry per attempt); the plan's exclusions and resume step in the log.

        `nodes_held`: the nodes an elastic attempt holds (ADR 0029), recorded on the entry with the
        job's node count (`StatusChange`), which the run's usage reads; None for any other attempt.
        """
        self.history(log).record(
            JobStatus.RUNNING, f"attempt {plan.attempt} started" + (f" on {where}" if where else ""),
            attempt=plan.attempt, task="launch", nodes_held=nodes_held,
            nodes=self.layout.job.nodes if nodes_held is not None else None)
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

    def record_attempt_start(self, plan: Plan, log: Log = print, where: str = "",
                             nodes_held: int | None = None) -> None:
        self.records.record_attempt_start(plan, log, where, nodes_held)

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
