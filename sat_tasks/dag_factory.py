"""Build the Training Job DAG: validate -> image -> stage -> validate data -> unrolled attempts -> upload -> finalize.

Only wiring lives here; every task body is a function of `sat_tasks.pipeline`. Heavy
imports happen inside task bodies, so building a DAG is cheap (files are re-parsed often).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG, Asset, Param, TaskGroup, TriggerRule, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from sat_tasks import pipeline
from sat_tasks.spec import Backend, TrainingJob

log = logging.getLogger("sat.task")
START_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)
GENERIC_DAG_ID = "sat_training_job"
GENERIC_MAX_ATTEMPTS = 6  # 1 + max(3 failovers, 5 Spot resumes)

DEFAULT_ARGS = {
    "owner": "sat",
    "retries": 0,
    "retry_delay": timedelta(seconds=30),
}


def _say(message: str) -> None:
    log.info("%s", message)


def _run(fn, *args, **kwargs):
    """Call a pipeline function, turning its stop/skip signals into Airflow's."""
    try:
        return fn(*args, log=_say, **kwargs)
    except pipeline.JobStopped as exc:
        raise AirflowFailException(str(exc)) from None
    except pipeline.NotApplicable as exc:
        raise AirflowSkipException(str(exc)) from None


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
        max_active_runs=1 if job else 16,
        default_args=DEFAULT_ARGS,
        tags=tags,
        params=params or {},
        doc_md=doc_md or f"Training Job `{dag_id}`" + (f" from `{spec_path}`" if spec_path else ""),
        render_template_as_native_obj=False,
    ) as dag:
        if fileloc:
            dag.fileloc = fileloc

        @task(task_id="validate_spec")
        def validate_spec() -> dict:
            context = get_current_context()
            spec = baked if baked is not None else spec_from_params(dict(context["params"]))
            return _run(pipeline.validate_spec, spec, None, context["run_id"])

        @task(task_id="check_image", retries=2)
        def check_image(spec: dict) -> dict:
            from airflow.sdk import BaseHook

            return _run(pipeline.check_image, _job(spec), _run_id(), get_connection=BaseHook.get_connection)

        @task(task_id="stage_data", retries=2)
        def stage_data(spec: dict) -> dict:
            return _run(pipeline.stage_data, _job(spec), _run_id())

        @task(task_id="validate_data")
        def validate_data(spec: dict, staged: dict) -> dict:
            return _run(pipeline.validate_data, _job(spec), _run_id(), staged)

        spec = validate_spec()
        staged = stage_data(spec)
        check_image(spec) >> staged
        gate = validate_data(spec, staged)

        previous_decide: str | None = None
        upstream = gate
        decide_ids = []
        for k in range(1, attempts + 1):
            with TaskGroup(group_id=f"attempt_{k}", tooltip=f"attempt {k}: launch, classify, decide") as group:
                nodes = _attempt_group(spec, k, previous_decide, spot_waits, job)
            for node in nodes[:-1]:
                upstream >> node
            upstream = group
            previous_decide = f"attempt_{k}.decide"
            decide_ids.append(previous_decide)

        @task(task_id="upload_results", trigger_rule=TriggerRule.ALL_DONE, retries=2)
        def upload_results(spec: dict | None) -> dict:
            decisions = [_pull(tid) for tid in decide_ids]
            return _run(pipeline.upload_results, _job(spec), _run_id(), decisions)

        @task(task_id="finalize", trigger_rule=TriggerRule.ALL_DONE, retries=1)
        def finalize() -> dict:
            spec_now = _pull("validate_spec")
            try:
                return pipeline.finalize(
                    TrainingJob.model_validate(spec_now) if spec_now else None, _run_id(), log=_say
                )
            except pipeline.JobStopped as exc:
                raise AirflowFailException(str(exc)) from None

        upload = upload_results(spec)
        upstream >> upload >> finalize()
    return dag


def _attempt_group(spec, k: int, previous_decide: str | None, spot_waits: bool, job: TrainingJob | None):
    """launch -> classify -> decide for attempt k (plus a capacity wait for Spot resumes)."""

    def previous() -> dict | None:
        return _pull(previous_decide) if previous_decide else None

    def plan(job_: TrainingJob) -> dict:
        try:
            return pipeline.plan_attempt(job_, k, previous())
        except pipeline.NotApplicable as exc:
            raise AirflowSkipException(str(exc)) from None

    first = []
    if k > 1 and spot_waits:
        poll = job.spot.poll_seconds if job else 30
        timeout = job.spot.max_wait_seconds if job else 24 * 3600

        @task.sensor(task_id="wait_for_capacity", poke_interval=poll, timeout=timeout, mode="reschedule")
        def wait_for_capacity(spec: dict) -> bool:
            prev = previous()
            if not prev or prev.get("action") not in (pipeline.Action.RESUME, pipeline.Action.FAILOVER):
                raise AirflowSkipException(f"attempt {k} is not needed")
            if prev["action"] != pipeline.Action.RESUME:
                return True
            return _run(pipeline.capacity_available, _job(spec), _run_id(), prev)

        first.append(wait_for_capacity(spec))

    backend = _backend_of(job)
    if backend is Backend.KUBERNETES:
        from sat_tasks import k8s_launch  # the provider's operator: only for kubernetes DAGs

        launched = k8s_launch.make_launch_operator(attempt=k, previous_decide_task_id=previous_decide, job=job)
        launch_ops = launched if isinstance(launched, list) else [launched]
    else:

        @task(task_id="launch")
        def launch(spec: dict) -> dict:
            job_ = _job(spec)
            return _run(pipeline.launch_local, job_, _run_id(), plan(job_))

        launch_ops = [launch(spec)]

    @task(task_id="classify", trigger_rule=TriggerRule.ALL_DONE, retries=1)
    def classify(spec: dict | None) -> dict:
        job_ = _job(spec)
        plan(job_)
        if job_.backend is Backend.KUBERNETES:
            from sat_tasks import k8s_launch

            if k8s_launch.read_attempt_record(job_, _run_id(), k, log=_say) is None:
                raise AirflowSkipException(f"attempt {k} did not launch")
        return _run(pipeline.classify_attempt, job_, _run_id(), k)

    @task(task_id="decide")
    def decide(spec: dict, verdict: dict) -> dict:
        job_ = _job(spec)
        return _run(pipeline.decide_next, job_, _run_id(), plan(job_), verdict)

    verdict = classify(spec)
    for node in first:
        for op in launch_ops:
            node >> op
    for op in launch_ops:
        op >> verdict
    decided = decide(spec, verdict)
    if backend is Backend.KUBERNETES:

        @task(task_id="cleanup_pods", trigger_rule=TriggerRule.ALL_DONE)
        def cleanup_pods(spec: dict | None) -> list[str]:
            from sat_tasks import k8s_launch

            return k8s_launch.cleanup_attempt_pods(_job(spec), _run_id(), k)

        verdict >> cleanup_pods(spec)
    return [*(first or launch_ops), decided]


def _backend_of(job: TrainingJob | None) -> Backend:
    """The backend a DAG is built for: the spec's, else `[sat] backend` (read at parse time)."""
    from sat_tasks.paths import sat_setting

    if job is not None and job.backend is not None:
        return job.backend
    return Backend(sat_setting("backend"))


# ---- the generic DAG's form ----------------------------------------------------------------------
def generic_params() -> dict[str, Param]:
    """The "Create Training Job" form: sections, enums, descriptions and defaults."""
    job_section, compute, image, data, advanced = "Job", "Compute", "Container image", "Data and results", "Advanced"
    return {
        "name": Param("my-training-job", type="string", minLength=3, maxLength=63,
                      pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", section=job_section,
                      description="3-63 chars: lowercase letters, digits, '-', '.'; alphanumeric at both ends"),
        "learning_type": Param("on-demand", type="string", enum=["on-demand", "spot"], section=job_section,
                               description="on-demand, or spot (pre-emptible; paused and resumed from checkpoints)"),
        "framework": Param("pytorch", type="string", enum=["pytorch", "deepspeed"], section=job_section,
                           description="training framework of the command"),
        "job_failover": Param(True, type="boolean", section=job_section,
                              description="fail over to another node on a hardware fault (not with spot)"),
        "command": Param("python train.py", type="string", minLength=3, maxLength=1024, section=job_section,
                         description="the training command (runs in the staged script directory)"),
        "nodes": Param(1, type="integer", minimum=1, maximum=64, section=compute,
                       description="number of nodes; distributed from 2"),
        "server_type": Param("cpu", type="string", enum=["cpu", "g2", "g3"], section=compute,
                             description="cpu, g2 (8x H100) or g3 (8x B300)"),
        "gpus_per_node": Param(0, type="integer", minimum=0, maximum=8, section=compute,
                               description="GPUs per node"),
        "memory": Param("8Gi", type="string", section=compute, description="memory per node (Kubernetes quantity)"),
        "shared_memory": Param("1Gi", type="string", section=compute, description="size of /dev/shm"),
        "image_url": Param("registry.sat.local/sat/training:0.1.0", type="string", section=image,
                           description="image reference"),
        "registry_conn_id": Param(None, type=["null", "string"], section=image,
                                  description="Airflow connection with the registry credentials"),
        "script_url": Param(None, type=["null", "string"], section=data,
                            description="s3:// URI of the training script"),
        "data_source": Param("s3://sat-demo/datasets/tiny-corpus/", type="string", section=data,
                             description="s3:// prefix of the training data"),
        "results_destination": Param("s3://sat-demo/results/", type="string", section=data,
                                     description="s3:// prefix for results"),
        "file_storage_mount": Param(None, type=["null", "string"], section=data,
                                    description="absolute path of a File Storage mount"),
        "tags": Param({}, type="object", section=advanced, description="at most 50 key/value pairs"),
        "extra": Param({}, type="object", section=advanced,
                       description="more spec fields as JSON: spot, env, faults (local backend), backend, ..."),
    }


def spec_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """Turn the form's flat values into a spec mapping (validated later by the spec model)."""
    spec: dict[str, Any] = {
        "name": params.get("name"),
        "learning_type": params.get("learning_type"),
        "framework": params.get("framework"),
        "job_failover": params.get("job_failover"),
        "command": params.get("command"),
        "nodes": params.get("nodes"),
        "resources": {
            "server_type": params.get("server_type"),
            "gpus_per_node": params.get("gpus_per_node"),
            "memory": params.get("memory"),
            "shared_memory": params.get("shared_memory"),
        },
        "image": {"url": params.get("image_url"), "registry_conn_id": params.get("registry_conn_id")},
        "storage": {"script_url": params.get("script_url"), "file_storage_mount": params.get("file_storage_mount")},
        "data": {"source": params.get("data_source")},
        "results": {"destination": params.get("results_destination")},
        "tags": params.get("tags") or {},
    }
    if spec["learning_type"] == "spot" and "job_failover" not in (params.get("extra") or {}):
        spec["job_failover"] = False
    for key, value in (params.get("extra") or {}).items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def params_from_spec(job: TrainingJob) -> dict[str, Any]:
    """The form values that reproduce `job` (used by `sat run` with the generic DAG)."""
    data = job.to_dict()
    extra = {k: data[k] for k in ("spot", "env", "faults", "backend", "heartbeat_timeout_seconds", "max_failovers",
                                  "schedule") if data.get(k) not in (None, [], {})}
    extra["resources"] = {"cpu": data["resources"]["cpu"]}
    extra["image"] = {"insecure": data["image"]["insecure"]}
    if data["data"].get("expectation_suite"):
        extra["data"] = {"expectation_suite": data["data"]["expectation_suite"]}
    return {
        "name": job.name,
        "learning_type": job.learning_type.value,
        "framework": job.framework.value,
        "job_failover": job.job_failover,
        "command": job.command,
        "nodes": job.nodes,
        "server_type": job.resources.server_type,
        "gpus_per_node": job.resources.gpus_per_node,
        "memory": job.resources.memory,
        "shared_memory": job.resources.shared_memory,
        "image_url": job.image.url,
        "registry_conn_id": job.image.registry_conn_id,
        "script_url": job.storage.script_url,
        "data_source": job.data.source,
        "results_destination": job.results.destination,
        "file_storage_mount": job.storage.file_storage_mount,
        "tags": dict(job.tags),
        "extra": extra,
    }
