"""What each task of a Training Job DAG does, as plain functions (no scheduler needed).

The DAG factory wraps these in Airflow tasks. Each function takes the validated job, the
run id and a `log` callable; it returns small JSON-able dicts (XCom-sized) and raises
`JobStopped` (the job ends, the task goes red) or `NotApplicable` (the task is skipped).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sat_tasks import paths, storage
from sat_tasks.attempt import AttemptRecord
from sat_tasks.runtime_env import LAUNCHER_GRACE_MARGIN_S, TrainingPaths, training_environment
from sat_tasks.spec import Backend, TrainingJob, load_spec, parse_spec, split_s3_uri
from sat_tasks.status import TERMINAL, JobStatus, StatusHistory

Log = Callable[[str], None]
logger = logging.getLogger("sat")


class JobStopped(RuntimeError):
    """The job cannot go on; the status says why. The task fails (red) with this message."""


class NotApplicable(RuntimeError):
    """This task has nothing to do in this run (e.g. an attempt that is not needed)."""


class Action:
    """What `decide` tells the next attempt group to do."""

    UPLOAD = "upload"
    FAILOVER = "failover"
    RESUME = "resume"
    STOP = "stop"


@dataclass(frozen=True)
class JobRun:
    """One run of a Training Job: where its files and objects live."""

    job: TrainingJob
    run_id: str

    @property
    def run_dir(self) -> Path:
        return paths.run_dir(self.job.name, self.run_id)

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
        return self.run_dir / "job.log"

    @property
    def vendor_dir(self) -> Path:
        return self.run_dir / "checkpoint_vendor"

    def node_dir(self, node: str) -> Path:
        return self.run_dir / "nodes" / node

    @property
    def results_uri(self) -> str:
        """`<results>/<job>/<run_id>/`: one prefix per run, so no run overwrites another."""
        base = self.job.results.destination.rstrip("/")
        return f"{base}/{self.job.name}/{paths.safe_run_id(self.run_id)}/"

    def attempt_uri(self, attempt: int) -> str:
        return f"{self.results_uri}attempts/attempt-{attempt}.json"

    def verdict_uri(self, attempt: int) -> str:
        return f"{self.results_uri}attempts/attempt-{attempt}.verdict.json"

    def attempt_log_uri(self, attempt: int) -> str:
        """Kubernetes: the attempt's section of job.log (its pods' logs), kept by classify."""
        return f"{self.results_uri}attempts/attempt-{attempt}.log"

    @property
    def status_uri(self) -> str:
        return f"{self.results_uri}status.json"

    def hook(self):
        return storage.object_storage_hook(paths.sat_setting("object_storage_conn_id"))

    def history(self, log: Log = print) -> StatusHistory:
        """The status history, kept in Object Storage under the run's results prefix."""
        hook = self.hook()
        return StatusHistory(
            load=lambda: storage.read_json(hook, self.status_uri),
            save=lambda entries: storage.write_json(hook, self.status_uri, entries),
            log=log,
        )


# ---- validate_spec ----------------------------------------------------------------------------
def resolve_job(spec: dict[str, Any] | None, spec_path: str | None, source: str = "<spec>") -> TrainingJob:
    """The job to run: the spec file as it is now (when given), else the spec mapping."""
    if spec_path and Path(spec_path).exists():
        job = load_spec(spec_path)
    else:
        job = parse_spec(spec or {}, source=source)
    return job.with_backend(paths.sat_setting("backend"))


def validate_spec(spec: dict[str, Any] | None, spec_path: str | None, run_id: str, log: Log = print) -> dict:
    """Validate the spec and open the job's status history (status Pending)."""
    job = resolve_job(spec, spec_path)
    run = JobRun(job, run_id)
    log(f"job {job.name}: {job.learning_type.value} {job.framework.value}, {job.nodes} node(s), backend {job.backend.value}")
    run.history(log).record(JobStatus.PENDING, "spec validated", task="validate_spec")
    return job.to_dict()


# ---- check_image ------------------------------------------------------------------------------
def check_image(job: TrainingJob, run_id: str, *, get_connection=None, log: Log = print) -> dict:
    """Check that the image can be pulled (OCI distribution API); bad images stop the job."""
    from sat_tasks import registry

    run = JobRun(job, run_id)
    access = registry.RegistryAccess(insecure=job.image.insecure)
    if job.image.registry_conn_id:
        conn = get_connection(job.image.registry_conn_id)
        access = registry.registry_access_from_connection(conn, job.image.url)
        access = registry.RegistryAccess(access.username, access.password, access.insecure or job.image.insecure)
    elif job.backend is Backend.LOCAL:
        try:
            ref = registry.parse_image_reference(job.image.url)
        except registry.MalformedReference as exc:
            return _image_failed(run, registry.ImageCheckResult(
                registry.ImageCheckOutcome.MALFORMED, job.image.url, f"malformed: {exc}"), log)
        log(
            f"image {ref}: reference is well-formed; the local backend runs the command on this host, "
            "so no pull happens (set image.registry_conn_id to check the registry anyway)"
        )
        return {"outcome": "skipped-local", "reference": str(ref), "pulls_fail": False}
    result = registry.check_image(
        job.image.url, username=access.username, password=access.password, insecure=access.insecure
    )
    if result.pulls_fail:
        return _image_failed(run, result, log)
    if not result.ok:
        raise RuntimeError(f"image check inconclusive: {result.message}")  # retried by Airflow
    log(f"image ok: {result.reference} {result.digest} ({result.media_type})")
    return result.to_dict()


def _image_failed(run: JobRun, result, log: Log) -> dict:
    run.history(log).record(JobStatus.IMAGE_PULL_BACKOFF, result.message, task="check_image")
    raise JobStopped(f"image {result.reference}: {result.message}")


# ---- stage_data -------------------------------------------------------------------------------
def stage_data(job: TrainingJob, run_id: str, log: Log = print) -> dict:
    """Copy the training script and the data from Object Storage to the job's volume.

    Local backend: into the run's directory on this worker. Kubernetes: into the run's
    claim, by a staging pod on the cluster (`sat_tasks.k8s_staging`), since the worker's
    disk is not what the training pods mount.
    """
    if job.backend is Backend.KUBERNETES:
        from sat_tasks import k8s_staging
        from sat_tasks.k8s_launch import core_v1_client

        client, namespace = core_v1_client(), paths.sat_setting("kubernetes_namespace")
        if k8s_staging.ensure_run_volume(job, run_id, client=client, namespace=namespace):
            log(f"created the run volume claim in {namespace}")
        return k8s_staging.stage_into_volume(job, run_id, client=client, namespace=namespace, log=log)
    from sat_tasks.stage_cli import stage_job_files

    run = JobRun(job, run_id)
    return stage_job_files(run.hook(), data_source=job.data.source, data_dest=run.data_dir,
                           code_dest=run.code_dir, script_url=job.storage.script_url, log=log)


# ---- validate_data ----------------------------------------------------------------------------
def validate_data(job: TrainingJob, run_id: str, staged: dict | None = None, log: Log = print) -> dict:
    """Run the Great Expectations suite on the staged data; a failure stops the job before training.

    Local backend: here, on the staged directory. Kubernetes: the staging pod ran the suite
    where the data is (`stage_cli --validate`); its result comes in `staged["validation"]`.
    """
    from sat_tasks.validation import DataValidationError, validate_dataset

    run = JobRun(job, run_id)
    if job.backend is Backend.KUBERNETES:
        result = (staged or {}).get("validation")
        if result is None:
            raise JobStopped("the staging pod reported no data validation result")
        success, lines = bool(result.get("success")), list(result.get("summary_lines", []))
    else:
        try:
            report = validate_dataset(run.data_dir, job.data.expectation_suite, log=log)
        except DataValidationError as exc:
            success, lines = False, [f"data validation could not run: {exc}"]
        else:
            success, lines, result = report.success, report.summary_lines(), report.to_dict()
    if not success:
        run.history(log).record(
            JobStatus.INTERNAL_ERROR, "data validation failed: " + "; ".join(lines), task="validate_data"
        )
        raise JobStopped("data validation failed:\n" + "\n".join(lines))
    return result


# ---- attempts -----------------------------------------------------------------------------------
def plan_attempt(job: TrainingJob, attempt: int, previous: dict | None) -> dict:
    """Whether attempt `attempt` runs, where it must not run, and from which step it resumes."""
    if attempt == 1:
        return {"attempt": 1, "exclude_nodes": [], "resume_step": None, "failovers": 0, "resumes": 0}
    if not previous or previous.get("action") not in (Action.FAILOVER, Action.RESUME):
        raise NotApplicable(f"attempt {attempt} is not needed")
    return {
        "attempt": attempt,
        "exclude_nodes": list(previous.get("exclude_nodes", [])),
        "resume_step": previous.get("resume_step", -1),
        "failovers": previous.get("failovers", 0),
        "resumes": previous.get("resumes", 0),
    }


def launch_local(job: TrainingJob, run_id: str, plan: dict, log: Log = print) -> dict:
    """Run one attempt on the local backend and store its record; raises JobStopped on failure."""
    from sat_tasks.local_backend import LocalAttempt, pick_node

    run = JobRun(job, run_id)
    attempt = plan["attempt"]
    history = run.history(log)
    node = pick_node(paths.local_node_pool(), plan["exclude_nodes"])
    history.record(JobStatus.RUNNING, f"attempt {attempt} started on {node}", attempt=attempt, task="launch")
    _ensure_vendor_dir(run.vendor_dir)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    object_storage = run.hook().conn_config
    env = training_environment(
        job,
        TrainingPaths(str(run.data_dir), str(run.output_dir), str(run.code_dir), str(run.vendor_dir)),
        attempt=attempt,
        node=node,
        resume_step=plan["resume_step"],
        mirror_url=run.results_uri + "checkpoints/",
        s3_endpoint_url=object_storage.get_service_endpoint_url("s3"),
    )
    env.update(_object_storage_keys(object_storage))  # the training process only: never logged or recorded
    if plan["resume_step"] is not None:
        log(f"resuming with CKPT_LAST_STEP={plan['resume_step']}")
    runner = LocalAttempt(
        job=job.name,
        attempt=attempt,
        node=node,
        command=job.command,
        env=env,
        cwd=run.code_dir,
        output_dir=run.output_dir,
        job_log=run.job_log,
        node_dir=run.node_dir(node),
        image=job.image.url,
        faults=list(job.faults),
        heartbeat_timeout=job.heartbeat_timeout_seconds,
        # SIGKILL only after the engine's own grace period (CKPT_GRACE_SECONDS) has run out
        grace_seconds=float(env["CKPT_GRACE_SECONDS"]) + LAUNCHER_GRACE_MARGIN_S,
    )
    record = runner.run(log)
    store_record(run, record)
    summary = {"attempt": attempt, "node": node, "exit_code": record.exit_code, "signal": record.signal}
    if record.exit_code != 0:
        raise JobStopped(
            f"attempt {attempt} on {node} ended with exit status {record.exit_code}"
            + (f" (signal {record.signal})" if record.signal else "")
        )
    return summary


def _object_storage_keys(conn_config) -> dict[str, str]:
    """The connection's keys as the standard AWS variables (none when it relies on a role or profile)."""
    keys = {
        "AWS_ACCESS_KEY_ID": conn_config.aws_access_key_id,
        "AWS_SECRET_ACCESS_KEY": conn_config.aws_secret_access_key,
        "AWS_SESSION_TOKEN": conn_config.aws_session_token,
        "AWS_DEFAULT_REGION": conn_config.region_name,
    }
    return {name: value for name, value in keys.items() if value}


def _ensure_vendor_dir(dest: Path) -> None:
    from ckpt_engine.vendor import write_vendor_dir

    write_vendor_dir(dest)


def store_record(run: JobRun, record: AttemptRecord) -> None:
    """Keep the attempt record in Object Storage (classify reads it from there)."""
    storage.write_json(run.hook(), run.attempt_uri(record.attempt), record.model_dump(mode="json"))


def load_record(run: JobRun, attempt: int) -> AttemptRecord | None:
    """The stored record of an attempt, or None when the attempt never launched."""
    data = storage.read_json(run.hook(), run.attempt_uri(attempt))
    return None if data is None else AttemptRecord.model_validate(data)


def classify_attempt(job: TrainingJob, run_id: str, attempt: int, log: Log = print) -> dict:
    """Classify what happened to an attempt; skipped when the attempt did not launch."""
    from sat_tasks.classify import classify

    run = JobRun(job, run_id)
    record = load_record(run, attempt)
    if record is None:
        raise NotApplicable(f"attempt {attempt} did not launch")
    verdict = classify(record)
    data = verdict.to_dict()
    data.update(
        {"attempt": attempt, "node": record.node, "last_committed_step": record.last_committed_step}
    )
    storage.write_json(run.hook(), run.verdict_uri(attempt), data)
    log(f"attempt {attempt} on {record.node}: {verdict.kind.value} — {verdict.reason}")
    for line in verdict.evidence:
        log(f"  evidence: {line}")
    return data


def decide_next(job: TrainingJob, run_id: str, plan: dict, verdict: dict, log: Log = print) -> dict:
    """Turn a verdict into the next action and record the job status it implies."""
    run = JobRun(job, run_id)
    history = run.history(log)
    attempt, kind, node = plan["attempt"], verdict["kind"], verdict.get("node")
    exclude = list(plan["exclude_nodes"])
    failovers, resumes = plan["failovers"], plan["resumes"]
    resume_step = verdict.get("last_committed_step")
    resume_step = -1 if resume_step is None else resume_step
    evidence = "; ".join(verdict.get("evidence", [])[:3]) or verdict.get("reason", "")
    decision = {"attempt": attempt, "verdict": kind, "exclude_nodes": exclude, "failovers": failovers,
                "resumes": resumes, "resume_step": resume_step}

    def stop(status: JobStatus, why: str) -> dict:
        history.record(status, why, attempt=attempt, task="decide")
        return {**decision, "action": Action.STOP, "status": status.value, "why": why}

    if kind == "SUCCEEDED":
        return {**decision, "action": Action.UPLOAD, "why": "training completed"}
    if kind == "IMAGE_PULL":
        return stop(JobStatus.IMAGE_PULL_BACKOFF, f"image could not be pulled: {evidence}")
    if kind == "INTERNAL":
        return stop(JobStatus.INTERNAL_ERROR, f"internal error in attempt {attempt} (no retry): {evidence}")
    if kind == "PREEMPTED":
        if not job.is_spot:
            kind = "HARDWARE"  # an on-demand pod evicted by the platform: treat as a node problem
        elif resumes >= job.spot.max_resumes:
            return stop(JobStatus.FAILED, f"pre-empted again after {resumes} resumes (spot.max_resumes)")
        else:
            history.record(JobStatus.PREEMPTED, f"attempt {attempt} pre-empted on {node}; waiting for capacity",
                           attempt=attempt, task="decide")
            delay = max([f.capacity_delay_seconds for f in job.faults
                         if f.attempt == attempt and f.kind.value == "preemption"] or [0])
            return {**decision, "action": Action.RESUME, "resumes": resumes + 1, "why": "spot pre-emption",
                    "preempted_at": time.time(), "capacity_at": time.time() + delay}
    # HARDWARE
    if not job.job_failover and not job.is_spot:
        return stop(JobStatus.FAILED, f"hardware fault on {node} and job_failover is off: {evidence}")
    if job.is_spot:
        if resumes >= job.spot.max_resumes:
            return stop(JobStatus.FAILED, f"hardware fault after {resumes} resumes: {evidence}")
        return {**decision, "action": Action.RESUME, "resumes": resumes + 1,
                "exclude_nodes": exclude + [node] if node else exclude, "why": "hardware fault on a spot node",
                "preempted_at": time.time()}
    if failovers >= job.max_failovers:
        return stop(JobStatus.MAX_RETRIES_EXCEEDED,
                    f"hardware fault on {node} after {failovers} failovers (max {job.max_failovers}): {evidence}")
    history.record(JobStatus.FAILOVER_IN_PROGRESS,
                   f"hardware fault on {node}: {evidence}; failing over (failover {failovers + 1} of {job.max_failovers})",
                   attempt=attempt, task="decide")
    return {**decision, "action": Action.FAILOVER, "failovers": failovers + 1,
            "exclude_nodes": exclude + ([node] if node else []), "why": "hardware fault"}


def capacity_available(job: TrainingJob, run_id: str, previous: dict, log: Log = print) -> bool:
    """Spot: is there capacity again? Stops the job once spot.max_wait_seconds have passed.

    Like SageMaker's MaxWaitTimeInSeconds, the budget counts from the first start of
    training and covers both training and waiting.
    """
    from datetime import datetime

    run = JobRun(job, run_id)
    history = run.history(log)
    starts = [e["at"] for e in history.entries() if e["status"] == JobStatus.RUNNING.value]
    first = datetime.fromisoformat(starts[0]).timestamp() if starts else float(previous.get("preempted_at", time.time()))
    elapsed = time.time() - first
    if elapsed > job.spot.max_wait_seconds:
        why = f"no Spot capacity within spot.max_wait_seconds={job.spot.max_wait_seconds}s of the first start"
        history.record(JobStatus.FAILED, why, attempt=previous.get("attempt"), task="wait_for_capacity")
        raise JobStopped(why)
    if job.backend is Backend.KUBERNETES:
        return _cluster_capacity_available(job, run_id, previous, elapsed, history, log)
    free = [n for n in paths.local_node_pool() if n not in previous.get("exclude_nodes", [])]
    if time.time() < float(previous.get("capacity_at", 0)):
        free = []  # the local pool simulates a Spot market without capacity for a while
    log(f"capacity check {elapsed:.0f}s after the first start: {len(free)} node(s) available")
    return bool(free)


def _cluster_capacity_available(job: TrainingJob, run_id: str, previous: dict, elapsed: float,
                                history: StatusHistory, log: Log) -> bool:
    """Kubernetes: ask the cluster (`k8s_capacity.cluster_capacity`) for nodes a rank of the next attempt fits."""
    from sat_tasks import k8s_capacity

    attempt = int(previous.get("attempt") or 0) + 1
    try:
        assessment = k8s_capacity.cluster_capacity(
            job, run_id, attempt, exclude_nodes=list(previous.get("exclude_nodes", [])), log=log)
    except PermissionError as exc:
        history.record(JobStatus.FAILED, str(exc), attempt=previous.get("attempt"), task="wait_for_capacity")
        raise JobStopped(str(exc)) from None
    if assessment is None:
        return False
    log(f"capacity check {elapsed:.0f}s after the first start: {assessment.summary()}")
    return assessment.available


# ---- upload_results and finalize -------------------------------------------------------------------
def upload_results(job: TrainingJob, run_id: str, decisions: list[dict | None], log: Log = print) -> dict:
    """Upload the output directory and the job log under `<results>/<job>/<run_id>/`."""
    if not any(d and d.get("action") == Action.UPLOAD for d in decisions):
        raise NotApplicable("no attempt succeeded: nothing to upload")
    run = JobRun(job, run_id)
    hook = run.hook()
    report = storage.upload_dir(hook, run.output_dir, run.results_uri + "output/", log=log)
    upload_job_log(run, hook)
    run.history(log).record(JobStatus.COMPLETED, "training completed; results uploaded", task="upload_results")
    return {"results": run.results_uri, **report.to_dict()}


def upload_job_log(run: JobRun, hook) -> None:
    """Copy the run's job log (all attempts) to `<results>/<job>/<run_id>/job.log`, if there is one.

    Kubernetes: the job log is first assembled from the attempts' sections that classify
    stored in Object Storage (`assemble_job_log`), so any worker can upload it.
    """
    if run.job.backend is Backend.KUBERNETES:
        assemble_job_log(run, hook)
    if run.job_log.exists():
        bucket, key = split_s3_uri(run.results_uri + "job.log")
        hook.load_file(filename=run.job_log, key=key, bucket_name=bucket, replace=True)


def store_attempt_log(run: JobRun, attempt: int, section: Path, hook=None) -> None:
    """Kubernetes: keep an attempt's job-log section (a local file) at `attempt_log_uri` (replacing a retry's)."""
    hook = hook or run.hook()
    bucket, key = split_s3_uri(run.attempt_log_uri(attempt))
    hook.load_file(filename=section, key=key, bucket_name=bucket, replace=True)


def assemble_job_log(run: JobRun, hook=None) -> Path | None:
    """Kubernetes: rebuild the run's local job.log from the stored attempt sections, in attempt order.

    Each section is stored whole by its attempt's classify, so a retried classify replaces
    its section instead of appending it twice. Returns the job log, None when no section exists.
    """
    hook = hook or run.hook()
    found = []
    for attempt in range(1, run.job.max_attempts() + 1):
        bucket, key = split_s3_uri(run.attempt_log_uri(attempt))
        if hook.check_for_key(key, bucket_name=bucket):
            found.append((bucket, key))
    if not found:
        return None
    run.job_log.parent.mkdir(parents=True, exist_ok=True)
    part = run.job_log.with_name(run.job_log.name + ".part")
    client = hook.get_conn()
    with open(part, "wb") as handle:
        for bucket, key in found:
            # Streamed in order: download_fileobj writes at the object's own offsets (seek), which
            # would overwrite the previous section instead of appending.
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            try:
                handle.writelines(body.iter_chunks(1 << 20))
            finally:
                body.close()
    os.replace(part, run.job_log)
    return run.job_log


def finalize(job: TrainingJob | None, run_id: str, log: Log = print) -> dict:
    """Write the final job report; raise JobStopped unless the job Completed."""
    if job is None:
        raise JobStopped("the spec did not validate; see validate_spec")
    run = JobRun(job, run_id)
    hook = run.hook()
    history = run.history(log)
    entries = history.entries()
    status = entries[-1]["status"] if entries else JobStatus.FAILED.value
    if status not in {terminal.value for terminal in TERMINAL}:
        history.record(JobStatus.FAILED, f"the run ended while the job was {status!r}", task="finalize")
        entries = history.entries()
        status = JobStatus.FAILED.value
    report = build_report(run, entries)
    storage.write_json(hook, run.results_uri + "report.json", report)
    upload_job_log(run, hook)
    for line in format_report(report):
        log(line)
    if status != JobStatus.COMPLETED.value:
        raise JobStopped(f"job {job.name} ended as {status}: {entries[-1]['reason'] if entries else ''}")
    return {"status": status, "results": run.results_uri}


def build_report(run: JobRun, entries: list[dict]) -> dict:
    """The job report: status, history, attempts, losses and checkpoints."""
    hook = run.hook()
    attempts = []
    for n in range(1, run.job.max_attempts() + 1):
        verdict = storage.read_json(hook, run.verdict_uri(n))
        record = storage.read_json(hook, run.attempt_uri(n))
        if record is None:
            continue
        progress = record.get("progress") or {}
        attempts.append({
            "attempt": n,
            "node": record.get("node"),
            "exit_code": record.get("exit_code"),
            "verdict": (verdict or {}).get("kind"),
            "evidence": (verdict or {}).get("evidence", [])[:3],
            "resumed_from": progress.get("resumed_from_step"),
            "last_committed_step": progress.get("last_committed_step"),
            "step_at_end": progress.get("step"),
            "started_at": record.get("started_at"),
            "finished_at": record.get("finished_at"),
        })
    state_path = run.output_dir / "trainer_state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    losses = [(e["step"], e["loss"]) for e in state.get("log_history", []) if "loss" in e]
    ckpt_root = run.output_dir / "concurrent_checkpoint"
    checkpoints = sorted(p.name for p in ckpt_root.glob("checkpoint-*")) if ckpt_root.exists() else []
    return {
        "job": run.job.name,
        "run_id": run.run_id,
        "status": entries[-1]["status"] if entries else None,
        "history": entries,
        "attempts": attempts,
        "global_step": state.get("global_step"),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "checkpoints": checkpoints,
        "results": run.results_uri,
    }


def format_report(report: dict) -> list[str]:
    """Human lines for the job report (task log and CLI)."""
    lines = [f"job {report['job']} run {report['run_id']}: {report['status']}"]
    for entry in report["history"]:
        lines.append(f"  {entry['at']}  {entry['status']:<30} {entry['reason']}")
    for a in report["attempts"]:
        lines.append(
            f"  attempt {a['attempt']} on {a['node']}: exit {a['exit_code']}, verdict {a['verdict']}"
            + (f", resumed from step {a['resumed_from']}" if a.get("resumed_from") is not None else "")
        )
    if report.get("global_step") is not None:
        lines.append(f"  steps: {report['global_step']}")
    if report.get("first_loss"):
        lines.append(f"  loss: {report['first_loss'][1]:.4f} (step {report['first_loss'][0]}) -> "
                     f"{report['last_loss'][1]:.4f} (step {report['last_loss'][0]})")
    if report.get("checkpoints"):
        lines.append(f"  checkpoints: {', '.join(report['checkpoints'])}")
    lines.append(f"  results: {report['results']}")
    return lines
