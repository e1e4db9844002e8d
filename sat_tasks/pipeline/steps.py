"""What each task of a Training Job DAG does, as plain functions (no scheduler needed).

The DAG factory wraps these in Airflow tasks. Each takes the validated job, the run id and
a `log` callable; it returns small JSON-able values (XCom-sized: the contracts' `to_xcom()`)
and raises `JobStopped` (the job ends, the task goes red) or `NotApplicable` (the task is
skipped). Where training runs is the backend's business (`sat_tasks.backends`): nothing
here asks which one it is.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ckpt_engine.contract import JOB_LOG_NAME, REPORT_HTML_NAME, ProgressRecord
from sat_tasks.backends import backend_for
from sat_tasks.backends.base import node_probe_of, watch_growth_of, workspace_pool_name
from sat_tasks.config import sat_setting, shared_registry_connections
from sat_tasks.core import run_summary
from sat_tasks.core.clock import now_utc
from sat_tasks.core.handoffs import Action, Decision, Log, Plan, Verdict, VerdictKind
from sat_tasks.core.policy import (
    decide_next,
    grow_verdict,
    stop_reason,
    stopped_verdict,
)
from sat_tasks.core.status import TERMINAL, JobStatus
from sat_tasks.errors import JobStopped, NotApplicable
from sat_tasks.io import run_location
from sat_tasks.io.data_roots import source_refusals
from sat_tasks.io.notify_targets import notification_problems
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.pipeline.report import build_report, format_report
from sat_tasks.pipeline.warm_pool import hook_for as warm_pool_hook
from sat_tasks.spec import (
    SpecError,
    SpecProblem,
    TrainingJob,
    load_spec,
    parse_spec,
    split_s3_uri,
)
from sat_tasks.spec.env_secrets import env_secret_problems
from sat_tasks.spec.model import backend_problem, registry_conn_id_problem


# ---- validate_spec ----------------------------------------------------------------------------
def resolve_job(spec: dict[str, Any] | None, spec_path: str | None, source: str = "<spec>") -> TrainingJob:
    """The job to run: the spec file as it is now (when given), else the spec mapping; backend resolved.

    A spec naming a backend outside `[sat] allowed_backends` is a SpecError on `backend` (ADR 0019).
    """
    from pathlib import Path

    from sat_tasks.config import allowed_backends, sat_setting

    if spec_path and Path(spec_path).exists():
        job = load_spec(spec_path)
    else:
        job = parse_spec(spec or {}, source=source)
    problem = backend_problem(job, allowed_backends())
    if problem is not None:
        field, rule = problem.split(": ", 1)
        raise SpecError(spec_path or source, [SpecProblem(field=field, rule=rule)])
    job = job.with_backend(sat_setting("backend"))
    if job.max_runtime_seconds is not None and not backend_for(job).capabilities.watches_stop_request:
        raise SpecError(spec_path or source, [SpecProblem(
            field="max_runtime_seconds", rule=f"the {job.backend.value if job.backend else 'deployment'}'s backend "
            "does not pass a run's stop request to its training, which the stopping condition uses: leave it out "
            "on this backend")])
    return job


def validate_spec(spec: dict[str, Any] | None, spec_path: str | None, run_id: str, log: Log = print, *,
                  spec_with_run: bool = False, dag_id: str | None = None, person: PersonAccess | None = None) -> dict:
    """Validate the spec and open the job's status history (status Pending).

    `spec_with_run`: the generic DAG's run (the spec came with it, so no workspace pool was
    set when the DAG was parsed; see `check_workspace`). `dag_id`: the run's DAG, recorded in
    the returned job (`results.dag_id`): it scopes the run's results prefix for every later task
    and for the view (ADR 0024). `person`: who triggered the run, checked by `check_person`.
    """
    job = resolve_job(spec, spec_path)
    if dag_id is not None:
        job = scoped(job, dag_id)
    run = JobRun(job, run_id)
    log(f"job {job.name}: {job.learning_type.value} {job.framework.value}, {job.nodes} node(s), "
        f"backend {job.backend.value}" + (f", workspace {job.workspace}" if job.workspace else "")
        + f"; results under {run.results_uri}")
    check_person(job, run, person, log)
    check_notifications(job, run, person, log)
    check_workspace(job, run, log, spec_with_run=spec_with_run)
    job = with_workspace_warm_pool(job, log)
    run.history(log).record(JobStatus.PENDING, "spec validated", task="validate_spec")
    return job.to_dict()


class PersonAccess(Protocol):
    """What `check_person` asks of the person who triggered a run (`sat_tasks.airflow.person_access`)."""

    name: str

    def may_use_workspace(self, workspace: str) -> bool: ...

    def may_use_connection(self, conn_id: str) -> bool: ...


def check_person(job: TrainingJob, run: JobRun, person: PersonAccess | None, log: Log = print) -> None:
    """Refuse a run whose triggering person may not use its workspace or its registry login (issue 29.6).

    Create asks the same when it starts a run; a run triggered through the REST API with a
    crafted conf did not pass Create. The person needs GET on the workspace's pool
    `sat-workspace-<name>` and GET on the registry connection (a shared one needs nothing).
    `person` None: no person to ask, and the spec is the deployment's: a job DAG's run (its spec
    file's author is the deployment, whoever triggered it), a scheduled or asset-triggered run
    (no triggering person), or dag.test()'s. Refused: status Failed, naming the permission. The
    data source and script must also be the person's to read (`io.data_roots`, ADR 0039), and
    its `env` may hold no secret (`spec.env_secrets`, ADR 0043: the conf is readable to every
    reader of the generic DAG).
    """
    if person is None:
        return
    problems = []
    if job.workspace is not None and not person.may_use_workspace(job.workspace):
        problems.append(f"workspace: {person.name} may not run jobs in workspace {job.workspace} "
                        f"(it needs the permission to read its pool {workspace_pool_name(job.workspace)})")
    conn_id = job.image.registry_conn_id
    if conn_id and conn_id not in shared_registry_connections() and not person.may_use_connection(conn_id):
        problems.append(f"image.registry_conn_id: {person.name} may not use the connection {conn_id} "
                        "(it needs the permission to read it)")
    problems.extend(str(refusal) for refusal in source_refusals(job, run.dag_id))  # ADR 0039, as Create asks
    problems.extend(f"{field}: {rule}" for field, rule in env_secret_problems(job.env))  # ADR 0043, as Create asks
    if problems:
        reason = "refused for the person who triggered the run: " + "; ".join(problems)
        run.history(log).record(JobStatus.FAILED, reason, task="validate_spec")
        raise JobStopped(f"{job.name}: {reason}")
    log(f"{person.name}, who triggered the run, may use its workspace and registry login")


def check_notifications(job: TrainingJob, run: JobRun, person: PersonAccess | None, log: Log = print, *,
                        get_connection: Any = None) -> None:
    """Refuse a run whose notifications name a connection or endpoint it may not (issue 44.2, ADR 0027).

    A webhook's connection is listed in `[sat] notification_connections` or an http connection the person who
    triggered the run may read, http or https with a host, and its endpoint a path on that host; an e-mail's SMTP
    connection is a listed one (`io.notify_targets`). `person` None: the deployment's spec (a spec file's run, a
    scheduled one, dag.test()'s): any http connection with a host. Refused: status Failed, each rule named.
    """
    if not job.notifications:
        return
    problems = notification_problems(job.notifications, person.may_use_connection if person is not None else None,
                                     get_connection=get_connection,
                                     person=person.name if person is not None else "the person")
    if problems:
        reason = "refused: the job's notifications may not be sent: " + "; ".join(problems)
        run.history(log).record(JobStatus.FAILED, reason, task="validate_spec")
        raise JobStopped(f"{job.name}: {reason}")


def with_workspace_warm_pool(job: TrainingJob, log: Log = print) -> TrainingJob:
    """The job with its workspace's `warm_pool` when it has none of its own (Spot jobs keep none)."""
    if job.warm_pool is not None or job.workspace is None or job.is_spot:
        return job
    from sat_tasks.io.workspaces import WorkspaceStore

    workspace = WorkspaceStore().find(job.workspace)
    if workspace is None or workspace.warm_pool is None:
        return job
    log(f"warm pool: keep_alive_seconds={workspace.warm_pool.keep_alive_seconds} from workspace {workspace.name}")
    return job.model_copy(update={"warm_pool": workspace.warm_pool})


def check_workspace(job: TrainingJob, run: JobRun, log: Log = print, *, spec_with_run: bool = False) -> None:
    """Refuse a job its workspace cannot take (nodes, server type, contract dates): status Failed, with the numbers.

    A job nothing would queue for its nodes is refused too (`Backend.workspace_queue_problem`:
    on Kubernetes without Kueue, a multi-node job of the generic DAG, `spec_with_run`).
    """
    if job.workspace is None:
        return
    from sat_tasks.core.clock import now_utc
    from sat_tasks.core.workspaces import job_problems
    from sat_tasks.io.workspaces import WorkspaceStore

    store = WorkspaceStore()
    problems = [str(p) for p in job_problems(job, store.find(job.workspace), now_utc().date(),
                                             [w.name for w in store.list()])]
    if not problems:
        queue_problem = backend_for(job).workspace_queue_problem(job, spec_with_run=spec_with_run, log=log)
        if queue_problem:
            problems.append(queue_problem)
    if problems:
        reason = "refused by its workspace: " + "; ".join(problems)
        run.history(log).record(JobStatus.FAILED, reason, task="validate_spec")
        raise JobStopped(f"{job.name}: {reason}")


# ---- check_image ------------------------------------------------------------------------------
def check_image(job: TrainingJob, run_id: str, *, get_connection=None, log: Log = print) -> dict:
    """Check that the image can be pulled (OCI distribution API); bad images stop the job."""
    from sat_tasks.io import registry

    run = JobRun(job, run_id)
    access = registry.RegistryAccess(insecure=job.image.insecure)
    if job.image.registry_conn_id:
        try:  # only the job's own login or a shared one, and only for the host it names (issue 29.3)
            problem = registry_conn_id_problem(job, shared_registry_connections())
            if problem:
                raise registry.RegistryLoginRefused(problem)
            conn = get_connection(job.image.registry_conn_id)
            access = registry.registry_access_from_connection(conn, job.image.url, job.image.registry_conn_id)
        except registry.RegistryLoginRefused as exc:
            return _image_failed(run, registry.ImageCheckResult(
                registry.ImageCheckOutcome.UNAUTHORIZED, job.image.url, f"unauthorized: {exc}"), log)
        access = registry.RegistryAccess(access.username, access.password, access.insecure or job.image.insecure)
    elif not backend_for(job).pulls_images:
        try:
            ref = registry.parse_image_reference(job.image.url)
        except registry.MalformedReference as exc:
            return _image_failed(run, registry.ImageCheckResult(
                registry.ImageCheckOutcome.MALFORMED, job.image.url, f"malformed: {exc}"), log)
        log(f"image {ref}: reference is well-formed; the {job.backend.value} backend pulls nothing without a "
            "registry login: its attempt uses the image in its host's store (container runtime) or runs on the "
            "host (set image.registry_conn_id to check and pull from the registry)")
        warm_pool_hook(job).image_checked(run, {"reference": str(ref), "digest": None})
        return {"outcome": "skipped-local", "reference": str(ref), "pulls_fail": False}
    if access.insecure:  # plain http only to a registry the operator allows (issue 44.7)
        refusal = registry.plain_http_refusal(job.image.url, *registry.operator_registry_hosts(get_connection))
        if refusal:
            return _image_failed(run, registry.ImageCheckResult(
                registry.ImageCheckOutcome.UNAUTHORIZED, job.image.url, f"refused: {refusal}"), log)
    result = registry.check_image(
        job.image.url, username=access.username, password=access.password, insecure=access.insecure,
        ca_file=sat_setting("registry_ca_file") or None,
    )
    if result.pulls_fail:
        return _image_failed(run, result, log)
    if not result.ok:
        raise registry.ImageCheckInconclusive(f"image check inconclusive: {result.message}")  # retried by Airflow
    log(f"image ok: {result.reference} {result.digest} ({result.media_type})")
    warm_pool_hook(job).image_checked(run, {"reference": job.image.url, "digest": result.digest})
    return result.to_dict()


def _image_failed(run: JobRun, result, log: Log) -> dict:
    run.history(log).record(JobStatus.IMAGE_PULL_BACKOFF, result.message, task="check_image")
    raise JobStopped(f"image {result.reference}: {result.message}")


# ---- stage_data / validate_data ----------------------------------------------------------------
def stage_data(job: TrainingJob, run_id: str, log: Log = print) -> dict:
    """Copy the training script and the data from Object Storage to where the attempts read them.

    With `warm_pool`, what the job's previous run kept warm is reused where nothing changed
    (`pipeline.warm_pool.WarmPool.stage`). Files staged on this worker are marked
    (`io.run_location.mark`): every later task checks that it sees them.
    """
    run = JobRun(job, run_id)
    staged = warm_pool_hook(job).stage(run, backend_for(job), log)
    run_location.mark(run, log)
    return staged


def validate_data(job: TrainingJob, run_id: str, staged: dict | None = None, log: Log = print) -> dict:
    """Run the Great Expectations suite on the staged data; a failure stops the job before training."""
    run, warm = JobRun(job, run_id), warm_pool_hook(job)
    run_location.check(run, log)
    reused = warm.reused_validation(run, staged, log)
    if reused is not None:  # the warm run's data passed this suite, and neither changed
        return reused
    check = backend_for(job).check_staged_data(run, staged, log)
    if check.success:
        warm.data_validated(run, check.result)
    if not check.success:
        run.history(log).record(JobStatus.INTERNAL_ERROR, "data validation failed: " + "; ".join(check.summary_lines),
                                task="validate_data")
        raise JobStopped("data validation failed:\n" + "\n".join(check.summary_lines))
    return check.result


# ---- attempts -----------------------------------------------------------------------------------
def classify_attempt(job: TrainingJob, run_id: str, attempt: int, log: Log = print) -> dict:
    """Read what attempt `attempt` left behind and classify it; skipped when it never launched."""
    from sat_tasks.classify import classify
    from sat_tasks.io.node_ledger import diagnose_attempt

    run = JobRun(job, run_id)
    run_location.check(run, log)
    record = backend_for(job).read_attempt_record(run, attempt, log)
    if record is None:
        raise NotApplicable(f"attempt {attempt} did not launch")
    verdict, stop_request = classify(record), run.stop_request()
    if stop_request is not None and verdict.kind is not VerdictKind.SUCCEEDED:  # a person's stop, not the node's
        verdict = stopped_verdict(verdict, stop_request)
    elif record.planned_restart and verdict.kind is not VerdictKind.SUCCEEDED:  # elastic growth (ADR 0029)
        verdict = grow_verdict(verdict, record.planned_restart)
    else:
        probe = node_probe_of(backend_for(job), run, log)  # the suspect node's health check, where the backend has one
        verdict = diagnose_attempt(run, verdict, log, probe=probe)  # relocation, three nodes, the ledger (ADR 0004)
    run.store_verdict(verdict)
    log(f"attempt {attempt} on {record.node}: {verdict.kind.value} — {verdict.reason}")
    for line in verdict.evidence:
        log(f"  evidence: {line}")
    return verdict.to_xcom()


def decide(job: TrainingJob, run_id: str, plan: Plan, verdict: Verdict, log: Log = print) -> dict:
    """Turn a verdict into the next action (`core.policy.decide_next`) and record the status it implies."""
    run = JobRun(job, run_id)
    run_location.check(run, log)
    readmitted: list[str] = []
    if verdict.kind is VerdictKind.PLANNED_RESTART:
        record = run.load_record(plan.attempt)
        readmitted = record.readmitted_nodes if record is not None else []
    decision = decide_next(job, plan, verdict, now=time.time(), stop_request=run.stop_request(), readmitted=readmitted)
    if decision.status is not None:
        run.history(log).record(decision.status, decision.why, attempt=plan.attempt, task="decide")
    log(f"attempt {plan.attempt}: {verdict.kind.value} -> {decision.action.value} ({decision.why})")
    _note_attempt_end(run, plan, verdict, decision, log)
    return decision.to_xcom()


def _note_attempt_end(run: JobRun, plan: Plan, verdict: Verdict, decision: Decision, log: Log) -> None:
    """SAT's `attempt_end` job record (metrics/sat/job.jsonl): how and when the attempt ended, its last step.

    The attempt's own series may lack it (a node that died before its first interval); the
    job report and the Monitoring tab take faults and recovery times from these records.
    """
    from sat_tasks.io.metrics import append_job_record

    def stamp(moment: datetime | None) -> float | None:
        return round(moment.timestamp(), 3) if moment else None

    try:
        record = run.load_record(plan.attempt)
        progress = record.progress_record if record else ProgressRecord.from_dict(None)
        append_job_record(run.hook(), run.results_uri, {
            "time": round(time.time(), 3), "job": run.job.name, "run": run.run_id, "attempt": plan.attempt,
            "node": record.node if record else None, "event": "attempt_end", "verdict": verdict.kind.value,
            "action": decision.action.value, "status": decision.status.value if decision.status else None,
            "failovers_used": decision.failovers, "exit_code": record.exit_code if record else None,
            "started_at": stamp(record.started_at) if record else None,
            "ended_at": stamp(record.finished_at) if record else None,
            "last_step": progress.step, "last_committed_step": progress.last_committed_step,
            "resumed_from_step": progress.resumed_from_step,
        })
    except Exception as error:  # noqa: BLE001 - a missing metrics record must not stop the job's decision
        log(f"could not write the attempt's job record to the metrics: {type(error).__name__}: {error}")


def _note_final(run: JobRun, status: str, metrics: Any, log: Log) -> None:
    """SAT's `final` job record: the terminal status, attempts, failovers used and the job's goodput.

    Also added to `metrics` (the run's series as read once by `finalize`), which the report renders.
    """
    from sat_tasks.io.metrics import ORCHESTRATOR_SERIES, append_job_record, job_summary

    try:
        ends = [r for r in metrics.records["job"] if r.get("event") == "attempt_end"]
        record = append_job_record(run.hook(), run.results_uri, {
            "time": round(time.time(), 3), "job": run.job.name, "run": run.run_id, "event": "final",
            "attempt": max((r["attempt"] for r in ends), default=None), "node": "sat", "status": status,
            "attempts": len(ends), "failovers_used": max((r.get("failovers_used") or 0 for r in ends), default=0),
            "goodput": job_summary(metrics)["goodput"], "running": 0,
        })
        run_summary.publish({"goodput": record.get("goodput")})  # the list shows it (ADR 0022)
        metrics.records["job"].append(record)
        if ORCHESTRATOR_SERIES not in metrics.files:
            metrics.files.append(ORCHESTRATOR_SERIES)
    except Exception as error:  # noqa: BLE001 - the report is written without it
        log(f"could not write the job's final record to the metrics: {type(error).__name__}: {error}")


def cleanup_attempt(job: TrainingJob, run_id: str, attempt: int, log: Log = print) -> list[str]:
    """Delete what the attempt kept for classify (its pods, ...)."""
    run = JobRun(job, run_id)
    run_location.check(run, log)
    deleted = backend_for(job).cleanup_attempt(run, attempt, log)
    for name in deleted:
        log(f"deleted {name}")
    return deleted


def watch_growth(job: TrainingJob, run_id: str, plan: Plan, log: Log = print) -> bool:
    """An elastic attempt on fewer nodes, where the backend watches from outside (`grow_watch`): True when done.

    A person's stop request wins over growing back: the watch ends.
    """
    run = JobRun(job, run_id)
    run_location.check(run, log)
    if run.stop_request() is not None:
        log(f"[sat] elastic: a stop was requested: attempt {plan.attempt} is not restarted to grow back")
        return True
    return watch_growth_of(backend_for(job), run, plan, log)


def capacity_available(job: TrainingJob, run_id: str, previous: Decision, log: Log = print) -> bool:
    """Spot: is there capacity again? Stops the job once spot.max_wait_seconds have passed.

    Like SageMaker's MaxWaitTimeInSeconds, the budget counts from the first start of
    training and covers both training and waiting.
    """
    run = JobRun(job, run_id)
    run_location.check(run, log)
    history = run.history(log)
    request = run.stop_request()
    if request is not None:
        why = stop_reason(request) + " while waiting for Spot capacity"
        history.record(JobStatus.STOPPED, why, attempt=previous.attempt, task="wait_for_capacity")
        raise JobStopped(why)
    starts = [e["at"] for e in history.entries() if e["status"] == JobStatus.RUNNING.value]
    first = datetime.fromisoformat(starts[0]).timestamp() if starts else (previous.preempted_at or time.time())
    elapsed = time.time() - first
    if elapsed > job.spot.max_wait_seconds:
        why = f"no Spot capacity within spot.max_wait_seconds={job.spot.max_wait_seconds}s of the first start"
        history.record(JobStatus.FAILED, why, attempt=previous.attempt, task="wait_for_capacity")
        raise JobStopped(why)
    try:
        capacity = backend_for(job).capacity(run, previous, log)
    except JobStopped as exc:
        history.record(JobStatus.FAILED, str(exc), attempt=previous.attempt, task="wait_for_capacity")
        raise
    log(f"capacity check {elapsed:.0f}s after the first start: {capacity.summary}")
    return capacity.available


# ---- upload_results, finalize, cleanup_run -------------------------------------------------------
def upload_results(job: TrainingJob, run_id: str, decisions: list[dict | None], log: Log = print) -> dict:
    """Upload the outputs and the job log under the run's results prefix; Completed only when the outputs are there.

    What reached Object Storage is checked against what the training wrote (`pipeline.outputs`):
    a missing or short output file, or no output at all from a job that declares outputs, ends the
    job Failed with what is missing (issue 48.1).
    """
    from sat_tasks.pipeline.outputs import check_outputs

    if not any(d and Decision.from_xcom(d).action is Action.UPLOAD for d in decisions):
        raise NotApplicable("no attempt succeeded: nothing to upload")
    run = JobRun(job, run_id)
    run_location.check(run, log)
    report = backend_for(job).upload_outputs(run, log)
    problems = check_outputs(run, report)
    upload_job_log(run, log)
    if problems:
        why = "training completed, but its outputs are not all in Object Storage: " + "; ".join(problems)
        run.history(log).record(JobStatus.FAILED, why, task="upload_results")
        raise JobStopped(why)
    run.history(log).record(JobStatus.COMPLETED, "training completed; results uploaded", task="upload_results")
    return {"results": run.results_uri, **report}


def write_report_html(run: JobRun, metrics: Any, log: Log = print) -> None:
    """Render `report.html` (plots of the run's metrics) next to `report.json`; a failure is logged, not raised."""
    from sat_tasks.pipeline.report_html import render_report_html

    try:
        page = render_report_html(metrics, title=f"SAT job report: {run.job.name} / {run.run_id}")
        bucket, key = split_s3_uri(run.report_html_uri)
        run.hook().load_string(page, key=key, bucket_name=bucket, replace=True)
    except Exception as error:  # noqa: BLE001 - the report page must not fail the job's final task
        log(f"could not render {REPORT_HTML_NAME}: {type(error).__name__}: {error}")
        return
    for problem in metrics.problems:
        log(f"{REPORT_HTML_NAME}: metrics line not read: {problem}")
    log(f"{REPORT_HTML_NAME}: {run.report_html_uri} ({len(metrics.files)} series file(s))")


ATTEMPT_ENDED = re.compile(r"\[sat\] attempt (\d+) ended")
VERDICT_LINE_LIMIT = 600  # characters of a verdict's reason on its job-log line


def upload_job_log(run: JobRun, log: Log = print) -> None:
    """Copy the run's job log (all attempts) to `<results>/<job>/<run_id>/job.log`, if there is one.

    After each attempt's last `[sat] attempt N ended` line comes SAT's verdict on it, where one is
    stored: `[sat] verdict on attempt N: KIND: reason (exit status X)` (issue 45.6), so the log
    says why every attempt ended and what followed, not only how the process exited.
    """
    path = backend_for(run.job).job_log(run, log)
    if path is None:
        return
    annotated = _with_verdict_lines(run, path, log)
    try:
        run.upload_file(annotated or path, run.results_uri + JOB_LOG_NAME)
    finally:
        if annotated is not None:
            annotated.unlink(missing_ok=True)


def _with_verdict_lines(run: JobRun, path: Path, log: Log) -> Path | None:
    """A copy of the job log at `path` with a verdict line after each attempt's end, or None if none applies.

    Two streaming passes (a job log may be large): where each attempt's last end line is, then the copy.
    """
    import tempfile

    last_end: dict[int, int] = {}
    with open(path, encoding="utf-8", errors="replace") as source:
        for number, line in enumerate(source):
            if (found := ATTEMPT_ENDED.search(line)) is not None:
                last_end[int(found.group(1))] = number
    lines: dict[int, str] = {}
    for attempt, number in last_end.items():
        try:
            verdict, record = run.load_verdict(attempt), run.load_record(attempt)
        except Exception as error:  # noqa: BLE001 - the log goes up without its verdict lines, not at all
            log(f"could not read attempt {attempt}'s verdict for the job log: {type(error).__name__}: {error}")
            continue
        if verdict is None:
            continue
        reason = verdict.reason if len(verdict.reason) <= VERDICT_LINE_LIMIT else \
            verdict.reason[:VERDICT_LINE_LIMIT] + "…"
        code = record.exit_code if record is not None else None
        lines[number] = (f"[sat] verdict on attempt {attempt}: {verdict.kind.value}: {reason} "
                         f"({'exit status ' + str(code) if code is not None else 'no exit status'})")
    if not lines:
        return None
    with open(path, encoding="utf-8", errors="replace") as source, tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=Path(path).parent, prefix=f".{Path(path).name}.", delete=False) as copy:
        for number, line in enumerate(source):
            copy.write(line)
            if number in lines:
                stamp = line.split(" ", 1)[0] if line[:4].isdigit() else now_utc().isoformat()
                copy.write(("" if line.endswith("\n") else "\n") + f"{stamp} {lines[number]}\n")
    return Path(copy.name)


def record_task_failure(job: TrainingJob, run_id: str, task_id: str, try_number: int, exc: BaseException,
                        log: Log = print) -> None:
    """Note why a task failed (best effort), for `finalize` to quote: `<results>/task-failures/<task>.json`."""
    from sat_tasks.io import object_storage as storage

    run = JobRun(job, run_id)
    try:
        storage.write_json(run.hook(), run.task_failure_uri(task_id), {
            "task": task_id, "try": try_number, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    except Exception as error:  # noqa: BLE001 - Object Storage may be what failed
        log(f"could not note the failure of {task_id} in Object Storage: {error}")


def _failure_reasons(run: JobRun, failed_tasks: list[str]) -> list[str]:
    """`<task> failed: <error>` for each failed task, with the error it noted (if it could)."""
    from sat_tasks.io import object_storage as storage

    reasons = []
    for task_id in failed_tasks:
        try:
            noted = storage.read_json(run.hook(), run.task_failure_uri(task_id))
        except Exception:  # noqa: BLE001 - the name alone still says where to look
            noted = None
        error = (noted or {}).get("error")
        reasons.append(f"{task_id} failed" + (f" (try {noted['try']}): {error}" if error else
                                              " (see its log: it failed before SAT's code ran)"))
    return reasons


def finalize(job: TrainingJob | None, run_id: str, *, failed_tasks: list[str] | None = None, log: Log = print) -> dict:
    """Write the final job report; raise JobStopped unless the job Completed.

    `failed_tasks` (the ids of the tasks that failed in this run) name what really went
    wrong when the history ends without a status that says why, with the error each noted.
    It reads and writes Object Storage only, so it runs wherever it lands; on a worker that does
    not see the run's files (`io.run_location`) it says so, and the job log stays where it is.
    """
    if job is None:
        failed = [t for t in (failed_tasks or []) if t]
        raise JobStopped("there is no validated job: " + (
            "; ".join(f"{t} failed (see its log)" for t in failed) if failed else "validate_spec did not run"))
    run = JobRun(job, run_id)
    elsewhere = run_location.problem(run)
    if elsewhere:
        log(f"[sat] {elsewhere}")
    history = run.history(log)
    entries = history.entries()
    status = entries[-1]["status"] if entries else JobStatus.FAILED.value
    if status not in {terminal.value for terminal in TERMINAL}:
        why = f"the run ended while the job was {status!r}"
        if failed_tasks:
            why += ": " + "; ".join(_failure_reasons(run, failed_tasks))
        if elsewhere:
            why += f"; finalize: {elsewhere}"
        history.record(JobStatus.FAILED, why, task="finalize")
        entries = history.entries()
        status = JobStatus.FAILED.value
    from sat_tasks.io import object_storage as storage
    from sat_tasks.io.metrics import read_object_storage

    try:  # read once: the report's recovery phases, the final record's goodput and the report page come from it
        metrics = read_object_storage(run.results_uri, run.hook())
    except Exception as error:  # noqa: BLE001 - the report page must not fail the job's final task
        log(f"could not read the run's metrics (no final record, no {REPORT_HTML_NAME}): {type(error).__name__}: {error}")
        metrics = None
    report = build_report(run, entries, metrics)
    storage.write_json(run.hook(), run.report_uri, report)
    if metrics is not None:
        _note_final(run, status, metrics, log)
        write_report_html(run, metrics, log)
    upload_job_log(run, log)
    for line in format_report(report):
        log(line)
    if status != JobStatus.COMPLETED.value:  # the DAG run fails: success is for a completed job only (ADR 0025)
        from sat_tasks.core.status import airflow_failed_because

        because = airflow_failed_because(status)  # Stopped, Pending - *: why Airflow shows them failed
        raise JobStopped(f"job {job.name} ended as {status}: {entries[-1]['reason'] if entries else ''}"
                         + (f". {because}" if because else ""))
    return {"status": status, "results": run.results_uri}


def cleanup_run(job: TrainingJob, run_id: str, log: Log = print) -> list[str]:
    """Delete what the run kept on its backend (its volume, helper pods); after the outputs are uploaded."""
    run = JobRun(job, run_id)
    run_location.check(run, log)
    deleted = warm_pool_hook(job).cleanup(run, backend_for(job), log)  # a warm run: kept or not
    for name in deleted:
        log(f"deleted {name}")
    return deleted
