"""The warm pool on the local backend: the staged directory and the node slot a finished run keeps (ADR 0015).

`keep_warm` leaves the run's staged data directory where it is (the next run links its
unchanged files instead of downloading them) and holds the node the last attempt ran on;
`release_warm` deletes the directory (only below `[sat] work_dir`) and lets the node go.
`release_for_capacity` is what a workspace's queue calls when warm states hold the nodes
a waiting job needs. `warm_command` also runs a failover's attempt in the run's standby
interpreter (`standby_eligible`, ADR 0031).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sat_tasks import config
from sat_tasks.core.handoffs import Log
from sat_tasks.core.runtime_env import process_environment
from sat_tasks.core.warm_pool import WarmState
from sat_tasks.io import warm_pool
from sat_tasks.io.run_layout import JobRun

# The framework a warm interpreter imports ahead of the next run ([sat] warm_pool_preload; "none": no interpreter).
DEFAULT_PRELOAD = "torch,datasets,tokenizers,transformers,transformers.trainer,accelerate"
_PYTHON_SCRIPT = re.compile(r"^\s*python3?\s+(?=\S+\.py(?:\s|$))")


def keep_warm(run: JobRun, state: WarmState, log: Log) -> WarmState:
    """The state with the run's staged directory and, where the job allows one, a warm interpreter.

    The nodes are the pipeline's (where the last attempt ran). An interpreter this run took
    over is kept (its deadline moved); else one is started (`warm_interpreter serve`).
    """
    from sat_tasks.backends.local import warm_interpreter

    update: dict = {"data_dir": str(run.data_dir)}
    if interpreter_eligible(run.job):
        handed = _handed_over(run)
        if handed and warm_interpreter.extend(handed["socket"], state.expires_at):
            update.update(interpreter_pid=handed["pid"], interpreter_socket=handed["socket"])
            log(f"warm pool: warm interpreter pid {handed['pid']} kept for the next run")
        else:
            update.update(_start_interpreter(run, state.expires_at))
            log(f"warm pool: warm interpreter pid {update['interpreter_pid']} started "
                f"(imports {_preload()} for the next run)")
    return state.model_copy(update=update)


def interpreter_eligible(job) -> bool:
    """A warm interpreter serves a one-node job whose command is `python SCRIPT.py ...`, without injected faults.

    A fault's SIGSTOP would stop the attempt's process but not the child training in the
    interpreter, so fault-injection jobs start cold.
    """
    return (job.nodes == 1 and not job.faults and _preload() != "none"
            and bool(_PYTHON_SCRIPT.match(job.command)))


def warm_command(run: JobRun, command: str) -> str:
    """The attempt's command: through the warm interpreter this run took over, or its failover standby; else as it is."""
    if run.job.warm_pool is not None and interpreter_eligible(run.job):
        handed = _handed_over(run)
        if handed and _alive(handed["pid"]):
            return _through(handed["socket"], command)
    if standby_eligible(run.job):
        return _through_standby(run, command)
    return command


def _through(socket: str, command: str) -> str:
    from sat_tasks.backends.local import warm_interpreter

    rest = _PYTHON_SCRIPT.sub("", command, count=1)
    # by its file, not `-m`: the client imports the standard library only, not sat_tasks' packages (0.6 s)
    return (f"{shlex.quote(sys.executable)} {shlex.quote(warm_interpreter.__file__)} run "
            f"--socket {shlex.quote(socket)} -- {rest}")


# ---- the failover standby (ADR 0031) ------------------------------------------------------------
#: How long a standby stays after the launch that owns it is gone: the verdict, the decision and the next launch.
STANDBY_GRACE_S = 300.0
#: `failover_warm_interpreter = auto`: a standby starts only while the host has this much memory available
#: (it holds ~0.5-1 GB with torch and transformers imported).
STANDBY_MIN_AVAILABLE_BYTES = 4 << 30
#: How long a standby waits, as a bare interpreter, before it imports the framework: an attempt that fails
#: sooner (most of the test suite's) never has one importing beside it, and a fault that early loses little.
STANDBY_DELAY_S = 60.0


def standby_enabled() -> bool:
    """`[sat] failover_warm_interpreter`: true, false, or auto (the default: while memory is plentiful)."""
    value = config.sat_setting("failover_warm_interpreter").strip().lower()
    if value == "auto":
        available = _memory_available()
        return available is not None and available >= STANDBY_MIN_AVAILABLE_BYTES
    return value in ("1", "true", "yes", "on")


def _memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def standby_eligible(job) -> bool:
    """A failover job gets a standby warm interpreter for its next attempt (`[sat] failover_warm_interpreter`).

    The job's first attempt starts one beside it (imports at SCHED_IDLE); a failover's attempt
    runs its script in it instead of a new interpreter, as `interpreter_eligible`'s jobs do,
    and with the same limits: one node, `python SCRIPT.py ...`. An injected hang (SIGSTOP)
    would stop the client but not the child, so a job with one starts cold; a hardware fault
    or a node loss (SIGKILL) ends the child with its client, and a preemption's SIGTERM is
    forwarded to it.
    """
    from sat_tasks.spec.model import FaultKind

    return (bool(job.job_failover) and job.nodes == 1 and bool(_PYTHON_SCRIPT.match(job.command))
            and not any(f.kind is FaultKind.HANG for f in job.faults) and _preload() != "none" and standby_enabled())


def standby_socket_path(run: JobRun) -> str:
    """The standby's socket: one per run (`socket_path`'s directory and rules)."""
    key = f"{config.work_dir()}/{run.job.name}/{run.run_id}/standby"
    return os.path.join(os.path.dirname(socket_path(run.job)), f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock")


def _through_standby(run: JobRun, command: str) -> str:
    """Through the run's standby when it is ready (this launch then owns it); else this attempt starts cold.

    A standby still importing is left to it, on idle CPU, for the next failover: asking it
    would hurry it to normal priority into this attempt's way (`warm_interpreter.is_ready`).
    With none running, one starts: it imports once this launch has run `STANDBY_DELAY_S`, and
    exits if the launch ends sooner. The standby stays while the launch that owns it runs, and
    `STANDBY_GRACE_S` after; each launch that uses it takes it over, so it outlives every
    attempt of the run by that much at most.
    """
    from sat_tasks.backends.local import warm_interpreter

    path = standby_socket_path(run)
    if warm_interpreter.is_ready(path):
        if warm_interpreter.extend(path, time.time() + STANDBY_GRACE_S, owner=os.getpid()):
            return _through(path, command)
    elif _standby_pids(path):
        return command
    _serve(run, path, time.time() + STANDBY_GRACE_S, "--owner", str(os.getpid()), "--grace", str(STANDBY_GRACE_S),
           "--delay", str(STANDBY_DELAY_S))
    return command


def _serve(run: JobRun, path: str, until: float, *options: str) -> int:
    """Start a warm interpreter server for `run` on the socket `path` (detached); its pid.

    Not the service's environment: a run's child keeps the server's in /proc/<pid>/environ (its
    os.environ is replaced by the run's, the memory the kernel shows is not).
    """
    from sat_tasks.backends.local import warm_interpreter

    env = process_environment({**run.job.env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}, os.environ)
    return spawn_detached([sys.executable, "-m", warm_interpreter.__name__, "serve", "--socket", path,
                           "--preload", _preload(), "--until", str(until), *options], env)


def spawn_detached(argv: list[str], env: dict[str, str]) -> int:
    """Start `argv` in a session of its own, adopted at once by init (not this process's child); its pid.

    A launch task leaves the standby (and the warm pool's task its warm interpreter) running when it
    ends. As the task process's child it made Airflow's supervisor see the task's end up to `[workers]
    min_heartbeat_interval` late: under `make up` a failed launch that had started a standby ended in the
    metadata DB 5.1 s after its last log line, one without 0.06 s (bench_service.py's failover, ADR 0031).
    `sh` starts it in the background and exits at once (its stdout carries the pid, nothing else), so the
    task process never has it as a child. No file descriptor of this process reaches it (close_fds).
    """
    started = subprocess.run(["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "sh", *argv],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True, check=True, text=True, timeout=60)
    return int(started.stdout.strip())


def _standby_pids(socket: str) -> list[int]:
    """The processes serving the standby socket `socket` (found by it in their command line)."""
    path, pids = socket.encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and path in cmdline and any(b"warm_interpreter" in part for part in cmdline):
            pids.append(int(entry))
    return pids


def release_standby(run: JobRun) -> list[str]:
    """Stop the run's standby interpreter, if one runs (SIGTERM); `process/warm-interpreter-<pid>`.

    Found by its socket in its command line: it is nobody's warm state, only the run's.
    """
    released = []
    for pid in _standby_pids(standby_socket_path(run)):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        released.append(f"process/warm-interpreter-{pid}")
    return released


def _preload() -> str:
    return config.sat_setting("warm_pool_preload", DEFAULT_PRELOAD)


def _handed_over(run: JobRun) -> dict | None:
    return _reused(run).get("interpreter")


_REUSED: list[tuple[JobRun, dict]] = []  # the launch's JobRun -> its `reused`: one read for the node and the command


def _reused(run: JobRun) -> dict:
    """What the run took over (`warm.json`'s `reused`), read once per JobRun object (a launch makes one)."""
    for known, reused in _REUSED:
        if known is run:
            return reused
    reused = warm_pool.read_run_record(run.hook(), run.results_uri).get("reused") or {}
    _REUSED[:] = [*_REUSED[-7:], (run, reused)]
    return reused


def socket_path(job) -> str:
    """A short Unix socket path (108 bytes at most) per work dir, workspace and job.

    In `sat-wi-<uid>/` under the temporary directory: the server makes it 0700 (and refuses
    one another user made first), its socket 0600 (`warm_interpreter.bind_private`).
    """
    key = f"{config.work_dir()}/{getattr(job, 'workspace', None) or '-'}/{job.name}"
    return os.path.join(tempfile.gettempdir(), f"sat-wi-{os.getuid()}",
                        f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.sock")


def _start_interpreter(run: JobRun, until: float) -> dict:
    path = socket_path(run.job)
    return {"interpreter_pid": _serve(run, path, until), "interpreter_socket": path}


def _alive(pid: int | None) -> bool:
    """Whether `pid` is a running warm interpreter (not a recycled pid of something else)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"warm_interpreter" in cmdline and b"serve" in cmdline


def release_interpreter(pid: int | None, socket: str | None) -> list[str]:
    """Stop a warm interpreter (SIGTERM: it exits at once when idle); `process/warm-interpreter-<pid>`."""
    released = []
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        released.append(f"process/warm-interpreter-{pid}")
    if socket and os.path.exists(socket) and not _alive(pid):
        os.unlink(socket)
    return released


def warm_node_first(run: JobRun, pool: list[str]) -> list[str]:
    """The pool with the node this run took over from the warm pool first (the pool as it is without one)."""
    if run.job.warm_pool is None:
        return pool
    nodes = _reused(run).get("nodes") or []
    return [n for n in nodes if n in pool] + [n for n in pool if n not in nodes]


def release_warm(state: WarmState, log: Log) -> list[str]:
    """Delete the kept staged directory and let the node(s) go; `directory/<path>`, `node/<name>` of each."""
    released = []
    if state.data_dir:
        path = Path(state.data_dir).resolve()
        work = config.work_dir().resolve()
        if path.is_relative_to(work) and path != work and path.exists():
            shutil.rmtree(path, ignore_errors=True)
            released.append(f"directory/{path}")
    released += release_interpreter(state.interpreter_pid, state.interpreter_socket)
    released += [f"node/{node}" for node in state.nodes]
    return released


def release_for_capacity(workspace: str, nodes_needed: int, log: Log = print) -> list[str]:
    """Release the workspace's warm states (local backend), oldest first, until `nodes_needed` nodes are free."""
    return warm_pool.release_for_capacity(workspace, nodes_needed, _hook(), warm_pool.warm_roots(), release_warm,
                                          backend="local", log=log)


def release_nodes_taken(workspace: str, nodes: list[str], job: str, log: Log = print) -> list[str]:
    """Release other jobs' warm states on `nodes` of `workspace`, which `job` has just taken (local backend)."""
    return warm_pool.release_nodes_taken(workspace, nodes, job, _hook(), warm_pool.warm_roots(), release_warm,
                                         backend="local", log=log)


def release_expired(log: Log = print) -> list[str]:
    """Release every expired warm state of the local backend (the sweep)."""
    return warm_pool.release_expired(_hook(), warm_pool.warm_roots(), release_warm, backend="local", log=log)


def _hook():
    from sat_tasks.io.object_storage import object_storage_hook

    return object_storage_hook(config.sat_setting("object_storage_conn_id"))
