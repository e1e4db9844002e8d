"""The local backend (the embedded default, what `make demo` runs): attempts on this host, in the job's image or not.

Each attempt runs in the job's container image (podman, `container_run`; `[sat] local_runtime`,
`auto` under `make up`) or as processes in SAT's own environment (host mode: `sat run`, `make
demo`, the unit tests), ADR 0035. A small pool of named local "nodes" (`[sat] local_nodes`) stands in for machines; each has
a kernel log where injected hardware faults leave Xid lines. The run's files live in the
worker's work directory (`JobRun.run_dir`), which every task of the run shares: the
local backend is one host by definition. `runner.LocalAttempt` runs one attempt,
`launch.launch_attempt` prepares and records it, `operator.LocalLaunchOperator` is its
`launch` task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.base import (
    Backend,
    BackendCapabilities,
    Capacity,
    Claim,
    DataCheck,
    KeepsWarm,
    ProbesNodes,
    QueuesOnSlots,
    WarmState,
)
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Action, Decision, Log
from sat_tasks.core.health_check import ProbeResult
from sat_tasks.core.workspaces import Admission
from sat_tasks.io import object_storage as storage
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import BaseOperator

# A `launch` try that died before SAT's code ran (its worker lost, a metadata DB error at start) is
# retried this soon (5-10 s with the DAG's backoff): a retried launch, not a failed job (issue 31.3).
LAUNCH_RETRY_DELAY = timedelta(seconds=5)


class LocalBackend(Backend, KeepsWarm, ProbesNodes, QueuesOnSlots):
    """The Backend protocol on this host (see `sat_tasks.backends.base` for the call order)."""

    kind = "local"
    capabilities = BackendCapabilities(
        # no registry check or pull without a login: a container attempt uses the host's image store (ADR 0035),
        # a host attempt no image; with image.registry_conn_id the check runs and the container runtime pulls
        pulls_images=False,
        watches_stop_request=True,  # the runner polls the stop request and passes it on as SIGTERM
        injects_faults=True,  # the runner injects the spec's faults (tests, the demo)
        workspace_pool=False,  # the slot board (`io.workspaces.SlotBoard`) queues workspace jobs
        # grow_watch False: the runner watches for capacity to grow back itself while the attempt runs (ADR 0029)
        warm_pool=True,  # a finished run's staged directory and standby interpreter (ADR 0015)
        # live_log False: the job log grows in place; node_release False: placement reads the ledger at each
        # attempt, nothing is done to the node itself
        node_probe=True,  # the node's fake device where a fault left one (the run's node directory), else this host's
        slot_board=True,  # the shared pool's and the workspaces' boards (`pool.PoolBoard`, `io.workspaces.SlotBoard`)
    )
    task_modules = ("sat_tasks.backends.local.operator", "sat_tasks.backends.local.launch",
                    "sat_tasks.backends.local.workspace", "sat_tasks.backends.local.warm")

    # ---- before training -----------------------------------------------------------------------
    def stage(self, run: JobRun, log: Log, reuse: Claim | None = None) -> dict[str, Any]:
        from sat_tasks.io.staging import stage_job_files

        reuse_dir = reuse.data_dir if reuse is not None and reuse.data_dir and Path(reuse.data_dir).is_dir() else None
        staged = stage_job_files(run.hook(), data_source=run.job.data.source, data_dest=run.data_dir,
                                 code_dest=run.code_dir, script_url=run.job.storage.script_url, log=log,
                                 reuse_dir=reuse_dir, reuse_objects=reuse.objects if reuse_dir else None,
                                 current_objects=reuse.current if reuse_dir else None)
        if reuse is not None and reuse.state.data_dir:  # the warm run's vendored engine, beside its data
            from ckpt_engine.vendor import engine_hash, lay_out_vendor_dir

            how = lay_out_vendor_dir(run.vendor_dir, reuse_from=Path(reuse.state.data_dir).parent / run.vendor_dir.name)
            staged["engine"] = {"reused": how == "linked", "hash": engine_hash()}
        return staged

    def check_staged_data(self, run: JobRun, staged: dict[str, Any] | None, log: Log) -> DataCheck:
        from sat_tasks.io.validation import DataValidationError, validate_dataset

        try:
            report = validate_dataset(run.data_dir, run.job.data.expectation_suite, log=log)
        except DataValidationError as exc:
            return DataCheck(False, [f"data validation could not run: {exc}"])
        return DataCheck(report.success, report.summary_lines(), report.to_dict())

    # ---- attempts ------------------------------------------------------------------------------
    def launch_operators(self, *, attempt: int, previous_decide_task_id: str | None,
                         job: TrainingJob | None) -> list[BaseOperator]:
        from sat_tasks.backends.local.operator import LocalLaunchOperator

        return [LocalLaunchOperator(task_id="launch", attempt=attempt, previous_decide_task_id=previous_decide_task_id,
                                    retry_delay=LAUNCH_RETRY_DELAY)]

    def read_attempt_record(self, run: JobRun, attempt: int, log: Log) -> AttemptRecord | None:
        return run.load_record(attempt)  # `launch` stored it when the attempt ended

    def cleanup_attempt(self, run: JobRun, attempt: int, log: Log) -> list[str]:
        """The runner ends every process of an attempt before `launch` returns; a `launch` whose process
        died (no retry left) may have left its training running: it is stopped here."""
        from sat_tasks.backends.local.launch import stop_left_running

        left = stop_left_running(run, attempt, log)
        return [f"{left} training process(es) of attempt {attempt} left running"] if left else []

    def capacity(self, run: JobRun, decision: Decision, log: Log) -> Capacity:
        """The pool's (or the job's workspace's) nodes not excluded; none until `capacity_at` (the demo's Spot market)."""
        from sat_tasks.backends.local.workspace import node_pool

        free = [n for n in node_pool(run.job.workspace) if n not in decision.exclude_nodes]
        if decision.action is Action.RESUME and time.time() < (decision.capacity_at or 0):
            free = []
        return Capacity(bool(free), f"{len(free)} node(s) available in the local pool")

    # ---- after training ------------------------------------------------------------------------
    def upload_outputs(self, run: JobRun, log: Log) -> dict[str, Any]:
        return storage.upload_dir(run.hook(), run.output_dir, run.output_uri, log=log).to_dict()

    def job_log(self, run: JobRun, log: Log) -> Path | None:
        return run.job_log if run.job_log.exists() else None

    def cleanup_run(self, run: JobRun, log: Log, *, keep_warm: bool = False) -> list[str]:
        from sat_tasks.backends.local.warm import release_standby

        # the run's failover standby interpreter (ADR 0031) stops; the work directory is this host's disk: kept,
        # like a node's local disk
        return release_standby(run)

    def probe_node(self, run: JobRun, node: str, log: Log) -> ProbeResult:
        """The node's health check (ADR 0004): its fake device's counters where an injected fault wrote them under
        the run's node directory, else this host's devices (NVML, DCGM's quick diagnostic, a small kernel)."""
        from sat_tasks.io.node_probe import local_probe

        return local_probe(run.node_dir(node).parent)(node)

    # ---- slot boards (issue 45.5) -------------------------------------------------------------
    def slot_waits(self, workspace: str | None) -> dict[tuple[str, str], Admission]:
        from sat_tasks.backends.local.pool import POOL_WAIT, pool_waits, workspace_waits

        found = pool_waits() if workspace is None else workspace_waits(workspace)
        return {key: replace(answer, reason=answer.reason.removeprefix(POOL_WAIT)) for key, answer in found.items()}

    def concurrent_attempts(self, setting: Callable[[str], str]) -> int:
        from sat_tasks.backends.local.pool import concurrent_attempts

        return concurrent_attempts(setting)

    # ---- warm pool (ADR 0015) ------------------------------------------------------------------
    def keep_warm(self, run: JobRun, state: WarmState, log: Log) -> WarmState:
        from sat_tasks.backends.local.warm import keep_warm

        return keep_warm(run, state, log)

    def release_warm(self, state: WarmState, log: Log) -> list[str]:
        from sat_tasks.backends.local.warm import release_warm

        return release_warm(state, log)

    def workspace_queue_problem(self, job: TrainingJob, *, spec_with_run: bool, log: Log) -> str | None:
        """The local slot board queues every workspace job, whichever DAG runs it."""
        return None


BACKEND = LocalBackend()
__all__ = ["BACKEND", "LocalBackend"]
