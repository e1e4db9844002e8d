"""A warm interpreter for the local backend's warm pool: a Python process with the framework already imported.

On a warm node the next run's training process need not import torch and transformers
again (most of the demo's time from launch to the first step): `serve` imports them once
(`[sat] warm_pool_preload`) and forks one child per `run` request, which takes the
request's argv, environment, working directory and standard streams (passed as file
descriptors) and runs the script as `__main__`, as `python script.py` would.

`python -m sat_tasks.backends.local.warm_interpreter run --socket S -- script.py ARGS` is
what the attempt's command becomes (`sat_tasks.backends.local.warm.warm_command`): it stays
the attempt's process (the runner's process group, its exit status, its log pipe), forwards
SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 to the child and exits as the child did. The child
SIGKILLs itself when the client goes away (the runner's SIGKILL of the attempt reaches it
that way). Without a server on the socket the client runs the script itself, cold.
A SIGSTOP of the client does not stop the child: jobs with injected faults never get a
warm interpreter (`warm.interpreter_eligible`).

The socket is this user's alone: 0600 in a 0700 directory of theirs (`serve` refuses any other),
and each side checks the other's uid (SO_PEERCRED) before a byte of a request passes: a request
carries the run's environment (its Object Storage keys) and is run as this user.

`serve` exits at `--until` (the keep-alive deadline; `until` requests move it) once no
child runs, or on SIGTERM (`warm.release_warm`).
"""

from __future__ import annotations

import argparse
import array
import atexit
import importlib
import json
import os
import runpy
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from collections.abc import Sequence

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
BANNER = "[sat] warm pool: warm interpreter"


# ---- the server ------------------------------------------------------------------------------
def serve(socket_path: str, preload: Sequence[str], until: float, *, owner: int | None = None,
          grace: float = 0.0, delay: float = 0.0) -> int:
    """Bind the socket first (early clients queue), import `preload`, then fork a child per request.

    `owner`: a process (a launch task) for as long as which the server stays; once it is gone
    the deadline is at least `grace` seconds later (the next attempt's launch names itself
    the new owner with an `until` request). Without one, `until` alone decides.

    `delay`: seconds to wait, holding nothing but a bare interpreter, before importing (a failover
    job's standby, ADR 0031): the server exits instead if its owner ends first or on SIGTERM, and
    imports at once when a client connects.
    """
    server = bind_private(socket_path)
    server.listen(8)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        if not _waited(server, delay, owner, stopping):
            return 0
        loaded = _import_preload(server, preload)
        _mark_ready(socket_path)
        sys.stdout.flush()
        children: dict[int, socket.socket] = {}
        lease = {"owner": owner}
        while not stopping:
            _reap(children)
            if lease["owner"] is not None and not _pid_alive(lease["owner"]):
                lease["owner"] = None
                until = max(until, time.time() + grace)
            if not children and lease["owner"] is None and time.time() >= until:
                break
            ready, _, _ = select.select([server], [], [], 0.2)
            if not ready:
                continue
            conn, _ = server.accept()
            until = _handle(server, conn, children, loaded, until, lease)
    finally:
        server.close()
        for path in (ready_path(socket_path), socket_path):
            if os.path.exists(path):
                os.unlink(path)
    return 0


def _import_preload(server: socket.socket, preload: Sequence[str]) -> list[str]:
    """Import `preload` on idle CPU (hurried once a client waits); the modules that imported."""
    loaded = []
    _set_policy(getattr(os, "SCHED_IDLE", None))  # import on idle CPU: never slow the runs on this host
    _hurry_when_a_client_waits(server)
    for name in preload:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001, S112 - a module the job does not have is just not preloaded
            continue
    _set_policy(getattr(os, "SCHED_OTHER", None))  # the children train at normal priority
    return loaded


def _waited(server: socket.socket, delay: float, owner: int | None, stopping: list) -> bool:
    """Wait up to `delay` seconds; False when SIGTERM came or `owner` ended first, True otherwise.

    A client already queued ends the wait at once (it is waiting for the imports).
    """
    deadline = time.monotonic() + delay
    while (left := deadline - time.monotonic()) > 0:
        if stopping or (owner is not None and not _pid_alive(owner)):
            return False
        readable, _, _ = select.select([server], [], [], min(0.2, left))
        if readable:
            return True
    return not stopping


def ready_path(socket_path: str) -> str:
    """The file a server writes beside its socket once its imports are done (`is_ready`)."""
    return socket_path + ".ready"


def _mark_ready(socket_path: str) -> None:
    fd = os.open(ready_path(socket_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)


def is_ready(socket_path: str) -> bool:
    """Whether a server on `socket_path` has done its imports, asked without connecting.

    A connection would move a server that is still importing to normal priority (it takes a
    waiting client as a reason to hurry); a failover that finds it unready starts cold instead
    and leaves it importing on idle CPU.
    """
    return os.path.exists(ready_path(socket_path)) and os.path.exists(socket_path)


def bind_private(socket_path: str) -> socket.socket:
    """A Unix socket at `socket_path`, mode 0600, in a directory only this user may enter (0700, created so).

    An existing directory that is another user's, a link, or open to others is refused
    (PermissionError): whoever can write there could put their own socket in its place.
    """
    directory = os.path.dirname(os.path.abspath(socket_path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a private directory of uid {os.getuid()} (0700): "
                              "the warm interpreter does not serve there")
    if os.path.lexists(socket_path):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)  # no moment at which the socket is open to others
    try:
        server.bind(socket_path)
    finally:
        os.umask(umask)
    os.chmod(socket_path, 0o600)
    return server


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), None when unknown."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


def same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this process's user (root's peers too: root may do anything anyway)."""
    return peer_uid(conn) == os.getuid()


def _set_policy(policy: int | None) -> None:
    """Switch this process's scheduling policy (SCHED_IDLE <-> SCHED_OTHER needs no privilege on Linux)."""
    if policy is None:
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _pid_alive(pid: int) -> bool:
    """Whether `pid` is a running process (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _hurry_when_a_client_waits(server: socket.socket) -> None:
    """Import at normal priority once a client is queued: SCHED_IDLE imports starve on a busy host.

    A thread waits for the listening socket to become readable (a connection in its backlog)
    and moves the main thread, which is importing, to SCHED_OTHER.
    """
    main = threading.get_native_id()

    def watch() -> None:
        try:
            select.select([server], [], [])
        except (OSError, ValueError):
            return
        try:
            os.sched_setscheduler(main, os.SCHED_OTHER, os.sched_param(0))
        except (OSError, AttributeError):
            pass

    threading.Thread(target=watch, daemon=True, name="sat-warm-hurry").start()


def _handle(server: socket.socket, conn: socket.socket, children: dict, loaded: list[str], until: float,
            lease: dict | None = None) -> float:
    """Serve one request; returns the deadline (an `until` request moves it, and `lease`'s owner with it)."""
    if not same_user(conn):  # another user's process: not one byte read, nothing run for it
        conn.close()
        return until
    header, fds = _recv_request(conn)
    if header.get("op") == "until":
        if lease is not None and header.get("owner"):
            lease["owner"] = int(header["owner"])
        _send(conn, {"ok": True, "until": header["until"]})
        conn.close()
        return float(header["until"])
    if header.get("op") != "run" or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return until
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (covered through its output and exit status)
        server.close()
        os._exit(_child(conn, header, fds, loaded))
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    children[pid] = conn
    return until


def _reap(children: dict[int, socket.socket]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn = children.pop(pid)
            try:
                _send(conn, {"status": status})
            except OSError:
                pass
            conn.close()


def _child(conn: socket.socket, header: dict, fds: list[int], loaded: list[str]) -> int:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)

    def watch_client() -> None:  # the client is gone (killed with its attempt): go too
        try:
            conn.recv(1)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch_client, daemon=True, name="sat-warm-client").start()
    os.environ.clear()
    os.environ.update(header["env"])
    os.chdir(header["cwd"])
    argv = header["argv"]
    script = os.path.abspath(argv[0])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *extra, *[p for p in sys.path if p not in ("", ".")]]
    importlib.invalidate_caches()
    sys.argv = [script, *argv[1:]]
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    print(f"{BANNER}: {', '.join(loaded) or 'nothing'} already imported", file=sys.stderr, flush=True)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, status 1
        traceback.print_exc()
        code = 1
    _finish()
    return code


def _finish() -> None:
    """What interpreter shutdown does, in its order: threading's exit hooks (a ThreadPoolExecutor's workers
    are told to stop there) and the join of non-daemon threads, then atexit, then a flush."""
    threading._shutdown()  # the forking thread is this process's main thread
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


# ---- the wire ----------------------------------------------------------------------------------
def _send(conn: socket.socket, payload: dict) -> None:
    conn.sendall(json.dumps(payload).encode() + b"\n")


def _recv_line(conn: socket.socket) -> dict | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
        if not msg:
            break
        data += msg
    return (json.loads(data) if data else {}), list(fds)


def extend(socket_path: str, until: float, timeout: float = 5.0, *, owner: int | None = None) -> bool:
    """Move a running server's deadline to `until` (and its owner process to `owner`); False when none answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(socket_path)
            if not same_user(conn):
                return False
            request = {"op": "until", "until": until, **({"owner": owner} if owner else {})}
            conn.sendall(json.dumps(request).encode() + b"\n")
            return bool((_recv_line(conn) or {}).get("ok"))
    except OSError:
        return False


# ---- the client (the attempt's process) ---------------------------------------------------------
def run_client(socket_path: str, argv: list[str]) -> int:
    """Run `argv` (script and arguments) in a child of the warm server, or cold here when there is none."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        if not same_user(conn):  # the run's environment (its keys) goes to this user's server only
            raise PermissionError(f"the server on {socket_path} is another user's")
    except OSError as exc:
        conn.close()
        why = str(exc) if isinstance(exc, PermissionError) else f"none on {socket_path}"
        print(f"{BANNER}: {why}; starting cold", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, *argv])
    header = {"op": "run", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(conn, [json.dumps(header).encode() + b"\n"], [0, 1, 2])
    answer = _recv_line(conn)
    if not answer or "pid" not in answer:
        return 1
    pid = int(answer["pid"])
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: _forward(pid, number))
    result = _recv_line(conn)
    if result is None:  # the server went away: the child's status is lost
        return 1
    status = int(result["status"])
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sat_tasks.backends.local.warm_interpreter")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("--socket", required=True)
    serve_p.add_argument("--preload", default="")
    serve_p.add_argument("--until", type=float, required=True)
    serve_p.add_argument("--owner", type=int, default=None, help="stay while this process lives")
    serve_p.add_argument("--grace", type=float, default=0.0, help="seconds to stay after the owner is gone")
    serve_p.add_argument("--delay", type=float, default=0.0,
                         help="seconds to wait before importing; exit instead if the owner ends first")
    run_p = sub.add_parser("run")
    run_p.add_argument("--socket", required=True)
    run_p.add_argument("script", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.socket, [m for m in args.preload.split(",") if m], args.until, owner=args.owner,
                     grace=args.grace, delay=args.delay)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    return run_client(args.socket, script)


if __name__ == "__main__":
    sys.exit(main())
