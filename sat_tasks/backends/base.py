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
    upload_outputs(run)             -> the training outputs into <results>/output/
    job_log(run)                    -> the run's job log as a local file, for upload
    cleanup_run(run)                -> what was deleted (the run's volume, ...)

`Backend` is an abstract class: a subclass missing one of those methods cannot be instantiated.
The features a backend may offer are small optional interfaces, each declared by a flag of its
`capabilities` and checked against it when the backend is instantiated (as torch DCP's
`StorageWriter` and its optional mixins):

    WatchesGrowth (grow_watch)  watch_growth(run, plan): an elastic attempt on fewer nodes asked to
                                stop and grow back (ADR 0029)
    KeepsWarm (warm_pool)       keep_warm(run, state) holds what the run leaves warm, release_warm(state)
                                lets it go (ADR 0015); stage(run, reuse=claim) reuses a warm run's data
    LiveLogSource (live_log)    live_log(run, stored, cursor): the running attempt's lines the job log
                                lacks yet (the job page, ADR 0026)
    ReleasesNodes (node_release) release_node(node) after a person lifts a node's quarantine (ADR 0004)
    ProbesNodes (node_probe)    probe_node(run, node): the health check of a suspect node (ADR 0004)
    QueuesOnSlots (slot_board)  slot_waits(workspace): why requests wait on its slot boards;
                                concurrent_attempts(setting): what Airflow's limits are sized from (45.5)

Callers outside `backends/` go through `watch_growth_of`, `release_warm_on`, `live_log_of`,
`release_node_on`, `node_probe_of`, `slot_waits_of` and `concurrent_attempts_of`, which answer
for a backend without the interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Decision, Log, Plan
from sat_tasks.core.health_check import ProbeResult
from sat_tasks.core.live_log import LiveCursor, LiveLog
from sat_tasks.core.warm_pool import Claim, WarmState
from sat_tasks.core.workspaces import Admission
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
            back itself (the local runner, ADR 0029). True exactly when the backend is a `WatchesGrowth`.
        warm_pool: a finished run can be kept warm (ADR 0015): the backend is a `KeepsWarm`.
        live_log: the running attempt's lines come from outside the job log (the backend is a `LiveLogSource`);
            False: the job log grows in place while the attempt runs.
        node_release: lifting a node's quarantine undoes something the backend did to the node (Kubernetes:
            uncordon); the backend is a `ReleasesNodes`. False: placement reads the ledger, nothing to undo.
        node_probe: the node of a HARDWARE or SUSPECT_NODE verdict gets a health check before the ledger
            counts it (ADR 0004, `core.health_check`); the backend is a `ProbesNodes`.
        slot_board: the backend queues attempts for node slots on boards of its own (the local pool's and
            each workspace's), which say why a run waits and how many attempts run at once, so `sat up`
            sizes Airflow's limits from them (issue 45.5); the backend is a `QueuesOnSlots`.

    Each optional flag and its interface are checked against each other when the backend is instantiated
    (`Backend.__new__`, beside the abstract methods' check): a flag without its methods, or methods without
    their flag, is a TypeError. Not at class definition: a class whose `__init_subclass__` raises is left
    half-made in its ABCs' subclass lists, where it answers `issubclass` with its base's cache.
    """

    pulls_images: bool
    watches_stop_request: bool
    injects_faults: bool = False
    workspace_pool: bool = False
    grow_watch: bool = False
    warm_pool: bool = False
    live_log: bool = False
    node_release: bool = False
    node_probe: bool = False
    slot_board: bool = False


class Backend(ABC):
    """Where `launch` runs the training. See the module doc for the call order.

    An implementation subclasses this class and implements every abstract method (a subclass that
    misses one cannot be instantiated), plus the optional interfaces below for the features it offers,
    each declared in its `capabilities` (checked when it is instantiated).

    Attributes:
        kind: the name it is installed under (its `sat.backends` entry point; the spec's
            `backend` value it serves).
        capabilities: what it does differently (`BackendCapabilities`).
        task_modules (optional): the modules its tasks import when they run (its launch operator's), which
            the scheduler and the DAG processor import before they fork (`sat_tasks.service.preload`).
    """

    kind: str
    capabilities: BackendCapabilities

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        declared = getattr(cls, "capabilities", None)
        for flag, interface in OPTIONAL_INTERFACES.items():
            if isinstance(declared, BackendCapabilities) and getattr(declared, flag) != issubclass(cls, interface):
                raise TypeError(f"backend {cls.__name__}: capabilities.{flag}={getattr(declared, flag)} but it "
                                f"{'does not subclass' if getattr(declared, flag) else 'subclasses'} "
                                f"{interface.__name__} ({', '.join(_methods(interface))})")
        return super().__new__(cls)  # object.__new__: a missing abstract method is a TypeError here

    @property
    def pulls_images(self) -> bool:
        """Shorthand for `capabilities.pulls_images` (the image check)."""
        return self.capabilities.pulls_images

    @property
    def watches_stop_request(self) -> bool:
        """Shorthand for `capabilities.watches_stop_request` (Stop)."""
        return self.capabilities.watches_stop_request

    @abstractmethod
    def stage(self, run: JobRun, log: Log, reuse: Claim | None = None) -> dict[str, Any]:
        """Copy the script and data from Object Storage to where the attempts read them.

        `reuse`: what the job's warm state hands this run; objects whose ETag did not change
        are not downloaded again where the backend can reach the warm run's files.
        """

    @abstractmethod
    def check_staged_data(self, run: JobRun, staged: dict[str, Any] | None, log: Log) -> DataCheck:
        """Run (or read the result of) the job's expectation suite on the staged data."""

    @abstractmethod
    def launch_operators(self, *, attempt: int, previous_decide_task_id: str | None,
                         job: TrainingJob | None) -> list[BaseOperator]:
        """The Airflow task(s) that run attempt `attempt` (call inside the attempt's TaskGroup).

        `job` is None for the generic DAG (the spec arrives with the run). Each task reads the
        validated spec and the previous decision from XCom, plans the attempt
        (`core.policy.plan_attempt`; skipped when not needed), records Running, runs it and
        stores what `read_attempt_record` returns.
        """

    @abstractmethod
    def read_attempt_record(self, run: JobRun, attempt: int, log: Log) -> AttemptRecord | None:
        """The record of attempt `attempt`, stored at `run.attempt_uri`; None when it never launched."""

    @abstractmethod
    def cleanup_attempt(self, run: JobRun, attempt: int, log: Log) -> list[str]:
        """Delete what the attempt left running or kept for classify; `kind/name` of each object."""

    @abstractmethod
    def capacity(self, run: JobRun, decision: Decision, log: Log) -> Capacity:
        """Spot: whether the next attempt (after `decision`) fits now."""

    @abstractmethod
    def upload_outputs(self, run: JobRun, log: Log) -> dict[str, Any]:
        """Upload the training outputs to `run.output_uri`; the transfer report."""

    @abstractmethod
    def job_log(self, run: JobRun, log: Log) -> Path | None:
        """The run's job log (all attempts) as a local file, None when there is none yet."""

    @abstractmethod
    def cleanup_run(self, run: JobRun, log: Log, *, keep_warm: bool = False) -> list[str]:
        """Delete what the run kept between attempts (volume, staging pods); `kind/name` of each.

        `keep_warm`: the warm pool keeps this run (decided once, by `pipeline.warm_pool`): spare
        what `keep_warm` will hold (the Kubernetes run's claim).
        """

    @abstractmethod
    def workspace_queue_problem(self, job: TrainingJob, *, spec_with_run: bool, log: Log) -> str | None:
        """Why nothing would queue this workspace job for its nodes (refused at validation), or None.

        `spec_with_run`: the generic DAG's run (no workspace pool was set when its DAG was parsed).
        """


# ---- optional interfaces: a backend subclasses the ones it offers and declares each in its capabilities --------
class WatchesGrowth(ABC):
    """`capabilities.grow_watch`: an elastic attempt on fewer nodes is watched from outside the launch (ADR 0029)."""

    @abstractmethod
    def watch_growth(self, run: JobRun, plan: Plan, log: Log) -> bool:
        """Ask an elastic attempt on fewer nodes to stop and grow back once capacity is back.

        True when there is nothing more to watch (it was asked, runs on all nodes, or ended).
        """


class KeepsWarm(ABC):
    """`capabilities.warm_pool`: what a finished run leaves can be held for the job's next run (ADR 0015)."""

    @abstractmethod
    def keep_warm(self, run: JobRun, state: WarmState, log: Log) -> WarmState:
        """Hold what the finished run leaves warm (staged directory, placeholder pods); the completed state."""

    @abstractmethod
    def release_warm(self, state: WarmState, log: Log) -> list[str]:
        """Let a warm state go: delete its staged directory or placeholder pods; `kind/name` of each."""


class LiveLogSource(ABC):
    """`capabilities.live_log`: the running attempt's lines live outside the job log until the attempt ends."""

    @abstractmethod
    def live_log(self, run: JobRun, *, stored: Collection[int], cursor: LiveCursor | None, limit: int,
                 lines: int) -> LiveLog | None:
        """The running attempt's lines after `cursor` where the attempt writes them (`core.live_log`, ADR 0026):
        at most `limit` bytes, from its last `lines` lines on a first read. `stored`: the attempts whose sections
        are stored. None: nothing to add (no attempt runs)."""


class ReleasesNodes(ABC):
    """`capabilities.node_release`: the backend acts on a quarantined node itself, and undoes it on release."""

    @abstractmethod
    def release_node(self, node: str, log: Log) -> bool:
        """A person lifted `node`'s quarantine (node health ledger, ADR 0004): undo what this backend did to
        the node itself (Kubernetes: uncordon a node SAT cordoned); True when it changed something."""


class ProbesNodes(ABC):
    """`capabilities.node_probe`: a short health check on the node of a HARDWARE or SUSPECT_NODE verdict."""

    @abstractmethod
    def probe_node(self, run: JobRun, node: str, log: Log) -> ProbeResult:
        """Probe `node`, where `run`'s attempt failed (`io.node_probe`'s checks, on the node); never raises for a
        check that cannot run (it is SKIPPED with why), only when the probe itself could not be started."""


class QueuesOnSlots(ABC):
    """`capabilities.slot_board`: attempts queue for node slots on the backend's own boards (issue 45.5)."""

    @abstractmethod
    def slot_waits(self, workspace: str | None) -> dict[tuple[str, str], Admission]:
        """`(job, run_id)` -> the board's answer for each request waiting on the shared pool's board (`workspace`
        None) or on workspace `workspace`'s; the reason says what it waits for, without a prefix of the board's."""

    @abstractmethod
    def concurrent_attempts(self, setting: Callable[[str], str]) -> int:
        """How many attempts can run at once under the `[sat]` settings `setting(key)` reads (the components'
        environment, as `sat up` hands it to them): what Airflow's limits are sized from."""


# capability flag -> the interface a backend declaring it must subclass
OPTIONAL_INTERFACES: dict[str, type[ABC]] = {
    "grow_watch": WatchesGrowth, "warm_pool": KeepsWarm, "live_log": LiveLogSource, "node_release": ReleasesNodes,
    "node_probe": ProbesNodes, "slot_board": QueuesOnSlots,
}


def _methods(interface: type) -> list[str]:
    return sorted(getattr(interface, "__abstractmethods__", ()))


def watch_growth_of(backend: Backend, run: JobRun, plan: Plan, log: Log) -> bool:
    """The backend's growth watch; True (nothing to watch) for a backend that watches from inside its launch."""
    return backend.watch_growth(run, plan, log) if isinstance(backend, WatchesGrowth) else True


def live_log_of(backend: Backend, run: JobRun, *, stored: Collection[int], cursor: LiveCursor | None, limit: int,
             lines: int) -> LiveLog | None:
    """The backend's live lines; None for a backend whose job log grows in place."""
    if not isinstance(backend, LiveLogSource):
        return None
    return backend.live_log(run, stored=stored, cursor=cursor, limit=limit, lines=lines)


def release_node_on(backend: Backend, node: str, log: Log) -> bool:
    """Undo what the backend did to a released node; False for a backend that never touches nodes."""
    return backend.release_node(node, log) if isinstance(backend, ReleasesNodes) else False


def node_probe_of(backend: Backend, run: JobRun, log: Log) -> Callable[[str], ProbeResult] | None:
    """The backend's health check of a node for `run` (what `io.node_ledger.diagnose_attempt` takes), None where
    the backend has none."""
    if not isinstance(backend, ProbesNodes):
        return None
    return lambda node: backend.probe_node(run, node, log)


def slot_waits_of(backend: Backend, workspace: str | None) -> dict[tuple[str, str], Admission]:
    """The backend's board answers for the requests waiting on it; none where the backend has no slot board."""
    return backend.slot_waits(workspace) if isinstance(backend, QueuesOnSlots) else {}


def concurrent_attempts_of(backend: Backend, setting: Callable[[str], str]) -> int | None:
    """How many attempts the backend runs at once under `setting`; None where it keeps no slot board (Airflow's
    limits are then the operator's)."""
    return backend.concurrent_attempts(setting) if isinstance(backend, QueuesOnSlots) else None


def release_warm_on(backend: Backend, state: WarmState, log: Log) -> list[str]:
    """Let a warm state go through its backend; nothing to release where the backend keeps nothing warm."""
    return backend.release_warm(state, log) if isinstance(backend, KeepsWarm) else []
