"""One attempt on the local backend: pick a node, record Running, lay out the vendor dir, run it, store its record."""

from __future__ import annotations

from ckpt_engine.contract import GRACE_ENV, RUN_ID_ENV
from ckpt_engine.vendor import write_vendor_dir
from sat_tasks.backends.local.runner import LocalAttempt, local_node_labels
from sat_tasks.backends.local.warm import warm_command
from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.contracts import Log, Plan
from sat_tasks.core.runtime_env import (
    LAUNCHER_GRACE_MARGIN_S,
    TrainingPaths,
    training_environment,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.scoped_credentials import training_credentials


def launch_attempt(run: JobRun, plan: Plan, log: Log) -> AttemptRecord:
    """Run one attempt on the first healthy node of the pool (or of its workspace, when free) and store its record."""
    with attempt_nodes(run, plan, log) as nodes:
        return _run_on(run, plan, nodes, log)


def _run_on(run: JobRun, plan: Plan, nodes: list[str], log: Log) -> AttemptRecord:
    job = run.job
    node = nodes[0]
    run.record_attempt_start(plan, log, where=", ".join(nodes))
    write_vendor_dir(run.vendor_dir)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    object_storage = run.hook().conn_config
    env = training_environment(
        job,
        TrainingPaths(str(run.data_dir), str(run.output_dir), str(run.code_dir), str(run.vendor_dir)),
        plan,
        node=node,
        mirror_url=run.mirror_uri,
        s3_endpoint_url=object_storage.get_service_endpoint_url("s3"),
        metrics_dir=str(run.metrics_dir),
        metrics_url=run.metrics_uri,
    )
    env[RUN_ID_ENV] = run.run_id
    # credentials scoped to this run (ADR 0020), for the training process only: never logged or recorded
    env.update(training_credentials(run, run.hook(), plan.attempt, log))
    runner = LocalAttempt(
        job=job.name,
        attempt=plan.attempt,
        node=node,
        command=warm_command(run, job.command),
        env=env,
        cwd=run.code_dir,
        output_dir=run.output_dir,
        job_log=run.job_log,
        node_dir=run.node_dir(node),
        image=job.image.url,
        faults=list(job.faults),
        heartbeat_timeout=job.heartbeat_timeout_seconds,
        startup_timeout=job.startup_timeout_seconds,
        # SIGKILL only after the engine's own grace period (GRACE_ENV) has run out
        grace_seconds=float(env[GRACE_ENV]) + LAUNCHER_GRACE_MARGIN_S,
        stop_requested=run.stop_request,
        node_labels=local_node_labels(node, job.workspace),
    )
    record = runner.run(log)
    run.store_record(record)
    return record

