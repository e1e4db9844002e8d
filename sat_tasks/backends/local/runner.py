"""The local backend's runner: run an attempt as a subprocess on a named local "node", watch it, record it.

It produces the same `AttemptRecord` as the Kubernetes path, so `classify` does not care
where an attempt ran. A small pool of named nodes stands in for machines; each node has a
kernel log (`nodes/<node>/kern.log`) where injected hardware faults leave Xid lines, as
a real GPU node's dmesg would.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_engine.contract import CONCURRENT_DIR, PROGRESS_FILE_ENV, PROGRESS_NAME
from sat_tasks.backends.local.container_run import (
    CONTAINER_HOME,
    AttemptNetwork,
    ContainerPlan,
    RunNetwork,
    network_name,
    oom_kills,
    podman_env,
    podman_run_args,
    remove_container,
)
from sat_tasks.backends.local.metrics_sidecar import (
    SIDECAR_ENV,
    STOP_TIMEOUT_S,
    MetricsSidecar,
)
from sat_tasks.core.attempt import AttemptRecord, progress_of_attempt
from sat_tasks.core.bounded import read_file
from sat_tasks.core.clock import now_utc
from sat_tasks.core.handoffs import Log
from sat_tasks.core.joblog import job_log_footer, job_log_header
from sat_tasks.core.policy import GrowBack
from sat_tasks.core.procs import carries, marked, state_of, terminate
from sat_tasks.core.runtime_env import POD_OUTPUT_DIR, process_environment
from sat_tasks.core.where_ran import host_status
from sat_tasks.errors import SatError
from sat_tasks.spec import Fault, FaultKind

LOG_TAIL_LINES = 200
PROGRESS_RELATIVE = Path(CONCURRENT_DIR) / PROGRESS_NAME
# Every process of an attempt inherits this variable, with a value of its own: how the
# runner finds the processes a launcher started in other sessions (torchrun's workers).
ATTEMPT_TAG_ENV = "SAT_ATTEMPT_TAG"
# The attempt's metrics sidecar carries the tag under this name (outside the attempt's own sweep).
SIDECAR_TAG_ENV = "SAT_SIDECAR_OF_ATTEMPT"


class NoHealthyNodeError(SatError, RuntimeError):
    """Every node of the local pool is excluded (they all failed earlier attempts): add nodes to `[sat] local_nodes`."""


def pick_node(pool: Sequence[str], exclude: Sequence[str]) -> str:
    """The first node of the pool that is not excluded."""
    for node in pool:
        if node not in exclude:
            return node
    raise NoHealthyNodeError(f"no healthy node left: pool {list(pool)}, excluded {list(exclude)}")


#: The label a node of a Training Workspace carries on Kubernetes (`KubernetesSettings.workspace_label`).
WORKSPACE_LABEL = "sat.ai/workspace"


def local_node_labels(node: str, workspace: str | None = None) -> dict[str, str]:
    """The labels of a local node, as a Kubernetes node's read: its hostname, and its workspace when it has one.

    A local node has no Spot or instance-type labels (a Spot notice is injected as a fault);
    these go into `AttemptRecord.node_labels_at_start` as the Kubernetes backend's do.
    """
    labels = {"kubernetes.io/hostname": node}
    if workspace:
        labels[WORKSPACE_LABEL] = workspace
    return labels


# What a faulted device shows its health check afterwards (`io.node_probe.FakeDeviceProbe`), by Xid: an
# uncorrectable memory error stays in the ECC counters, a GPU off the bus fails the device kernel. Any other
# Xid (13: a warp exception, the code's or the device's) leaves the counters clean. From NVIDIA's catalogue (ADR
# 0004's sources): 171 and 172 are uncorrectable DRAM and SRAM errors (beside Xid 48); 143 (GPU_INIT_ERROR, reset
# the GPU) is no memory error, but a device that failed to initialise fails its kernel. 94 (a contained ECC error)
# is left clean on purpose: the classifier relocates it, and a dirty counter would make the check decide HARDWARE.
_UNCORRECTABLE_ECC_XIDS = frozenset({48, 64, 95, 140, 171, 172})
_KERNEL_FAILS_XIDS = frozenset({79, 143})


def write_fake_device(node_dir: Path, xid: int) -> None:
    """The node's fake device after Xid `xid` (`<node dir>/gpu-counters.json`), as its health check reads it."""
    from sat_tasks.io.node_probe import FAKE_DEVICE_FILE

    device = {"index": 0, "ecc_uncorrected_volatile": 1 if xid in _UNCORRECTABLE_ECC_XIDS else 0,
              "kernel_ok": xid not in _KERNEL_FAILS_XIDS}
    (node_dir / FAKE_DEVICE_FILE).write_text(json.dumps({"devices": [device]}), encoding="utf-8")


def xid_line(node: str, xid: int, pid: int) -> str:
    """A kernel-log line like the NVIDIA driver writes for an Xid event."""
    messages = {
        79: "GPU has fallen off the bus.",
        48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
        74: "NVLink: fatal error detected on link 3",
        95: "Uncontained ECC error",
        13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    }
    stamp = f"[{time.monotonic():12.6f}]"
    return f"{stamp} NVRM: Xid (PCI:0000:3b:00): {xid}, pid={pid}, name=python, {messages.get(xid, 'GPU error')}"


@dataclass(frozen=True)
class PeerNode:
    """Another node of a multi-node attempt in container mode (ADR 0035): its own container on the run's network.

    `env` is the training environment of this node (the attempt's, with its node's name and rank); `container`
    the plan of its container (its own name, hostname and labels).
    """

    node: str
    container: ContainerPlan
    env: dict[str, str] = field(repr=False)


@dataclass
class LocalAttempt:
    """One attempt to run on the local backend.

    Call order: build it, then `run(log)` once; it returns the `AttemptRecord`.

    Hang detection has two phases, like a pod's startupProbe and livenessProbe: until the
    engine reports the attempt's first training step (its progress.json), only
    `startup_timeout` applies (0: none), however quiet loading a model or data set is;
    from then on, no progress (a new step or an output line) for `heartbeat_timeout` is a
    hang. A job whose script writes no progress (no checkpoint engine) needs
    `startup_timeout` 0: the heartbeat then counts output lines from the start.
    """

    job: str
    attempt: int
    node: str
    command: str
    # The training environment (the contract, the job's env, the Object Storage keys: never in a repr);
    # the process gets it and the few variables of this host `runtime_env.HOST_ENV_ALLOWED` names, no others.
    env: dict[str, str] = field(repr=False)
    cwd: Path
    output_dir: Path
    job_log: Path
    node_dir: Path
    image: str | None = None
    faults: list[Fault] = field(default_factory=list)
    heartbeat_timeout: float = 300.0
    startup_timeout: float = 1800.0
    grace_seconds: float = 30.0
    poll_seconds: float = 0.2
    # A person's stop request (`JobRun.stop_request`), read every `stop_poll_seconds`: on one,
    # SIGTERM as on a Spot notice, so the engine takes its final checkpoint within the grace period.
    stop_requested: Callable[[], dict[str, Any] | None] | None = field(default=None, repr=False)
    stop_poll_seconds: float = 2.0
    # The job's stopping condition (`max_runtime_seconds`, SageMaker's MaxRuntimeInSeconds): the Running time
    # this attempt may still use, and what records the stop once it is used up (a stop request by
    # `MAX_RUNTIME_BY`, so the Stop path ends the job: SIGTERM, the final checkpoint, Stopped).
    max_runtime_left: float | None = None
    runtime_used_up: Callable[[], None] | None = field(default=None, repr=False)
    # The node's labels when the attempt starts (`local_node_labels`): the record's `node_labels_at_start`.
    node_labels: dict[str, str] = field(default_factory=dict)
    # Where the attempt's tag is kept while it runs (`stop_left_processes` reads it when the launch
    # task is run again after it died: the training it left must not write beside the new try).
    procs_file: Path | None = None
    # Set when the launch task is asked to stop (its on_kill: a service stop, a host shutdown): the training
    # gets SIGTERM (its final checkpoint) and the attempt is interrupted, not ended (`interrupted` on return).
    interrupt: threading.Event | None = field(default=None, repr=False)
    # Whether `interrupt` reached the training (SIGTERM) before it ended of itself: its record is then not its end.
    interrupted: bool = field(default=False, init=False, repr=False)
    # An elastic attempt on fewer nodes (ADR 0029): asked every `grow_poll_seconds` once training runs; an answer
    # (`core.policy.GrowBack`) stops the training with SIGTERM (its final checkpoint) so that the next attempt
    # runs on more nodes: a planned restart, recorded as `planned_restart`, not a fault.
    grow_check: Callable[[], GrowBack | None] | None = field(default=None, repr=False)
    grow_poll_seconds: float = 2.0
    # Container mode (ADR 0035): the attempt runs `podman run` of this plan (the job's image), on a network of its
    # own where only `forward_ports` of this host's loopback (the run's Object Storage) are reachable; `env` then
    # holds the container's paths, `sidecar_env` the same contract with this host's paths (the metrics sidecar runs
    # here). None: host mode, the command runs on this host and the image is not used.
    container: ContainerPlan | None = None
    notes: list[str] = field(default_factory=list)  # lines for the job's log after its header (the image's pull)
    image_digest: str | None = None
    forward_ports: tuple[int, ...] = ()
    sidecar_env: dict[str, str] | None = field(default=None, repr=False)
    # A multi-node attempt in container mode: the other nodes, one container each, with this one (rank 0) on a
    # network of the attempt's own (`RunNetwork`) named after `run_key`. Empty: one container (or host mode).
    peers: list[PeerNode] = field(default_factory=list)
    run_key: str = ""

    def run(self, log: Log = print) -> AttemptRecord:
        """Start the command, stream its output, inject faults, watch for hangs; return the record."""
        self.node_dir.mkdir(parents=True, exist_ok=True)
        self.job_log.parent.mkdir(parents=True, exist_ok=True)
        kern_log = self.node_dir / "kern.log"
        kern_offset = kern_log.stat().st_size if kern_log.exists() else 0
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        state = _WatchState()
        tag = secrets.token_hex(8)
        if self.container is None:
            env = process_environment(self.env, os.environ)  # not the service's environment (its secrets)
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            env.setdefault(PROGRESS_FILE_ENV, str(self.output_dir / PROGRESS_RELATIVE))
            sidecar_env = dict(env)
        else:
            training = {**self.env, "HOME": CONTAINER_HOME}
            training.setdefault(PROGRESS_FILE_ENV, f"{POD_OUTPUT_DIR}/{PROGRESS_RELATIVE}")
            sidecar_env = process_environment(self.sidecar_env or self.env, os.environ)
            sidecar_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{sidecar_env.get('PATH', '')}"
            sidecar_env.setdefault(PROGRESS_FILE_ENV, str(self.output_dir / PROGRESS_RELATIVE))
            # podman takes each value from its own environment (`--env NAME`): no value is on a command line
            env = {**process_environment({}, os.environ), **podman_env(), **training}
        sidecar = MetricsSidecar({**sidecar_env, SIDECAR_TAG_ENV: tag},
                                 self.node_dir / f"metrics-sidecar-attempt-{self.attempt}.log").start()
        if sidecar is not None:
            env[SIDECAR_ENV] = "1"  # the training process then writes only the training and checkpoint series
        env[ATTEMPT_TAG_ENV] = tag
        if self.container is None:
            argv = ["bash", "-c", self.command]
            where = f"runs on this host; image {self.image} is not used" if self.image else "runs on this host"
        else:
            names = sorted({*training, SIDECAR_ENV, ATTEMPT_TAG_ENV} & set(env))
            self._cid_file().unlink(missing_ok=True)
            argv = ["podman", "--cgroup-manager=cgroupfs", *podman_run_args(self.container, self.command, names,
                                                                             cid_file=self._cid_file())]
            where = f"runs in image {self.container.image}" + (f" ({self.image_digest})" if self.image_digest else "")
        started = now_utc()
        network: Any = contextlib.nullcontext()
        if self.container is not None:
            network = AttemptNetwork(self.forward_ports)
            if self.peers:
                network = RunNetwork(self.forward_ports, 1 + len(self.peers),
                                     network_name(self.run_key or self.job, self.attempt))
        try:
            with open(self.job_log, "a", encoding="utf-8") as job_log, network as joined:
                header = job_log_header(job=self.job, attempt=self.attempt, node=self.node, at=started)
                job_log.write(header + "\n")
                job_log.writelines(f"{now_utc().isoformat()} {note}\n" for note in self.notes)
                job_log.write(f"{now_utc().isoformat()} [sat] attempt {self.attempt} {where}\n")
                job_log.flush()
                log(header)
                log(f"[sat] attempt {self.attempt} {where}")
                peer_procs: list[subprocess.Popen] = []
                if isinstance(joined, RunNetwork):
                    argv[argv.index("--network") + 1] = f"ns:{joined.paths[0]}"
                    where = (f"[sat] attempt {self.attempt}: {1 + len(self.peers)} containers, one per node, on "
                             f"network {joined.name} ("
                             + ", ".join(f"{n} {a}" for n, a in zip([self.node, *(p.node for p in self.peers)],
                                                                    joined.addresses, strict=True)) + ")")
                    job_log.write(f"{now_utc().isoformat()} {where}\n")
                    log(where)
                    for index, peer in enumerate(self.peers, start=1):
                        peer_procs.append(self._start_peer(peer, index, joined.paths[index], env, names))
                elif joined is not None:
                    argv[argv.index("--network") + 1] = f"ns:{joined.path}"
                proc = subprocess.Popen(
                    argv,
                    cwd=self.cwd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    text=True,
                    errors="replace",
                    bufsize=1,
                )
                state.last_progress = time.monotonic()
                procs = AttemptProcesses(proc, tag, peer_procs)
                self._note_processes(tag, proc.pid)
                readers = [threading.Thread(target=self._pump, args=(p, job_log, tail, state, log, prefix),
                                            name="sat-log-pump", daemon=True)
                           for p, prefix in [(proc, ""), *((pp, f"[{peer.node}] ")
                                                           for pp, peer in zip(peer_procs, self.peers, strict=True))]]
                for reader in readers:
                    reader.start()
                self._watch(procs, state, kern_log, log, started.timestamp())
                self._end(procs, state, log)
                for peer_proc in peer_procs:  # their processes are gone (`_end`): the clients' exit statuses
                    try:
                        peer_proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        peer_proc.kill()
                        peer_proc.wait(timeout=10)
                if self.container is not None:  # removed at once, even when its podman client was killed with it
                    state.container_id = state.container_id or _read_cid(self._cid_file())
                    state.peer_ids.update({rank: found for rank in range(1, 1 + len(self.peers))
                                           if rank not in state.peer_ids and (found := _read_cid(self._cid_file(rank)))})
                    remove_container(self.container.name)
                    for peer in self.peers:
                        remove_container(peer.container.name)
                if sidecar is not None:  # its last sample and upload overlap with the end of the log (recovery path)
                    sidecar.request_stop()
                if self.procs_file is not None:
                    self.procs_file.unlink(missing_ok=True)  # none is left running
                for reader in readers:
                    reader.join(timeout=10)
                finished = now_utc()
                for line in sidecar.stop(log) if sidecar is not None else ():
                    job_log.write(line + "\n")
                    log(line)
                footer = job_log_footer(attempt=self.attempt, at=finished, exit_code=procs.returncode(),
                                        note="interrupted: it resumes when its launch task runs again"
                                        if self.interrupted else None)
                job_log.write(footer + "\n")
                log(footer)
        finally:
            if sidecar is not None and sidecar.proc is not None and sidecar.proc.poll() is None:
                sidecar.stop(log)  # the attempt did not get to its end (an exception): no sidecar outlives it
        return self._record(procs.returncode(), started, finished, list(tail), kern_log, kern_offset, state,
                            peer_procs)

    # ---- steps ------------------------------------------------------------------------------
    def _cid_file(self, rank: int = 0) -> Path:
        return self.node_dir / (f"attempt-{self.attempt}.cid" if rank == 0 else f"attempt-{self.attempt}-rank-{rank}.cid")

    def _start_peer(self, peer: PeerNode, rank: int, network_path: str, env: dict[str, str],
                    names: list[str]) -> subprocess.Popen:
        """Start node `rank`'s container on the run network (its podman client in a session of its own)."""
        peer_env = {**env, **peer.env, "HOME": CONTAINER_HOME}
        self._cid_file(rank).unlink(missing_ok=True)
        argv = ["podman", "--cgroup-manager=cgroupfs",
                *podman_run_args(peer.container, self.command, sorted({*names, *peer.env} & set(peer_env)),
                                 cid_file=self._cid_file(rank))]
        argv[argv.index("--network") + 1] = f"ns:{network_path}"
        return subprocess.Popen(argv, cwd=self.cwd, env=peer_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace",
                                bufsize=1)

    def _note_processes(self, tag: str, pgid: int) -> None:
        if self.procs_file is not None:
            self.procs_file.parent.mkdir(parents=True, exist_ok=True)
            self.procs_file.write_text(json.dumps({"attempt": self.attempt, "node": self.node, "tag": tag,
                                                   "pgid": pgid}), encoding="utf-8")

    def _pump(self, proc, job_log, tail, state: _WatchState, log: Log, prefix: str = "") -> None:
        for line in proc.stdout:
            line = prefix + line.rstrip("\n")
            tail.append(line)
            job_log.write(line + "\n")
            job_log.flush()
            log(line)
            state.last_progress = time.monotonic()

    def _own_progress(self, progress: dict[str, Any] | None, mtime: float | None, started_at: float) -> bool:
        """Whether `progress` (progress.json) reports a training step of *this* attempt.

        The file outlives attempts (the run's output directory is shared), so a step counts
        only when the file was written after this run of the attempt started and, when the
        engine stamped it, by this attempt.
        """
        if not progress or progress.get("step") is None:
            return False
        if progress.get("attempt") not in (None, self.attempt):
            return False
        # written since this run started (the same attempt run again after its task died finds its old step)
        return mtime is not None and mtime >= started_at

    def _watch(self, procs: AttemptProcesses, state: _WatchState, kern_log: Path, log: Log,
               started_at: float) -> None:
        proc = procs.proc
        started = time.monotonic()
        pending = [f for f in self.faults if f.attempt == self.attempt]
        progress_path = self.output_dir / PROGRESS_RELATIVE
        last_mtime = None
        state.training_started = not self.startup_timeout  # no start-up deadline: the heartbeat runs from now
        next_stop_check = next_grow_check = started
        while not procs.ended():
            if proc.poll() is None:
                _wait_for_exit(proc, self.poll_seconds)
            else:  # rank 0's container is done, another node's not yet
                time.sleep(self.poll_seconds)
            failed = procs.failed_peer()
            if failed is not None and state.kill_at is None and state.peer_failure is None and proc.poll() is None:
                state.peer_failure = failed  # a node's container failed: the attempt fails (a JobSet's policy)
                log(f"[sat] the container of {self.peers[failed - 1].node} exited with status "
                    f"{procs.peers[failed - 1].returncode}: ending the attempt's other containers")
                procs.signal_all(signal.SIGKILL)
                break
            if self.interrupt is not None and self.interrupt.is_set() and state.kill_at is None:
                self.interrupted = True
                state.kill_at = time.monotonic() + self.grace_seconds
                log(f"[sat] the launch task was asked to stop (a service stop, a host shutdown): SIGTERM to the "
                    f"training on {self.node}; its final checkpoint has {self.grace_seconds:.0f}s")
                procs.signal_group(signal.SIGTERM)
            if (self.max_runtime_left is not None and state.kill_at is None and not state.runtime_used_up
                    and time.monotonic() - started >= self.max_runtime_left):
                state.runtime_used_up = True
                self._use_up_runtime(log)
                next_stop_check = time.monotonic()  # the request it wrote is read now, not in a poll's time
            if self.stop_requested is not None and state.kill_at is None and time.monotonic() >= next_stop_check:
                next_stop_check = time.monotonic() + self.stop_poll_seconds
                self._check_stop(procs, state, log)
            if (self.grow_check is not None and state.training_started and state.kill_at is None
                    and not state.hung and time.monotonic() >= next_grow_check):
                next_grow_check = time.monotonic() + self.grow_poll_seconds
                self._check_growth(procs, state, log)
            if state.kill_at is not None and time.monotonic() >= state.kill_at:
                procs.signal_all(signal.SIGKILL)  # the grace period after SIGTERM is over
            if self.container is not None and state.container_id is None:
                state.container_id = _read_cid(self._cid_file())
            for rank in range(1, 1 + len(self.peers)):
                if rank not in state.peer_ids and (found := _read_cid(self._cid_file(rank))):
                    state.peer_ids[rank] = found
            progress = _read_json(progress_path)
            mtime = progress_path.stat().st_mtime if progress_path.exists() else None
            own = self._own_progress(progress, mtime, started_at)
            if own and not state.training_started:
                state.training_started = True
                state.last_progress = time.monotonic()
                log(f"[sat] first training step {progress.get('step')} after {time.monotonic() - started:.0f}s "
                    f"on {self.node}: start-up done, heartbeat on ({self.heartbeat_timeout:.0f}s)")
            if mtime != last_mtime:
                last_mtime = mtime
                if state.training_started:
                    state.last_progress = time.monotonic()
            step = int(progress.get("step") or 0) if own else 0
            elapsed = time.monotonic() - started
            for fault in list(pending):
                due = (fault.at_step is not None and step >= fault.at_step) or (
                    fault.after_seconds is not None and elapsed >= fault.after_seconds
                )
                if due:
                    pending.remove(fault)
                    self._inject(fault, procs, state, kern_log, step, log)
            if state.hung or state.kill_at is not None:
                continue  # stopped (the watchdog decides), or stopping within its grace period
            if not state.training_started:
                if elapsed > self.startup_timeout and not state.startup_timeout:
                    state.startup_timeout = True
                    log(f"[sat] no training step within startup_timeout_seconds={self.startup_timeout:.0f}s "
                        f"on {self.node}: the start-up (loading the model, the data) did not finish; "
                        "stopping the attempt")
                    procs.signal_all(signal.SIGKILL)
                continue
            if time.monotonic() - state.last_progress > self.heartbeat_timeout and not state.heartbeat_timeout:
                state.heartbeat_timeout = True
                log(f"[sat] no training progress for {self.heartbeat_timeout:.0f}s on {self.node}: "
                    "killing the hung attempt")
                procs.signal_all(signal.SIGKILL)
        if state.hung and not state.heartbeat_timeout:
            state.heartbeat_timeout = True

    def _use_up_runtime(self, log: Log) -> None:
        """The job's maximum runtime is used up: record the stop request that ends it (read at once after)."""
        log(f"[sat] the job reached its maximum runtime (max_runtime_seconds; {self.max_runtime_left:.0f}s were "
            f"left for attempt {self.attempt}): stopping it with a final checkpoint")
        if self.runtime_used_up is None:
            return
        try:
            self.runtime_used_up()
        except Exception as exc:  # noqa: BLE001 - the stop request could not be written: say so, stop anyway below
            log(f"[sat] could not record the maximum runtime's stop request ({type(exc).__name__}: {exc})")

    def _check_stop(self, procs: AttemptProcesses, state: _WatchState, log: Log) -> None:
        """Pass a person's stop request on to the training as SIGTERM (final checkpoint, then exit)."""
        try:
            request = self.stop_requested()
        except Exception as exc:  # noqa: BLE001 - a store that cannot be read now is read again at the next poll
            log(f"[sat] could not read the stop request ({type(exc).__name__}); training goes on")
            return
        if not request:
            return
        state.stopped_by = str(request.get("by") or "unknown")
        state.kill_at = time.monotonic() + self.grace_seconds
        log(f"[sat] stop requested by {state.stopped_by} at {request.get('at')}: SIGTERM to the training on "
            f"{self.node}; its final checkpoint has {self.grace_seconds:.0f}s")
        procs.signal_group(signal.SIGTERM)

    def _check_growth(self, procs: AttemptProcesses, state: _WatchState, log: Log) -> None:
        """Capacity is back for an elastic attempt on fewer nodes: SIGTERM (final checkpoint), then more nodes."""
        try:
            grow = self.grow_check()
        except Exception as exc:  # noqa: BLE001 - a look that failed is looked again; it never ends the attempt
            log(f"[sat] elastic: could not check for capacity to grow back ({type(exc).__name__}: {exc})")
            return
        if grow is None:
            return
        state.grow = grow
        state.kill_at = time.monotonic() + self.grace_seconds
        log(f"[sat] elastic: {grow.why}: SIGTERM to the training on {self.node} for its final checkpoint; the next "
            f"attempt runs on {grow.nodes} nodes (a planned restart, not a failover)")
        procs.signal_group(signal.SIGTERM)

    def _inject(self, fault: Fault, procs: AttemptProcesses, state: _WatchState, kern_log: Path, step: int,
                log: Log) -> None:
        """Do to the attempt's processes what the fault does to a node's (every rank, not only the launcher)."""
        log(f"[sat] injecting fault {fault.kind.value} on {self.node} at step {step} (attempt {self.attempt})")
        if fault.kind is FaultKind.HARDWARE:
            with open(kern_log, "a", encoding="utf-8") as handle:
                handle.write(xid_line(self.node, fault.xid, procs.proc.pid) + "\n")
            write_fake_device(self.node_dir, fault.xid)
            procs.signal_all(signal.SIGKILL)  # a dead GPU takes the processes down with it
        elif fault.kind is FaultKind.NODE_LOSS:
            state.node_lost = True
            procs.signal_all(signal.SIGKILL)
        elif fault.kind is FaultKind.PREEMPTION:
            state.preemption_notice = True
            state.kill_at = time.monotonic() + self.grace_seconds
            procs.signal_group(signal.SIGTERM)  # as a pod's PID 1 passes it on; launchers tell their workers
        elif fault.kind is FaultKind.HANG:
            state.hung = True
            procs.signal_all(signal.SIGSTOP)
            threading.Thread(
                target=_hang_watchdog, args=(procs, self.heartbeat_timeout, log, self.node), daemon=True
            ).start()

    def _end(self, procs: AttemptProcesses, state: _WatchState, log: Log) -> None:
        """The command has exited; end the processes it left, as a pod's end does.

        A launcher may exit before its workers: on SIGTERM the `deepspeed` launcher dies at
        once while its ranks still write their final checkpoint. After a Spot notice they get
        the rest of the grace period; then, as on any exit, what is left is SIGKILLed, so no
        process of this attempt outlives it (and writes beside the next one).
        """
        if not procs.alive():
            return
        if state.kill_at is not None:
            log("[sat] the command exited on SIGTERM; waiting for the processes it started (final checkpoint)")
            while procs.alive() and time.monotonic() < state.kill_at:
                time.sleep(self.poll_seconds)
            if not procs.alive():
                log("[sat] the command's processes have exited")
                return
        log(f"[sat] killing the processes the command left running: {procs.describe()}")
        procs.signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _progress(self) -> dict | None:
        """The engine's progress.json at the end of the attempt, without what an earlier attempt wrote."""
        return progress_of_attempt(_read_json(self.output_dir / PROGRESS_RELATIVE), self.attempt)

    def _record(self, returncode, started, finished, tail, kern_log, kern_offset, state,
                peer_procs: Sequence[subprocess.Popen] = ()) -> AttemptRecord:
        node_log = []
        if kern_log.exists():
            with open(kern_log, encoding="utf-8", errors="replace") as handle:
                handle.seek(kern_offset)
                node_log = [line.rstrip("\n") for line in handle]
        sig = -returncode if returncode is not None and returncode < 0 else None
        if sig is None and self.container is not None and returncode is not None and 128 < returncode < 160:
            sig = returncode - 128  # podman reports a container killed by a signal as 128 + N, as a pod's exitCode
        exit_code = 128 + sig if sig else returncode
        container_states, reason, message = [host_status(self.job)], "Completed" if returncode == 0 else "Error", None
        if self.container is not None:
            oom = oom_kills(state.container_id) if exit_code == 137 and state.container_id else []
            for _rank, cid in sorted(state.peer_ids.items()) if exit_code == 137 and not oom else ():
                oom = oom_kills(cid)  # another node's container over its memory limit ended the attempt
                if oom:
                    break
            if oom:
                reason, message = "OOMKilled", oom[0]
            container_states = [{
                "name": self.container.name, "runtime": "podman", "image": self.container.image,
                "imageID": self.image_digest or "", "containerID": state.container_id or "",
                "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                         **({"signal": sig} if sig else {}), **({"message": message} if message else {}),
                                         "startedAt": started.isoformat(), "finishedAt": finished.isoformat()}},
            }]
            for rank, (peer, peer_proc) in enumerate(zip(self.peers, peer_procs, strict=True), start=1):
                code = peer_proc.returncode
                code = 128 - code if code is not None and code < 0 else code
                container_states.append({
                    "name": peer.container.name, "runtime": "podman", "image": peer.container.image,
                    "imageID": self.image_digest or "", "containerID": state.peer_ids.get(rank, ""), "node": peer.node,
                    "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                             "startedAt": started.isoformat(), "finishedAt": finished.isoformat()}},
                })
        node_conditions = []
        if state.node_lost:
            node_conditions.append(
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                }
            )
        return AttemptRecord(
            job=self.job,
            attempt=self.attempt,
            backend="local",
            node=self.node,
            exit_code=exit_code,
            signal=sig,
            termination_reason=reason,
            termination_message=message,
            container_states=container_states,
            log_tail=tail,
            node_log=node_log,
            node_conditions=node_conditions,
            started_at=started,
            finished_at=finished,
            progress=self._progress(),
            preemption_notice=state.preemption_notice,
            heartbeat_timeout=state.heartbeat_timeout,
            startup_timeout=state.startup_timeout,
            image=self.image,
            stopped_by=state.stopped_by,
            planned_restart=state.grow.why if state.grow is not None else None,
            readmitted_nodes=list(state.grow.readmitted) if state.grow is not None else [],
            node_labels_at_start=dict(self.node_labels),
            # a local node is never gone (a lost one is NotReady in node_conditions): no inference from its labels
            end_facts={"node_gone": False},
        )


@dataclass
class _WatchState:
    last_progress: float = 0.0
    preemption_notice: bool = False
    heartbeat_timeout: bool = False
    startup_timeout: bool = False
    training_started: bool = False
    node_lost: bool = False
    hung: bool = False
    kill_at: float | None = None  # monotonic time of the SIGKILL after a Spot notice or a stop request
    stopped_by: str | None = None
    grow: GrowBack | None = None  # the launcher stopped the attempt to grow back (elastic)
    container_id: str | None = None  # container mode: podman's id of the attempt's container (its --cidfile)
    peer_ids: dict[int, str] = field(default_factory=dict)  # a multi-node attempt: the other nodes' containers' ids
    peer_failure: int | None = None  # the rank of the node whose container failed first (the attempt ended on it)
    runtime_used_up: bool = False  # the job's max_runtime_seconds ran out during this attempt


class AttemptProcesses:
    """The processes of one attempt: the command's process group, and every process carrying its tag.

    torchrun starts each worker in a session of its own, so a signal to the command's
    group reaches torchrun only, and a SIGKILLed torchrun leaves its workers running. Each
    process inherits `SAT_ATTEMPT_TAG` (a value per attempt) in its environment, whatever
    session it is in and whoever its parent is now, so they are found through `/proc`.
    """

    def __init__(self, proc: subprocess.Popen, tag: str, peers: Sequence[subprocess.Popen] = ()) -> None:
        self.proc = proc
        self.peers = list(peers)  # a multi-node attempt's other nodes' podman clients (each a group of its own)
        self._groups = {proc.pid, *(p.pid for p in self.peers)}
        self._needle = f"{ATTEMPT_TAG_ENV}={tag}".encode()
        self.first_failed: int | None = None  # the rank whose command failed first, when another node's

    def ended(self) -> bool:
        """Whether the attempt's command has ended: every node's, or rank 0's with a failure (the others are then
        ended by `LocalAttempt._end`, as a failed pod's JobSet is)."""
        code = self.proc.poll()
        return code is not None and (code != 0 or all(p.poll() is not None for p in self.peers))

    def failed_peer(self) -> int | None:
        """The rank of another node whose command exited with a failure (the first seen), else None."""
        if self.first_failed is None:
            for rank, peer in enumerate(self.peers, start=1):
                if peer.poll() not in (None, 0):
                    self.first_failed = rank
                    break
        return self.first_failed

    def returncode(self) -> int | None:
        """The attempt's exit status: the first failed node's (another node's seen first, else rank 0's), else 0."""
        if self.first_failed is not None:
            return self.peers[self.first_failed - 1].returncode
        codes = [self.proc.returncode, *(p.returncode for p in self.peers)]
        return next((code for code in codes if code), self.proc.returncode)

    def pids(self) -> list[int]:
        """Running (not zombie) processes of the attempt: members of the command's group, or tagged."""
        found: list[int] = []
        try:
            entries = os.listdir("/proc")
        except OSError:  # no procfs: the group is all there is to find
            return [self.proc.pid] if _killpg(self.proc.pid, 0) else []
        for entry in entries:
            if entry.isdigit() and self._is_member(int(entry)):
                found.append(int(entry))
        return found

    def _is_member(self, pid: int) -> bool:
        found = state_of(pid)
        if found is None:
            return False
        return found[1] in self._groups or carries(pid, self._needle)

    def alive(self) -> bool:
        """Whether any process of the attempt still runs."""
        return bool(self.pids())

    def describe(self) -> str:
        """The running processes as `pid (name)`, for the log."""
        names = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
                    names.append(f"{pid} ({handle.read().strip()})")
            except OSError:
                continue
        return ", ".join(names) or "none"

    def signal_group(self, sig: int) -> None:
        """`sig` to the command's process group (what a pod's PID 1 forwards): every node's, in a multi-node one."""
        for group in self._groups:
            _killpg(group, sig)

    def signal_all(self, sig: int) -> None:
        """`sig` to the group and to every process of the attempt outside it."""
        for group in self._groups:
            _killpg(group, sig)
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_left_processes(procs_file: Path, grace: float, log: Log) -> int:
    """Stop what an attempt's earlier run left running (its launch task died, its training did not).

    Returns how many training processes were found (a metrics sidecar left behind is stopped, not counted).

    The training gets SIGTERM (its final checkpoint) and SIGKILL after `grace` seconds, its
    metrics sidecar SIGTERM (a last sample and upload). Found by the tag in `procs_file`, in
    their environment, so a pid reused since is never touched.
    """
    try:
        noted = json.loads(procs_file.read_text(encoding="utf-8"))
        tag = str(noted["tag"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    training, sidecars = marked(ATTEMPT_TAG_ENV, tag), marked(SIDECAR_TAG_ENV, tag)
    if training:
        log(f"[sat] attempt {noted.get('attempt')}'s training from before is still running on {noted.get('node')} "
            f"(pids {', '.join(map(str, training))}): SIGTERM, its final checkpoint has {grace:.0f}s")
        terminate(training, grace=grace)
    if sidecars:
        terminate(sidecars, grace=STOP_TIMEOUT_S)
    procs_file.unlink(missing_ok=True)
    return len(training)


def _hang_watchdog(procs: AttemptProcesses, timeout: float, log: Log, node: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.proc.poll() is not None:
            return
        time.sleep(0.1)
    log(f"[sat] no training progress for {timeout:.0f}s on {node}: killing the hung attempt")
    procs.signal_all(signal.SIGKILL)
    procs.signal_all(signal.SIGCONT)


def _wait_for_exit(proc: subprocess.Popen, seconds: float) -> None:
    """Sleep `seconds`, or less when the command exits meanwhile: a fault's SIGKILL is seen at once, not at the
    next poll (the time from the fault to the record is part of every recovery)."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


def _read_cid(path: Path) -> str | None:
    try:
        found = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return found if re.fullmatch(r"[0-9a-f]{64}", found) else None


def _read_json(path: Path) -> dict | None:
    """The JSON at `path` (the training's progress.json: a bounded read); None when unreadable or over the bound."""
    try:
        return json.loads(read_file(path))
    except (OSError, ValueError):  # ObjectTooLargeError is a ValueError
        return None
