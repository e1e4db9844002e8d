"""Build the Training Job DAG: validate -> image -> stage -> validate data -> unrolled attempts -> upload -> finalize.

Only wiring lives here: every task body is a function of `sat_tasks.pipeline.steps`, and
the `launch` task(s) come from the job's backend (`Backend.launch_operators`), so nothing
here asks which backend a job runs on. Heavy imports happen inside task bodies: building
a DAG is cheap (files are re-parsed often).
"""

from __future__ import annotations

import inspect
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, TaskGroup, TriggerRule, get_current_context, task
from airflow.sdk.bases.xcom import BaseXCom
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, DownstreamTasksSkipped

from sat_tasks.airflow import summary_xcom
from sat_tasks.airflow.notify import job_end_callbacks
from sat_tasks.backends import Backend, backend_for
from sat_tasks.backends.launch import ended_task_state
from sat_tasks.core.attempt import attempt_group_id, attempt_in_task_id
from sat_tasks.core.handoffs import Action, Decision, Plan, Verdict
from sat_tasks.core.policy import plan_attempt
from sat_tasks.errors import JobStopped, NotApplicable
from sat_tasks.pipeline import steps
from sat_tasks.spec import TrainingJob

log = logging.getLogger("sat.task")
summary_xcom.install()  # each status change also goes to the metadata DB as the task's XCom (ADR 0022)
START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
GENERIC_DAG_ID = "sat_training_job"
GENERIC_MAX_ATTEMPTS = 6  # 1 + max(3 failovers, 5 Spot resumes)

# Every task but `launch` is idempotent and talks to Object Storage or the Airflow API, which
# can fail for a moment (a stalled execution API, a busy S3 endpoint): those are retried. A
# task that decides the job ends (JobStopped -> AirflowFailException) is never retried. A failed
# attempt is the next attempt group's business: the local `launch` fails it without a retry, and
# takes retries only for a try that died, which resumes the attempt from its last checkpoint.
DEFAULT_ARGS = {
    "owner": "sat",
    "retries": 2,
    "retry_delay": timedelta(seconds=10),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=2),
}


# One try of check_image at most: the registry check's own deadline (io.registry.DEFAULT_DEADLINE,
# 120 s) plus the connection lookup and the status write; a hung try is killed and retried.
CHECK_IMAGE_TIMEOUT = timedelta(minutes=5)


# What `@task` works out from a task body's function alone (its signature, read four times per task), by
# the body's code: every DAG built in a process defines the same bodies anew as closures, with the same
# code (issue 31.2).
_BODY_SIGNATURES: dict[Any, inspect.Signature] = {}


def _task(factory: Any = None, **kwargs: Any):
    """`@task(**kwargs)` (or `@task.sensor(**kwargs)`: `factory`) for a body defined anew for each DAG.

    The first body with a given code is decorated as written; the next ones get its signature
    (`__signature__`, which `inspect.signature` returns at once), and Airflow builds the same task.
    A `@task` pushes its return value as one XCom (`multiple_outputs=False`): Airflow would infer
    True from a `-> dict` annotation and push every key of the dict once more as an XCom of its own
    (validate_spec's spec alone has ~30), which nothing reads (every reader takes `return_value`):
    one Execution API call and one metadata row each, on every task's way to its successor.
    """
    factory = factory or task
    if factory is task:  # `task.sensor` fixes multiple_outputs itself (False)
        kwargs.setdefault("multiple_outputs", False)

    def decorate(fn):
        signature = _BODY_SIGNATURES.get(fn.__code__)
        if signature is None:
            decorated = factory(**kwargs)(fn)
            _BODY_SIGNATURES[fn.__code__] = decorated.function_signature
            return decorated
        fn.__signature__ = signature
        return factory(**kwargs)(fn)

    return decorate


def _say(message: str) -> None:
    log.info("%s", message)


def _run(fn, *args, **kwargs):
    """Call a task function, turning its stop/skip signals into Airflow's.

    Any other error is noted in the run's results (`task-failures/<task>.json`, what
    `finalize` quotes when the job ends without a status that says why) and raised: the
    task fails or is retried.
    """
    try:
        return fn(*args, log=_say, **kwargs)
    except JobStopped as exc:
        raise AirflowFailException(str(exc)) from None
    except NotApplicable as exc:
        raise AirflowSkipException(str(exc)) from None
    except Exception as exc:
        if args and isinstance(args[0], TrainingJob):
            ti = get_current_context()["ti"]
            steps.record_task_failure(args[0], args[1], ti.task_id, ti.try_number, exc, log=_say)
        raise


def _job(spec: dict | None) -> TrainingJob:
    if spec is None:
        raise AirflowSkipException("no validated spec (validate_spec did not succeed)")
    return TrainingJob.model_validate(spec)


def _pull(task_id: str) -> Any:
    return get_current_context()["ti"].xcom_pull(task_ids=task_id)


def _run_id() -> str:
    return get_current_context()["run_id"]


def _schedule(job: TrainingJob | None):
    if job is None or job.schedule is None:
        return None
    if job.schedule.startswith("asset:"):
        return [Asset(job.schedule[len("asset:"):])]
    return job.schedule


def build_job_dag(
    job: TrainingJob | None,
    *,
    dag_id: str,
    spec_path: str | None = None,
    fileloc: str | None = None,
    max_attempts: int | None = None,
    params: dict[str, Param] | None = None,
    doc_md: str | None = None,
) -> DAG:
    """The DAG of one Training Job (`job` given), or the generic one (`job` None: spec from params)."""
    baked = job.to_dict() if job else None
    attempts = max_attempts or (job.max_attempts() if job else GENERIC_MAX_ATTEMPTS)
    spot_waits = job is None or job.is_spot
    tags = ["sat", "training-job"] + ([f"{k}:{v}" for k, v in sorted(job.tags.items())][:20] if job else ["generic"])

    with DAG(
        dag_id=dag_id,
        schedule=_schedule(job),
        start_date=START_DATE,
        catchup=False,
        # A job DAG runs one run at a time; the generic DAG as many as `[core] max_active_runs_per_dag`, which
        # `sat up` sizes from the local pool (service.concurrency, issue 45.5).
        **({"max_active_runs": 1} if job else {}),
        default_args=DEFAULT_ARGS,
        tags=tags,
        params=params or {},
        doc_md=doc_md or f"Training Job `{dag_id}`" + (f" from `{spec_path}`" if spec_path else ""),
        render_template_as_native_obj=False,
        **job_end_callbacks(job),  # the spec's notifications of the job's end (Airflow's notifiers)
    ) as dag:
        if fileloc:
            dag.fileloc = fileloc

        @_task(task_id="validate_spec")
        def validate_spec() -> dict:
            from sat_tasks.airflow.params import spec_from_params
            from sat_tasks.airflow.person_access import triggering_person

            context = get_current_context()
            spec = baked if baked is not None else spec_from_params(dict(context["params"]))
            return _run(steps.validate_spec, spec, None, context["run_id"], spec_with_run=baked is None, dag_id=dag_id,
                        person=None if baked is not None else triggering_person(context["dag_run"]))

        @_task(task_id="check_image", execution_timeout=CHECK_IMAGE_TIMEOUT)
        def check_image(spec: dict) -> dict:
            from airflow.sdk import BaseHook

            return _run(steps.check_image, _job(spec), _run_id(), get_connection=BaseHook.get_connection)

        @_task(task_id="stage_data")
        def stage_data(spec: dict) -> dict:
            return _run(steps.stage_data, _job(spec), _run_id())

        @_task(task_id="validate_data")
        def validate_data(spec: dict, staged: dict) -> dict:
            return _run(steps.validate_data, _job(spec), _run_id(), staged)

        spec = validate_spec()
        staged = stage_data(spec)
        check_image(spec) >> staged
        gate = validate_data(spec, staged)

        backend = backend_for(job)  # once per DAG: it reads the config
        previous_decide: str | None = None
        upstream = gate
        decide_ids = []
        for k in range(1, attempts + 1):
            with TaskGroup(group_id=attempt_group_id(k), tooltip=f"attempt {k}: launch, classify, decide") as group:
                entries = _attempt_group(spec, k, previous_decide, spot_waits, job, backend)
            for entry in entries:
                upstream >> entry
            upstream = group
            previous_decide = f"{attempt_group_id(k)}.decide"
            decide_ids.append(previous_decide)

        @_task(task_id="upload_results", trigger_rule=TriggerRule.ALL_DONE)
        def upload_results(spec: dict | None) -> dict:
            decisions = [_pull(tid) for tid in decide_ids]
            return _run(steps.upload_results, _job(spec), _run_id(), decisions)

        @_task(task_id="finalize", trigger_rule=TriggerRule.ALL_DONE)
        def finalize() -> dict:
            spec_now = _pull("validate_spec")
            job_now = TrainingJob.model_validate(spec_now) if spec_now else None
            try:
                return steps.finalize(job_now, _run_id(), failed_tasks=_failed_tasks(), log=_say)
            except JobStopped as exc:
                raise AirflowFailException(str(exc)) from None

        @_task(task_id="cleanup_run", trigger_rule=TriggerRule.ALL_DONE)
        def cleanup_run(spec: dict | None) -> list[str]:
            return _run(steps.cleanup_run, _job(spec), _run_id())

        upload = upload_results(spec)
        upstream >> upload >> finalize()
        upload >> cleanup_run(spec)
    return dag


def _failed_tasks() -> list[str]:
    """The ids of the tasks that failed in this DAG run (what `finalize` names)."""
    context = get_current_context()
    ti = context["ti"]
    try:
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[context["run_id"]])
    except Exception as exc:  # noqa: BLE001 - the report is still written without the names
        log.warning("could not read the task states of this run: %s", exc)
        return []
    run_states = states.get(context["run_id"], {}) if isinstance(states, dict) else {}
    return [task_id for task_id, state in sorted(run_states.items())
            if str(getattr(state, "value", state)) == "failed"]


def _attempt_group(spec, k: int, previous_decide: str | None, spot_waits: bool, job: TrainingJob | None,
                   backend: Backend):
    """launch -> classify -> decide (and cleanup) for attempt k, plus a capacity wait for Spot resumes.

    Returns the group's entry tasks (what the previous group points to).
    """

    def previous() -> Decision | None:
        return Decision.from_xcom(_pull(previous_decide)) if previous_decide else None

    def plan(job_: TrainingJob) -> Plan:
        try:
            return plan_attempt(job_, k, previous())
        except NotApplicable as exc:
            raise AirflowSkipException(str(exc)) from None

    first = []
    if k > 1 and spot_waits:
        poll = job.spot.poll_seconds if job else 30
        timeout = job.spot.max_wait_seconds if job else 24 * 3600

        @_task(task.sensor, task_id="wait_for_capacity", poke_interval=poll, timeout=timeout, mode="reschedule")
        def wait_for_capacity(spec: dict) -> bool:
            prev = previous()
            if prev is None or not prev.needs_attempt:
                raise AirflowSkipException(f"attempt {k} is not needed")
            if prev.action is not Action.RESUME:
                return True
            return _run(steps.capacity_available, _job(spec), _run_id(), prev)

        first.append(wait_for_capacity(spec))

    launch_ops = backend.launch_operators(attempt=k, previous_decide_task_id=previous_decide, job=job)
    watches = [_growth_watch(spec, k, job, plan)] if _grows_back(k, job, backend) else []

    # NONE_SKIPPED: classify runs when the launch succeeded or failed, and is skipped by the scheduler
    # (no task process) when the launch was skipped because the attempt is not needed.
    @_task(task_id="classify", trigger_rule=TriggerRule.NONE_SKIPPED)
    def classify(spec: dict | None) -> dict:
        job_ = _job(spec)
        plan(job_)
        return _run(steps.classify_attempt, job_, _run_id(), k)

    @_task(task_id="decide")
    def decide(spec: dict, verdict: dict) -> dict:
        job_ = _job(spec)
        decision = _run(steps.decide, job_, _run_id(), plan(job_), Verdict.from_xcom(verdict))
        _skip_later_attempts_unless_needed(k, decision)
        return decision

    @_task(task_id="cleanup", trigger_rule=TriggerRule.ALL_DONE)
    def cleanup(spec: dict | None) -> list[str]:
        job_ = _job(spec)
        plan(job_)
        return _run(steps.cleanup_attempt, job_, _run_id(), k)

    verdict = classify(spec)
    for node in first:
        for op in launch_ops:
            node >> op
    for op in launch_ops:
        op >> verdict
    decide(spec, verdict)
    verdict >> cleanup(spec)
    return (first or launch_ops) + watches


def _skip_later_attempts_unless_needed(k: int, decision: dict) -> None:
    """When attempt k's decision needs no further attempt, every task of the later attempt groups is
    skipped at once, and the run goes on to `upload_results` now.

    Left to the trigger rules, each unneeded group took a scheduler turn per layer and started a task
    process for its entry and its cleanup only for them to skip themselves (4-6 s per group under
    the scheduler, 12-20 s per finished run with six attempts). A task that already runs or ended is
    left alone by Airflow (`skip-downstream` skips only tasks not yet started). The decision is
    pushed first: raising `DownstreamTasksSkipped` ends the task in success without pushing its value.
    """
    if Decision.from_xcom(decision).needs_attempt:
        return
    context = get_current_context()
    later = [task_id for task_id in context["dag"].task_ids
             if (place := attempt_in_task_id(task_id)) is not None and place[0] > k]
    if not later:
        return
    context["ti"].xcom_push(BaseXCom.XCOM_RETURN_KEY, decision)
    raise DownstreamTasksSkipped(tasks=later)


def _grows_back(k: int, job: TrainingJob | None, backend: Backend) -> bool:
    """Attempt k of an elastic job may run on fewer nodes and grow back, watched from the DAG (`grow_watch`):
    a failover attempt (k > 1) that is not the last one (a planned restart takes the next attempt)."""
    return (backend.capabilities.grow_watch and job is not None and job.elastic is not None
            and 1 < k < job.max_attempts())


# How often the grow-back watch looks (reschedule mode: no worker slot between); it also ends at most
# this long after the attempt's pods, and the next attempt group waits for it.
GROW_POKE_SECONDS = 15


def _growth_watch(spec, k: int, job: TrainingJob, plan):
    """`watch_growth`: beside attempt k's launch, asks the backend whether capacity is back (ADR 0029).

    It is a leaf of attempt k's group, so attempt k+1 starts after it: it skips only when attempt
    k is not needed (then neither is the next), and otherwise always ends in success — done when
    the launch ended or there is nothing to grow; an error is logged and it looks again — so it
    never keeps the next attempt from starting.
    """

    @_task(task.sensor, task_id="watch_growth", poke_interval=GROW_POKE_SECONDS, mode="reschedule",
           timeout=timedelta(days=365).total_seconds(), soft_fail=True)
    def watch_growth(spec: dict) -> bool:
        try:
            job_ = _job(spec)
            plan_ = plan(job_)  # AirflowSkipException when attempt k is not needed
        except AirflowSkipException:
            raise
        except Exception as exc:  # noqa: BLE001 - nothing to watch that can be planned: done, not failed
            _say(f"[sat] elastic: not watching attempt {k} for capacity ({type(exc).__name__}: {exc})")
            return True
        if plan_.failovers == 0:
            _say(f"[sat] elastic: attempt {k} is not a failover: it runs on every node, nothing to grow back")
            return True
        if _launch_ended(k):
            return True
        try:  # not `_run`: a look that failed is no task failure of the run
            return steps.watch_growth(job_, _run_id(), plan_, log=_say)
        except Exception as exc:  # noqa: BLE001 - a watch that cannot look now looks again; it never fails the run
            _say(f"[sat] elastic: could not look for capacity to grow back ({type(exc).__name__}: {exc})")
            return False

    return watch_growth(spec)


def _launch_ended(k: int) -> bool:
    """Whether attempt k's rank-0 `launch` task has ended (then there is nothing to grow back)."""
    context = get_current_context()
    return ended_task_state(context["ti"], context["run_id"], f"{attempt_group_id(k)}.launch") is not None
