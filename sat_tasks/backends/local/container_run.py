"""An attempt in the job's own image on this host: podman's arguments, the attempt's network, the image (ADR 0035).

The runner (`runner.LocalAttempt`) starts `podman run` where it would start `bash -c`; the
rest of its watch (faults, the heartbeat, stop requests, the final checkpoint's grace period)
is the same, because the container's processes carry the attempt's tag in their environment
and are found and signalled through `/proc` like a host attempt's. What this module adds:

- `ContainerPlan` / `podman_run_args`: the job's image with the spec's resources as limits
  (memory, CPUs, `/dev/shm`, a pids limit, GPUs as CDI devices), a non-root user in a mapped
  user namespace, no capabilities, no new privileges, a read-only root filesystem, and only
  the run's own directories mounted, at the paths a Kubernetes pod has (`runtime_env.POD_*`).
  PID 1 is catatonit with `-g`: a SIGTERM to the container reaches the command's whole process
  group, as the local runner's host mode and the pod's supervisor pass it on.
- `AttemptNetwork`: the attempt's own network namespace with nothing in it but loopback, where
  the run's Object Storage endpoint (and nothing else) is forwarded from the host: the training
  reaches its store at the address it was given, and no metadata DB, API server, registry,
  other host port or outside address.
- `RunNetwork`: a multi-node attempt's network, one such namespace per node (a container each), joined by a
  switch of their own: the nodes reach one another's static addresses (`node_address`, the rendezvous on
  rank 0's) and their store, nothing else (no host bridge, no route, no podman network: ADR 0035).
- `prepare_image`: the image in the project's store, pulled with the job's own registry login
  when it is not there, its digest recorded on the attempt.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import socket
import struct
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.backends.local.containers import podman, podman_env
from sat_tasks.core.handoffs import Log
from sat_tasks.errors import SatError

# The user a training runs as inside its container, and the host ids its user namespace maps to: root in the
# container is HOST_ID_BASE on the host, the training's uid 1000 is HOST_ID_BASE + 1000, neither a user of this host.
CONTAINER_UID = 1000
CONTAINER_GID = 1000
HOST_ID_BASE = 200000
ID_RANGE = 65536
PIDS_LIMIT = 4096
INIT_PATH = "/usr/bin/catatonit"  # static: bind-mounted into any image as its PID 1
CONTAINER_INIT = "/run/sat-init"
CONTAINER_HOME = "/tmp"  # the image's root filesystem is read-only; /tmp is the container's own tmpfs
CLONE_NEWNET = 0x40000000


class ContainerRuntimeError(SatError, RuntimeError):
    """The container runtime cannot run this attempt (not installed, not permitted): the message says what to do."""


class ImagePullError(SatError, RuntimeError):
    """The job's image could not be pulled: the registry's or podman's own words are in the message."""


@dataclass(frozen=True)
class Mount:
    """A host directory in the container: `source` (host) at `target`, read-only unless `writable`."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class ContainerPlan:
    """How one attempt's container is started (`podman_run_args`)."""

    image: str
    name: str
    mounts: tuple[Mount, ...]
    workdir: str
    memory_bytes: int
    cpus: float
    shm_bytes: int
    gpus: int = 0
    network_ns: str | None = None  # a path to the attempt's network namespace (AttemptNetwork.path); None: none
    labels: dict[str, str] = field(default_factory=dict)
    hostname: str | None = None  # a node of a multi-node attempt: its local node's name (`--hostname`)


def podman_run_args(plan: ContainerPlan, command: str, env_names: Sequence[str] = (),
                    cid_file: Path | None = None) -> list[str]:
    """`podman run` arguments for `plan`, ending with the command (`bash -lc COMMAND`, as a pod runs it).

    `env_names` are passed by name (`--env NAME`): podman takes each value from its own
    environment, so no value (the attempt's credentials among them) is on a command line.
    """
    args = [
        "run", "--rm", "--name", plan.name, "--pull=never", "--replace",
        "--user", f"{CONTAINER_UID}:{CONTAINER_GID}",
        "--uidmap", f"0:{HOST_ID_BASE}:{ID_RANGE}", "--gidmap", f"0:{HOST_ID_BASE}:{ID_RANGE}",
        "--cap-drop=all", "--security-opt=no-new-privileges", "--read-only",
        "--network", f"ns:{plan.network_ns}" if plan.network_ns else "none",
        "--memory", str(plan.memory_bytes), "--memory-swap", str(plan.memory_bytes),
        "--cpus", f"{plan.cpus:g}", "--shm-size", str(plan.shm_bytes), "--pids-limit", str(PIDS_LIMIT),
        "--workdir", plan.workdir,
        "--volume", f"{INIT_PATH}:{CONTAINER_INIT}:ro",
        "--entrypoint", json.dumps([CONTAINER_INIT, "-g", "--"]),
        "--log-driver", "none",  # the runner reads the output from podman's stdout: one copy, in the job's log
    ]
    for mount in plan.mounts:
        args += ["--volume", f"{mount.source}:{mount.target}:{'rw' if mount.writable else 'ro'}"]
    for index in range(plan.gpus):  # CDI (`nvidia-ctk cdi generate` on a GPU host), as the device plugin hands them
        args += ["--device", f"nvidia.com/gpu={index}"]
    for name in env_names:
        args += ["--env", name]
    if plan.hostname:
        args += ["--hostname", plan.hostname]
    if cid_file is not None:
        args += ["--cidfile", str(cid_file)]
    for key, value in sorted(plan.labels.items()):
        args += ["--label", f"{key}={value}"]
    return [*args, plan.image, "bash", "-lc", command]


def container_user() -> tuple[int, int]:
    """The host uid and gid of the container's training user (what its files on a mounted directory belong to)."""
    return HOST_ID_BASE + CONTAINER_UID, HOST_ID_BASE + CONTAINER_GID


def writable_by_container(path: Path) -> None:
    """Make `path` (a run directory a container writes) belong to the container's training user on the host."""
    uid, gid = container_user()
    path.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            try:
                os.lchown(name, uid, gid)
            except FileNotFoundError:
                continue


def container_name(run_key: str, attempt: int) -> str:
    """A container name of the attempt (podman's rules: [a-zA-Z0-9][a-zA-Z0-9_.-]*)."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_key).strip("-.")[:80] or "run"
    return f"sat-{safe}-a{attempt}"


# ---- the image ----------------------------------------------------------------------------------------------
def local_image_digest(image: str) -> str | None:
    """The digest of `image` in the project's store (None: not there)."""
    found = podman(["image", "inspect", "--format", "{{.Digest}}", image], check=False, timeout=60)
    return found.stdout.strip() or None if found.returncode == 0 else None


@dataclass(frozen=True)
class PullLogin:
    """How the job's image is pulled: its registry login (None: the project's store only), TLS and trust."""

    registry: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_verify: bool = True
    cert_dir: Path | None = None  # a folder of CA certificates (*.crt) podman trusts for this pull


def job_pull_login(job, get_connection=None) -> PullLogin:
    """The job's pull login: its own registry connection or a shared one (the image check's rule), for the host
    that connection names only; `[sat] registry_ca_file` as the trusted CA. JobStopped-like SatErrors as
    ImagePullError when the job names a login it may not use."""
    from sat_tasks.config import sat_setting, shared_registry_connections
    from sat_tasks.io.registry import (
        RegistryLoginRefused,
        parse_image_reference,
        registry_access_from_connection,
    )
    from sat_tasks.spec.model import registry_conn_id_problem

    cert_dir = _trusted_ca_dir(sat_setting("registry_ca_file", ""))
    conn_id = job.image.registry_conn_id
    if not conn_id:
        return PullLogin(tls_verify=not job.image.insecure, cert_dir=cert_dir)
    problem = registry_conn_id_problem(job, shared_registry_connections())
    if problem:
        raise ImagePullError(f"no pull with registry login {conn_id!r}: {problem}")
    if get_connection is None:
        from airflow.sdk import BaseHook

        get_connection = BaseHook.get_connection
    try:
        access = registry_access_from_connection(get_connection(conn_id), job.image.url, conn_id)
    except RegistryLoginRefused as exc:
        raise ImagePullError(str(exc)) from None
    return PullLogin(registry=parse_image_reference(job.image.url).registry, username=access.username,
                     password=access.password, tls_verify=not (access.insecure or job.image.insecure), cert_dir=cert_dir)


def _trusted_ca_dir(ca_file: str) -> Path | None:
    """A 0700 folder holding only `ca_file` as `ca.crt` (podman's `--cert-dir`), beside the image store."""
    if not ca_file:
        return None
    from sat_tasks.backends.local.containers import containers_dir

    source = Path(ca_file).expanduser()
    if not source.is_file():
        raise ImagePullError(f"[sat] registry_ca_file: {source} is not a file")
    folder = containers_dir() / "trust"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    target = folder / "ca.crt"
    data = source.read_bytes()
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)
    return folder


def prepare_image(image: str, log: Log, login: PullLogin | None = None, *, tries: int = 3) -> str:
    """The image's digest, pulled first with the job's login when it has one.

    A job with a registry login always pulls (its login must grant the image, as a kubelet's pull
    with an imagePullSecret does: an image in the store is no proof); one without uses the project's
    store, where `make image` puts SAT's image. The login goes to podman in a 0600 auth file in a
    0700 folder, removed when the pull ends, never on its command line. `tries` pulls, then
    ImagePullError with podman's (the registry's) own words.
    """
    login = login or PullLogin()
    if not login.username and not login.password and not login.registry:
        digest = local_image_digest(image)
        if digest is None:
            raise ImagePullError(f"image {image} is not in this host's image store and the job has no registry "
                                 "login to pull it with: build it (`make image` builds SAT's) or give the job a "
                                 "registry connection (image.registry_conn_id)")
        return digest
    import base64
    import tempfile

    last = "no output"
    for attempt in range(1, tries + 1):
        with tempfile.TemporaryDirectory(prefix="sat-pull-") as folder:
            authfile = Path(folder) / "auth.json"
            auths = {}
            if login.username or login.password:
                token = base64.b64encode(f"{login.username or ''}:{login.password or ''}".encode()).decode()
                auths[login.registry] = {"auth": token}
            fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"auths": auths}, handle)
            args = ["pull", "--quiet", "--authfile", str(authfile), f"--tls-verify={str(login.tls_verify).lower()}"]
            if login.cert_dir is not None:
                args += ["--cert-dir", str(login.cert_dir)]
            pulled = podman([*args, image], check=False, timeout=1800)
        if pulled.returncode == 0:
            digest = local_image_digest(image)
            if digest:
                log(f"[sat] pulled {image} ({digest}) with the job's registry login")
                return digest
        words = [line.strip() for line in (pulled.stderr or pulled.stdout or "").splitlines() if line.strip()]
        last = (words[-1] if words else "no output")[:500]
        if login.password:
            last = last.replace(login.password, "***")
        log(f"[sat] pulling {image} failed (try {attempt} of {tries}): {last}")
    raise ImagePullError(f"Back-off pulling image {image!r}: {last}")


# ---- the attempt's network ----------------------------------------------------------------------------------
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _bring_up_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, 0x8913, request))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(sock, 0x8914, struct.pack("16sh", b"lo", flags | 0x1))  # SIOCSIFFLAGS: IFF_UP


def _in_network(path: str, work):
    """Run `work()` in a thread that has joined the network namespace at `path`; its result (or its exception)."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if _libc().setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
            finally:
                os.close(fd)
            result["value"] = work()  # this thread ends here: the namespace goes with it
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result["error"] = exc

    thread = threading.Thread(target=target, name="sat-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result.get("value")


class AttemptNetwork:
    """A network namespace of the attempt's own: loopback only, with `ports` of the host's loopback forwarded in.

    A holder process keeps the namespace (podman joins it with `--network ns:PATH`); each
    forwarded port listens on 127.0.0.1 inside it and connects to the same port on the host's
    loopback, so an endpoint the training was given (`http://127.0.0.1:PORT`) works unchanged, and
    every other address is unreachable. Needs root (setns); use as a context manager.
    """

    def __init__(self, ports: Sequence[int], name: str = "sat-attempt-net") -> None:
        self.ports = [int(p) for p in ports]
        self.name = name  # the holder's name in `ps` (its shell's $0)
        self.holder: subprocess.Popen | None = None
        self._listeners: list[socket.socket] = []
        self._closed = threading.Event()

    @property
    def path(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def __enter__(self) -> AttemptNetwork:  # noqa: PYI034 - the class is not meant to be subclassed
        self.holder = _namespace_holder(self.name)
        try:
            _in_network(self.path, _bring_up_loopback)
            for port in self.ports:
                listener = _in_network(self.path, lambda port=port: _listen(port))
                self._listeners.append(listener)
                threading.Thread(target=self._accept, args=(listener, port), name=f"sat-fwd-{port}",
                                 daemon=True).start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        for listener in self._listeners:
            try:
                listener.close()
            except OSError:
                pass
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(timeout=10)

    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self._closed.is_set():
            try:
                inside, _ = listener.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(("127.0.0.1", port), timeout=30)
                outside.settimeout(None)
            except OSError:
                inside.close()
                continue
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=_pump, args=(a, b), name="sat-fwd-pump", daemon=True).start()


def _namespace_holder(name: str) -> subprocess.Popen:
    """A process in a new network namespace of its own (`unshare --net`), kept while this process lives.

    Its shell's $0 is `name` (what `ps` shows). The namespace goes with the holder, however the
    runner ends: a SIGKILLed launch task leaves no namespace (and no interface in it) behind.
    """
    if os.geteuid() != 0:
        raise ContainerRuntimeError("the container runtime's network isolation needs root (it joins the "
                                    "attempt's network namespace); run the service as root or set "
                                    "[sat] local_runtime = host")
    keep = f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 2; done"
    holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", keep, name], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    path, own = f"/proc/{holder.pid}/ns/net", os.readlink("/proc/self/ns/net")
    for _ in range(1000):  # unshare has made its namespace once the holder's link differs from ours
        try:
            if os.readlink(path) != own:
                return holder
        except FileNotFoundError:
            pass
        if holder.poll() is not None:
            raise ContainerRuntimeError(f"could not make the attempt's network namespace: "
                                        f"{(holder.stderr.read() or b'').decode(errors='replace')[:300]}")
        threading.Event().wait(0.01)
    holder.kill()
    holder.wait(timeout=10)
    raise ContainerRuntimeError("could not make the attempt's network namespace: unshare did not make it in 10 s")


# ---- a multi-node attempt's network ------------------------------------------------------------------------
# The nodes' addresses on their run's switch. Every run has a switch of its own (a namespace no other run can
# join, with no way out), so all runs use the same numbers without ever meeting.
RUN_SUBNET_PREFIX = "10.213.0"
RUN_SUBNET_BITS = 24
RUN_MAX_NODES = 250
NODE_INTERFACE = "eth0"  # the node's one interface besides loopback (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)
SWITCH_BRIDGE = "sat-switch"


def node_address(index: int) -> str:
    """The static address of node `index` (0: the rendezvous host) on its run's network."""
    if not 0 <= index < RUN_MAX_NODES:
        raise ValueError(f"a run's network has nodes 0..{RUN_MAX_NODES - 1}, not {index}")
    return f"{RUN_SUBNET_PREFIX}.{index + 2}"


def network_name(run_key: str, attempt: int) -> str:
    """The name of attempt `attempt`'s network of run `run_key` (its holders' name in `ps`, the job's log)."""
    return container_name(run_key, attempt).replace("sat-", "sat-net-", 1)


def run_network_commands(switch_pid: int, node_pids: Sequence[int]) -> list[list[str]]:
    """The `ip` commands (argument lists, through `nsenter`) that wire the nodes' namespaces to the switch's.

    The switch namespace gets a bridge; each node a veth pair, its `eth0` end in the node's namespace with
    its static address, the other end on the bridge. Nothing is made in this host's namespace: no
    interface, no address, no route, no firewall rule; the switch has no way out.
    """
    switch = ["nsenter", f"--net=/proc/{switch_pid}/ns/net", "--", "ip"]
    commands = [[*switch, "link", "add", SWITCH_BRIDGE, "type", "bridge"],
                [*switch, "link", "set", SWITCH_BRIDGE, "up"]]
    for index, pid in enumerate(node_pids):
        node = ["nsenter", f"--net=/proc/{pid}/ns/net", "--", "ip"]
        port = f"n{index}"
        commands += [
            [*switch, "link", "add", port, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", str(pid)],
            [*switch, "link", "set", port, "master", SWITCH_BRIDGE, "up"],
            [*node, "addr", "add", f"{node_address(index)}/{RUN_SUBNET_BITS}", "dev", NODE_INTERFACE],
            [*node, "link", "set", NODE_INTERFACE, "up"],
        ]
    return commands


class RunNetwork:
    """A multi-node attempt's network: one `AttemptNetwork` per node (loopback, the store forwarded in), joined.

    The nodes' namespaces are wired to a switch namespace of the attempt's own (`run_network_commands`):
    node `i` is `node_address(i)` on `eth0`, reaches the other nodes and, on its loopback, the run's
    Object Storage; nothing else (no route, no address on this host). Made when the attempt starts,
    gone when it ends (the namespaces go with their holders). Needs root and `ip` (iproute2).
    """

    def __init__(self, ports: Sequence[int], nodes: int, name: str) -> None:
        if nodes < 2:
            raise ValueError("a run network joins two nodes or more")
        self.name = name
        self.nodes = [AttemptNetwork(ports, f"{name}-n{i}") for i in range(nodes)]
        self.switch: subprocess.Popen | None = None

    @property
    def paths(self) -> list[str]:
        return [node.path for node in self.nodes]

    @property
    def addresses(self) -> list[str]:
        return [node_address(i) for i in range(len(self.nodes))]

    def __enter__(self) -> RunNetwork:  # noqa: PYI034 - the class is not meant to be subclassed
        import shutil

        if shutil.which("ip") is None or shutil.which("nsenter") is None:
            raise ContainerRuntimeError("a multi-node job's network needs `ip` (iproute2) and `nsenter` "
                                        "(util-linux) on this host: install them, or set [sat] local_runtime = host")
        try:
            self.switch = _namespace_holder(self.name)
            for node in self.nodes:
                node.__enter__()
            for command in run_network_commands(self.switch.pid, [n.holder.pid for n in self.nodes if n.holder]):
                done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
                if done.returncode != 0:
                    raise ContainerRuntimeError(f"could not wire the run network {self.name}: {command[4:]}: "
                                                f"{(done.stderr or done.stdout).strip()[:300]}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            node.__exit__(None, None, None)
        if self.switch is not None and self.switch.poll() is None:
            self.switch.kill()
            self.switch.wait(timeout=10)


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


# ---- what the kernel says of an OOM kill --------------------------------------------------------------------
def oom_kills(container_id: str, kmsg: Path = Path("/dev/kmsg")) -> list[str]:
    """The kernel's OOM-killer records for the container's own memory cgroup (read from `kmsg`, non-blocking).

    podman's `State.OOMKilled` sees only PID 1's kill; a killed child (the training under bash) is
    in the kernel's `oom-kill:` record, whose `oom_memcg` names the container's cgroup, as the
    kubelet's OOM watcher reads it.
    """
    if not container_id:
        return []
    found: list[str] = []
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", errors="replace")
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: go on with the next record
                    continue
                break
            if not record:
                break
            message = record.split(";", 1)[-1].strip()
            if ("oom-kill:" in message and container_id in message) or (
                    "Memory cgroup out of memory" in message and found):
                found.append(message[:1000])
    finally:
        os.close(fd)
    return found


def remove_container(name: str) -> None:
    """Remove the container `name` if it is still there (its processes are gone; `--rm` may not have run yet)."""
    podman(["rm", "--force", "--ignore", "--time", "0", name], check=False, timeout=60)


__all__ = [
    "AttemptNetwork",
    "ContainerPlan",
    "ContainerRuntimeError",
    "ImagePullError",
    "Mount",
    "RunNetwork",
    "container_name",
    "local_image_digest",
    "network_name",
    "node_address",
    "oom_kills",
    "podman_env",
    "podman_run_args",
    "prepare_image",
    "remove_container",
    "writable_by_container",
]


# ---- which runtime -----------------------------------------------------------------------------------------
RUNTIMES = ("host", "container", "auto")


def chosen_runtime() -> str:
    """`host` or `container`: `[sat] local_runtime` (`auto`: container where podman is installed and SAT runs as
    root), checked against `[sat] local_host_mode`; ContainerRuntimeError naming the setting when it cannot be
    honoured."""
    from sat_tasks.backends.local.containers import podman_installed
    from sat_tasks.config import sat_setting

    wanted = (sat_setting("local_runtime") or "host").strip().lower()
    if wanted not in RUNTIMES:
        raise ContainerRuntimeError(f"[sat] local_runtime: must be one of {', '.join(RUNTIMES)}, not {wanted!r}")
    if wanted == "auto":  # the attempt's network and id mapping need root (AttemptNetwork, writable_by_container)
        wanted = "container" if podman_installed() and os.geteuid() == 0 else "host"
    if wanted == "container" and not podman_installed():
        raise ContainerRuntimeError("[sat] local_runtime = container, but podman (with runc) is not installed on "
                                    "this host: `make system-deps` installs them")
    host_mode = (sat_setting("local_host_mode") or "allowed").strip().lower()
    if wanted == "host" and host_mode == "forbidden":
        raise ContainerRuntimeError("[sat] local_host_mode = forbidden: attempts may run only in their image "
                                    "(set [sat] local_runtime = container and install podman)")
    return wanted
