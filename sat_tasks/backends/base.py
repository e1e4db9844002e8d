"""The Backend protocol: everything a Training Job's tasks need from the place where training runs.

A backend is a package (`sat_tasks.backends.local`, `...kubernetes`, or another
distribution's) whose `BACKEND` has these methods and declares its `capabilities`; a
`sat.backends` entry point names it and `sat_tasks.backends.get_backend(name)` finds it.
Code outside `backends/` calls only these and asks the capabilities, so it never asks
which backend it is on; `tests/sat_tasks/backends/test_conformance.py` holds every
backend to the same contract. Call order for one run:

    stage(run)                      -> staging report (XCom-sized)
    check_staged_data(run, staged)  -> DataCheck (the Great Expectations result)
    per attempt k:
        launch_operators(...)       -> the Airflow task(s) that run attempt k
        read_attempt_record(run, k) -> the AttemptRecord classify reads (None: never launched)
        cleanup_attempt(run, k)     -> what was deleted (the attempt's pods, ...)
        capacity(run, decision)     -> Spot: is there room for the next attempt?
        watch_growth(run, plan)     -> an elastic attempt on fewer nodes: asked to stop and grow back? (`grow_watch`)
    upload_outputs(run)             -> the training outputs into <results>/output/
    job_log(run)                    -> the run's job log as a local file, for upload
    live_log(run, stored, cursor)   -> the running attempt's lines the job log lacks yet (the job page, ADR 0026)
    cleanup_run(run)                -> what was deleted (the run's volume, ...)
    warm pool (ADR 0015): stage(run, reuse=claim) reuses a warm run's staged data where it can;
    keep_warm(run, state) holds what the run leaves warm, release_warm(state) lets it go
    node health ledger (ADR 0004): release_node(node) after a person lifts a node's quarantine
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.contracts import Decision, Log, Plan
from sat_tasks.core.live_log import LiveCursor, LiveLog
from sat_tasks.core.warm_pool import Claim, WarmState
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import BaseOperator



@dataclass(frozen=True)
class DataCheck:
    """The outcome of the data validation suite on the staged data."""

    success: bool
    summary_lines: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    """Whether a resumed attempt fits now, and a line saying why (for the task log)."""

    available: bool
    summary: str


# The prefix of a workspace's Airflow pool (`workspace_pool_name`).
WORKSPACE_POOL_PREFIX = "sat-workspace-"


def workspace_pool_name(workspace: str) -> str:
    """The Airflow pool `sat-workspace-<name>` (a slot per node) that can queue a workspace's `launch` tasks.

    The service keeps it in step with the workspace's definition (`sat_tasks.airflow.workspace_pools`);
    a backend whose `capabilities.workspace_pool` is True puts its rank-0 `launch` task in it.
    """
    return f"{WORKSPACE_POOL_PREFIX}{workspace}"


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend does differently, as it declares it: code outside `backends/` asks these, never its name.

    Attributes:
        pulls_images: attempts run in the job's container image. False (the command runs
            on the worker's host): the image check only parses the reference unless the job
            names a registry connection.
        watches_stop_request: a running attempt's launch task reads the run's stop request
            (`JobRun.stop_uri`) and stops the training itself (SIGTERM, a final checkpoint;
            `decide` then ends the job as Stopped). False: Stop ends the DAG run and the
            launch task's on_kill gives the training its grace period.
        injects_faults: the launcher injects a spec's `faults` (tests, the demo); the spec
            refuses faults on any other backend (`spec.model.FAULT_INJECTING_BACKENDS`, kept
            in step with this flag by the conformance suite).
        workspace_pool: a workspace job's rank-0 `launch` task queues in the workspace's
            Airflow pool (`workspace_pool_name`) where nothing else queues it (Kueue). False:
            the backend queues workspace jobs itself (the local slot board), never in the pool.
        grow_watch: an elastic job's failover attempts get a `watch_growth` sensor beside
            their launch (`Backend.watch_growth`): nothing of the backend runs beside an attempt
            while it runs (a deferred launch). False: the launcher watches for capacity to grow
            back itself (the local runner, ADR 0029).
    """

    pulls_images: bool
    watches_stop_request: bool
    injects_faults: bool = False
    workspace_pool: bool = False
    grow_watch: bool = False


@runtime_checkable
class Backend(Protocol):
    """Where `launch` runs the training. See the module doc for the call order.

    An implementation subclasses this class (for the two shorthands below) or defines them.

    Attributes:
        kind: the name it is installed under (its `sat.backends` entry point; the spec's
            `backend` value it serves).
        capabilities: what it does differently (`BackendCapabilities`).
        task_modules (optional): the modules its tasks import when they run (its launch operator's), which
            the scheduler and the DAG processor import before they fork (`sat_tasks.service.preload`).
    """

    kind: str
    capabilities: BackendCapabilities

    @property
    def pulls_images(self) -> bool:
        """Shorthand for `capabilities.pulls_images` (the image check)."""
        return self.capabilities.pulls_images

    @property
    def watches_stop_request(self) -> bool:
        """Shorthand for `capabilities.watches_stop_request` (Stop)."""
        return self.capabilities.watches_stop_request

    def stage(self, run: JobRun, log: Log, reuse: Claim | None = None) -> dict[str, Any]:
        """Copy the script and data from Object Storage to where the attempts read them.

        `reuse`: what the job's warm state hands this run; objects whose ETag did not change
        are not downloaded again where the backend can reach the warm run's files.
        """

    def check_staged_data(self, run: JobRun, staged: dict[str, Any] | None, log: Log) -> DataCheck:
        """Run (or read the result of) the job's expectation suite on the staged data."""

    def launch_operators(self, *, attempt: int, previous_decide_task_id: str | None,
                         job: TrainingJob | None) -> list[BaseOperator]:
        """The Airflow task(s) that run attempt `attempt` (call inside the attempt's TaskGroup).

        `job` is None for the generic DAG (the spec arrives with the run). Each task reads the
        validated spec and the previous decision from XCom, plans the attempt
        (`core.policy.plan_attempt`; skipped when not needed), records Running, runs it and
        stores what `read_attempt_record` returns.
        """

    def read_attempt_record(self, run: JobRun, attempt: int, log: Log) -> AttemptRecord | None:
        """The record of attempt `attempt`, stored at `run.attempt_uri`; None when it never launched."""

    def cleanup_attempt(self, run: JobRun, attempt: int, log: Log) -> list[str]:
        """Delete what the attempt left running or kept for classify; `kind/name` of each object."""

    def capacity(self, run: JobRun, decision: Decision, log: Log) -> Capacity:
        """Spot: whether the next attempt (after `decision`) fits now."""

    def watch_growth(self, run: JobRun, plan: Plan, log: Log) -> bool:
        """An elastic attempt on fewer nodes: ask it to stop and grow back once capacity is back (`grow_watch`).

        True when there is nothing more to watch (it was asked, runs on all nodes, or ended).
        """

    def upload_outputs(self, run: JobRun, log: Log) -> dict[str, Any]:
        """Upload the training outputs to `run.output_uri`; the transfer report."""

    def job_log(self, run: JobRun, log: Log) -> Path | None:
        """The run's job log (all attempts) as a local file, None when there is none yet."""

    def live_log(self, run: JobRun, *, stored: Collection[int], cursor: LiveCursor | None, limit: int,
                 lines: int) -> LiveLog | None:
        """The running attempt's lines after `cursor` where the attempt writes them, for a backend whose job log has
        them only once the attempt ends (`core.live_log`): at most `limit` bytes, from its last `lines` lines on a
        first read. `stored`: the attempts whose sections are stored. None: nothing to add (the job log grows in
        place, as the local backend's, or no attempt runs)."""

    def cleanup_run(self, run: JobRun, log: Log, *, keep_warm: bool = False) -> list[str]:
        """Delete what the run kept between attempts (volume, staging pods); `kind/name` of each.

        `keep_warm`: the warm pool keeps this run (decided once, by `pipeline.warm_pool`): spare
        what `keep_warm` will hold (the Kubernetes run's claim).
        """

    def keep_warm(self, run: JobRun, state: WarmState, log: Log) -> WarmState:
        """Hold what the finished run leaves warm (staged directory, placeholder pods); the completed state."""

    def release_warm(self, state: WarmState, log: Log) -> list[str]:
        """Let a warm state go: delete its staged directory or placeholder pods; `kind/name` of each."""

    def release_node(self, node: str, log: Log) -> bool:
        """A person lifted `node`'s quarantine (node health ledger, ADR 0004): undo what this backend did to
        the node itself (Kubernetes: uncordon a node SAT cordoned); True when it changed something."""

    def workspace_queue_problem(self, job: TrainingJob, *, spec_with_run: bool, log: Log) -> str | None:
        """Why nothing would queue this workspace job for its nodes (refused at validation), or None.

        `spec_with_run`: the generic DAG's run (no workspace pool was set when its DAG was parsed).
        """
