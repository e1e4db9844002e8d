"""One attempt on the local backend: pick a node, record Running, lay out the vendor dir, run it, store its record.

Run again after its task died (a service restart, the task process killed), the same
attempt resumes from its last committed checkpoint (`Interruption`), without a failover.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from ckpt_engine.contract import (
    CONCURRENT_DIR,
    GRACE_ENV,
    MANIFEST_NAME,
    NODE_ENV,
    NODES_ENV,
    PROGRESS_NAME,
    RUN_ID_ENV,
    ProgressRecord,
    series_path,
)
from ckpt_engine.integrations.elastic import ACCUMULATION_SCALE_ENV
from ckpt_engine.vendor import write_vendor_dir
from sat_tasks.backends.local.container_run import (
    NODE_INTERFACE,
    ContainerPlan,
    ContainerRuntimeError,
    ImagePullError,
    Mount,
    chosen_runtime,
    container_name,
    job_pull_login,
    node_address,
    prepare_image,
    writable_by_container,
)
from sat_tasks.backends.local.runner import (
    LocalAttempt,
    PeerNode,
    local_node_labels,
    stop_left_processes,
)
from sat_tasks.backends.local.warm import warm_command
from sat_tasks.backends.local.workspace import attempt_nodes, growth_watch
from sat_tasks.core.attempt import AttemptRecord, Interruption
from sat_tasks.core.bounded import read_file
from sat_tasks.core.clock import now_utc
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.core.policy import resume_interrupted
from sat_tasks.core.runtime_env import (
    IMAGE_VENDOR_DIR,
    LAUNCHER_GRACE_MARGIN_S,
    POD_CODE_DIR,
    POD_DATA_DIR,
    POD_METRICS_DIR,
    POD_OUTPUT_DIR,
    TrainingPaths,
    final_checkpoint_grace_seconds,
    training_environment,
)
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import SatError
from sat_tasks.io import run_location
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.scoped_credentials import training_credentials
from sat_tasks.spec import Framework
from sat_tasks.spec.quantities import parse_quantity, quantity_bytes


class AttemptInterrupted(SatError, RuntimeError):
    """The launch task was asked to stop while its attempt ran: the attempt did not end, it resumes when the task runs again."""


def launch_attempt(run: JobRun, plan: Plan, log: Log, interrupt: threading.Event | None = None) -> AttemptRecord:
    """Run one attempt on the first healthy node of the pool (or of its workspace, when free) and store its record.

    Run again for an attempt that already ended (its record is stored), it returns that record;
    for one whose earlier run was interrupted (`find_interruption`), it resumes it. `interrupt`
    set while it runs (the task's on_kill) stops the training (its final checkpoint) and raises
    AttemptInterrupted without storing a record: the attempt has not ended.
    """
    ended = run.load_record(plan.attempt)
    if ended is not None:
        log(f"[sat] attempt {plan.attempt} already ended (exit status {ended.exit_code}) in an earlier run of this "
            "task: its record stands, nothing is run again")
        return ended
    run_location.check(run, log)  # this worker sees the files stage_data put here (issue 48.1)
    interruption = find_interruption(run, plan, log)
    if interruption is not None:
        plan = resume_interrupted(plan, interruption.resume_step)
    with attempt_nodes(run, plan, log) as nodes:
        return _run_on(run, plan, nodes, log, interruption, interrupt)


def find_interruption(run: JobRun, plan: Plan, log: Log) -> Interruption | None:
    """The interruption of attempt `plan.attempt` when an earlier run of its task started it and did not end it.

    Its training may still run (only the task process died): it is stopped first (SIGTERM, so
    its final checkpoint is taken), then the newest committed checkpoint is where it resumes.
    """
    started = [e for e in run.history(log).entries()
               if e.get("attempt") == plan.attempt and e.get("task") == "launch" and e["status"] == JobStatus.RUNNING.value]
    if not started:
        return None
    job_log_seen, progress_seen = _mtime(run.job_log), _mtime(run.output_dir / CONCURRENT_DIR / PROGRESS_NAME)
    left = stop_left_running(run, plan.attempt, log)
    seen = job_log_seen if left else max(filter(None, (job_log_seen, progress_seen)), default=None)
    step = last_committed_step(run.output_dir)
    return Interruption(attempt=plan.attempt, left_running=left, resume_step=resume_interrupted(plan, step).resume_step,
                        last_seen=datetime.fromtimestamp(seen, UTC) if seen else None)


def stop_left_running(run: JobRun, attempt: int, log: Log) -> int:
    """Stop the training an earlier run of attempt `attempt`'s task left running (SIGTERM, SIGKILL after the
    grace period); how many of its processes there were."""
    grace = final_checkpoint_grace_seconds(run.job) + LAUNCHER_GRACE_MARGIN_S
    return stop_left_processes(procs_file(run, attempt), grace, log)


def last_committed_step(output_dir: Path) -> int | None:
    """The newest checkpoint under `output_dir` whose manifest checks out (its files' presence and sizes).

    A trainer that writes no manifests (a script without the engine): the `last_committed_step`
    of its progress.json. None when nothing was committed.
    """
    from ckpt_engine.contract import checkpoint_dir
    from ckpt_engine.manifest import list_checkpoint_steps, verify_checkpoint
    from ckpt_engine.storage.file import FileStorage

    root = output_dir / CONCURRENT_DIR
    if not root.is_dir():
        return None
    storage = FileStorage(str(root))
    steps = list_checkpoint_steps(storage)
    if any((root / checkpoint_dir(step) / MANIFEST_NAME).exists() for step in steps):
        return next((step for step in steps if verify_checkpoint(storage, checkpoint_dir(step), deep=False).ok), None)
    try:
        progress = ProgressRecord.from_json(read_file(root / PROGRESS_NAME))  # the training writes it: bounded
    except (OSError, ValueError):  # ObjectTooLargeError is a ValueError
        return None
    step = progress.last_committed_step
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def procs_file(run: JobRun, attempt: int) -> Path:
    """Where the runner keeps the tag of attempt `attempt`'s processes while they run (this host's disk)."""
    return run.run_dir / "attempts" / f"attempt-{attempt}.procs.json"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _run_on(run: JobRun, plan: Plan, nodes: list[str], log: Log, interruption: Interruption | None = None,
            interrupt: threading.Event | None = None) -> AttemptRecord:
    job = run.job
    node = nodes[0]
    grow_check = growth_watch(run, plan, list(nodes), log)  # elastic on fewer nodes: grow back (ADR 0029)
    note = getattr(nodes, "note", "")  # an elastic failover on fewer nodes says so (HeldNodes)
    run.record_attempt_start(plan, log, where=", ".join(nodes) + (f"; {note}" if note else ""),
                             nodes_held=len(nodes) if job.elastic is not None else None)
    if interruption is not None:  # after the start entry (the earlier run's, not repeated): the why of this run
        run.history(log).record(JobStatus.RUNNING, interruption.reason, attempt=plan.attempt, task="launch")
        run.job_log.parent.mkdir(parents=True, exist_ok=True)
        with open(run.job_log, "a", encoding="utf-8") as job_log:
            job_log.write(f"{now_utc().isoformat()} [sat] {interruption.reason}\n")
    write_vendor_dir(run.vendor_dir)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    runtime = chosen_runtime()
    endpoint = run.hook().conn_config.get_service_endpoint_url("s3")
    host_paths = TrainingPaths(str(run.data_dir), str(run.output_dir), str(run.code_dir), str(run.vendor_dir))
    env = _attempt_env(run, plan, node, nodes, log, host_paths, str(run.metrics_dir), endpoint)
    command = job.command
    per_node = runtime == "container" and len(nodes) >= 2  # one container per node, on the attempt's network
    if per_node:
        command = node_command(command, deepspeed=job.framework is Framework.DEEPSPEED)
    elif job.elastic is not None:  # one rank per node it holds (ADR 0029)
        command = elastic_command(command, len(nodes), deepspeed=job.framework is Framework.DEEPSPEED)
    container: dict[str, object] = {}
    if runtime == "container":
        try:
            container = _container(run, plan, node, log, endpoint, nodes)
        except ImagePullError as exc:  # the attempt ends before it starts, as a pod in ImagePullBackOff does
            log(f"[sat] {exc}")
            run.job_log.parent.mkdir(parents=True, exist_ok=True)
            with open(run.job_log, "a", encoding="utf-8") as job_log:  # the job's log says why nothing ran
                job_log.write(f"{now_utc().isoformat()} [sat] attempt {plan.attempt} did not start: {exc}\n")
            record = pull_failed_record(run, plan, node, nodes, str(exc))
            run.store_record(record)
            return record
        container["sidecar_env"] = env
        env = _attempt_env(run, plan, node, nodes, log, CONTAINER_PATHS, POD_METRICS_DIR, endpoint)
        if per_node:
            container.update(_per_node(run, nodes, env, container.pop("container")))
    else:
        command = warm_command(run, command)  # the failover standby is a host interpreter (ADR 0031)
    runner = LocalAttempt(
        job=job.name,
        attempt=plan.attempt,
        node=node,
        command=command,
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
        **max_runtime(run, log),
        node_labels=local_node_labels(node, job.workspace),
        procs_file=procs_file(run, plan.attempt),
        interrupt=interrupt,
        grow_check=grow_check,
        **container,
    )
    record = runner.run(log)
    if runner.interrupted and record.exit_code != 0:  # not its end: the task's next run resumes it (find_interruption)
        raise AttemptInterrupted(f"attempt {plan.attempt} on {node} was interrupted (its launch task was asked to "
                                 f"stop); its last committed checkpoint: {record.last_committed_step}")
    record = record.model_copy(update={"nodes": list(nodes)})
    run.store_record(record)
    return record


def _attempt_env(run: JobRun, plan: Plan, node: str, nodes: list[str], log: Log, paths: TrainingPaths,
                 metrics_dir: str, endpoint: str | None) -> dict[str, str]:
    """The training environment of the attempt, with `paths` (this host's, or the container's)."""
    job = run.job
    env = training_environment(job, paths, plan, node=node, mirror_url=run.mirror_uri, s3_endpoint_url=endpoint,
                               metrics_dir=metrics_dir, metrics_url=run.metrics_uri)
    env[RUN_ID_ENV] = run.run_id
    # credentials scoped to this run (ADR 0020), for the training process only: never logged or recorded
    env.update(training_credentials(run, run.hook(), plan.attempt, log))
    if job.elastic is not None:  # one rank per node it holds (ADR 0029)
        env[NODES_ENV] = str(len(nodes))
        if len(nodes) < job.nodes:
            env[ACCUMULATION_SCALE_ENV] = str(job.nodes // len(nodes))  # the global batch stays the planned one
    return env


def pull_failed_record(run: JobRun, plan: Plan, node: str, nodes: list[str], words: str) -> AttemptRecord:
    """The record of an attempt whose image could not be pulled: a container waiting in ImagePullBackOff with the
    registry's (podman's) words, no exit status; the classifier's container-state rule makes it IMAGE_PULL."""
    now = now_utc()
    return AttemptRecord(
        job=run.job.name, attempt=plan.attempt, backend="local", node=node, nodes=list(nodes), exit_code=None,
        termination_reason="ImagePullBackOff", termination_message=words[:1000], started_at=now, finished_at=now,
        image=run.job.image.url,
        container_states=[{"name": container_name(f"{run.job.name}-{run.run_id}", plan.attempt), "runtime": "podman",
                           "image": run.job.image.url, "imageID": "",
                           "state": {"waiting": {"reason": "ImagePullBackOff", "message": words[:1000]}}}],
    )


MAX_RUNTIME_VIA = "the job's stopping condition"


def max_runtime(run: JobRun, log: Log) -> dict[str, object]:
    """The LocalAttempt arguments of the job's `max_runtime_seconds`: the Running time left after the earlier
    attempts (the status history's closed Running intervals), and the writer of the stop request that ends the
    job once it is used up (the Stop path: SIGTERM, a final checkpoint, Stopped)."""
    limit = run.job.max_runtime_seconds
    if limit is None:
        return {}
    from sat_tasks.core.run_summary import summarize_history
    from sat_tasks.io import object_storage as storage

    used = summarize_history(run.history(log).entries()).running_s
    left = max(0.0, limit - used)
    log(f"[sat] max_runtime_seconds {limit:g}: {used:.0f}s of Running time used by earlier attempts, {left:.0f}s left")

    def used_up() -> None:
        storage.write_json(run.hook(), run.stop_uri, {
            "by": f"max_runtime_seconds ({limit:g} s of Running time used up)", "at": now_utc().isoformat(),
            "via": MAX_RUNTIME_VIA})

    return {"max_runtime_left": left, "runtime_used_up": used_up}


# The run's directories inside its container: where a Kubernetes pod has them (one contract for both backends).
CONTAINER_PATHS = TrainingPaths(POD_DATA_DIR, POD_OUTPUT_DIR, POD_CODE_DIR, IMAGE_VENDOR_DIR)


def _container(run: JobRun, plan: Plan, node: str, log: Log, endpoint: str | None,
               nodes: list[str] | None = None) -> dict[str, object]:
    """The LocalAttempt arguments of a container attempt: its plan, the image's digest, the ports it may reach."""
    job = run.job
    ports: tuple[int, ...] = ()
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ContainerRuntimeError(
                f"the container runtime reaches only an Object Storage endpoint on this host's loopback; the run's is "
                f"{parsed.scheme}://{parsed.hostname}:{parsed.port or ''} (set [sat] local_runtime = host for it)")
        ports = (parsed.port or (443 if parsed.scheme == "https" else 80),)
    pulled: list[str] = []  # what the pull said goes into the job's log too, after its header

    def note(line: str) -> None:
        log(line)
        pulled.append(line)

    digest = prepare_image(job.image.url, note, job_pull_login(job))
    # the training's uid in its user namespace writes them (ADR 0035); the attempt's series folder too, which the
    # metrics sidecar (this host's root) would otherwise make first
    series_dirs = [run.metrics_dir / Path(series_path(plan.attempt, n, "training")).parent for n in nodes or [node]]
    for path in (run.output_dir, run.code_dir, run.metrics_dir, *series_dirs):
        writable_by_container(path)
    resources = job.resources
    plan_ = ContainerPlan(
        image=job.image.url,
        name=container_name(f"{job.name}-{run.run_id}", plan.attempt),
        mounts=(Mount(run.data_dir, POD_DATA_DIR), Mount(run.code_dir, POD_CODE_DIR, writable=True),
                Mount(run.output_dir, POD_OUTPUT_DIR, writable=True), Mount(run.vendor_dir, IMAGE_VENDOR_DIR),
                Mount(run.metrics_dir, POD_METRICS_DIR, writable=True)),
        workdir=POD_CODE_DIR,
        memory_bytes=quantity_bytes(resources.memory),
        cpus=float(parse_quantity(resources.cpu)),
        shm_bytes=quantity_bytes(resources.shared_memory),
        gpus=resources.gpus_per_node,
        labels={"sat.ai/job": job.name, "sat.ai/attempt": str(plan.attempt), "sat.ai/node": node},
    )
    return {"container": plan_, "image_digest": digest, "forward_ports": ports, "notes": pulled}


# A multi-node attempt's rendezvous: rank 0's torchrun listens here on its node's address (each node's network
# namespace is its own, so every run may use the same port).
MASTER_PORT = 29500


def rendezvous_env(rank: int, ranks: int, nproc_per_node: int) -> dict[str, str]:
    """Node `rank`'s rendezvous environment in a multi-node attempt, the names a Kubernetes pod has (and torchrun's
    `PET_*` defaults): rank 0's static address on the attempt's network (`container_run.node_address`) as
    `MASTER_ADDR`. gloo and NCCL use the node's one interface (a node's hostname need not resolve to it)."""
    values = {"MASTER_ADDR": node_address(0), "MASTER_PORT": str(MASTER_PORT), "NODE_RANK": str(rank),
              "NNODES": str(ranks), "NPROC_PER_NODE": str(nproc_per_node)}
    return {**values, **{f"PET_{key}": value for key, value in values.items()},
            "GLOO_SOCKET_IFNAME": NODE_INTERFACE, "NCCL_SOCKET_IFNAME": NODE_INTERFACE}


def _per_node(run: JobRun, nodes: list[str], env: dict[str, str], plan: ContainerPlan) -> dict[str, object]:
    """The LocalAttempt arguments of a multi-node attempt in containers: rank 0's environment (`env`, updated in
    place) and plan, and a `PeerNode` for each other node: its container (name, hostname, labels) and environment
    (its node's name, its rank; the rest the attempt's)."""
    job = run.job
    nproc = 1 if job.elastic is not None else max(job.resources.gpus_per_node, 1)  # elastic: a rank per node held
    own = {key: value for key, value in job.env.items() if key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    env.update({**rendezvous_env(0, len(nodes), nproc), **own})
    peers = [PeerNode(node=name, env={**env, NODE_ENV: name, **rendezvous_env(rank, len(nodes), nproc), **own},
                      container=dataclasses.replace(plan, name=f"{plan.name}-r{rank}", hostname=name,
                                                    labels={**plan.labels, "sat.ai/node": name}))
             for rank, name in enumerate(nodes[1:], start=1)]
    return {"container": dataclasses.replace(plan, hostname=nodes[0]), "peers": peers,
            "run_key": f"{job.name}-{run.run_id}"}


def node_command(command: str, *, deepspeed: bool = False) -> str:
    """A multi-node attempt's command in each node's container: `python ...` as a multi-node `torchrun`.

    As a Kubernetes pod runs it (one container per node): the rendezvous on rank 0 from the node's
    environment (`rendezvous_env`); a DeepSpeed script's ranks start through `ckpt_engine.launch`.
    Any other command (a launcher, a script) runs as written and reads the same environment.
    """
    match = _PYTHON_COMMAND.match(command)
    if not match or _LAUNCHER_MODULE.match(match.group("rest")):
        return command
    entry = "-m ckpt_engine.launch " if deepspeed else ""
    return ('torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
            f'--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" {entry}{match.group("rest")}')


# `python [flags] script.py ...` or `python -m module ...`, not a launcher's own module (those run as written).
_PYTHON_COMMAND = re.compile(r"^\s*python(?:3(?:\.\d+)?)?(?:\s+-[uBOEsI]+)*\s+(?P<rest>-m\s+\S.*|[^-\s].*)$", re.DOTALL)
_LAUNCHER_MODULE = re.compile(r"^-m\s+(torch\.distributed\.(run|launch)|deepspeed|accelerate|ckpt_engine\.launch)\b")


def elastic_command(command: str, ranks: int, *, deepspeed: bool = False) -> str:
    """An elastic job's command on the local backend: `python ...` as `torchrun` with one rank per node held.

    The local "nodes" are this host, so the ranks meet on a standalone rendezvous (gloo on CPU,
    a free port each time); a DeepSpeed script's ranks start through `ckpt_engine.launch` (its
    `--local_rank`, as the Kubernetes backend starts them). Any other command (an explicit
    launcher, a shell script) runs as written and reads `SAT_NODES`, the number of nodes the
    attempt holds.
    """
    match = _PYTHON_COMMAND.match(command)
    if not match or _LAUNCHER_MODULE.match(match.group("rest")):
        return command
    entry = "-m ckpt_engine.launch " if deepspeed else ""
    return f"torchrun --standalone --nnodes=1 --nproc_per_node={ranks} {entry}{match.group('rest')}"

