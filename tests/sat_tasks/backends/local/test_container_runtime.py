"""The local backend's container runtime (ADR 0035): an attempt in an image, isolated, with the runner's watch.

These run real containers with podman against the Debian base image `make image` builds
(`localhost/sat/debian-base:bookworm`, which `make test` builds first). Where podman is not
installed at all they are skipped, saying so; where it is installed and the image is missing,
they fail: the suite's set-up did not do its part.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from sat_tasks.backends.local.container_run import (
    HOST_ID_BASE,
    ContainerPlan,
    ContainerRuntimeError,
    Mount,
    chosen_runtime,
    container_name,
    local_image_digest,
    podman_run_args,
    writable_by_container,
)
from sat_tasks.backends.local.containers import podman, podman_installed
from sat_tasks.backends.local.runner import LocalAttempt
from sat_tasks.classify import classify
from sat_tasks.core.handoffs import VerdictKind
from sat_tasks.spec import Fault
from tests.support.tcp_listener import Listener

BASE_IMAGE = "localhost/sat/debian-base:bookworm"

needs_podman = pytest.mark.skipif(not podman_installed(), reason="podman/runc not installed: `make system-deps`")


@pytest.fixture(scope="module")
def base_image() -> str:
    if local_image_digest(BASE_IMAGE) is None:
        pytest.fail(f"{BASE_IMAGE} is not in the project's image store: `make image` builds it (make test runs it)")
    return BASE_IMAGE


def plan_for(tmp_path: Path, name: str, *, memory_mb: int = 256, writable_out: bool = True) -> ContainerPlan:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (tmp_path / "code").mkdir(exist_ok=True)
    if writable_out:
        writable_by_container(out)
    return ContainerPlan(image=BASE_IMAGE, name=container_name(f"test-{name}-{os.getpid()}", 1),
                         mounts=(Mount(out, "/opt/sat/output", writable=True), Mount(tmp_path / "code", "/opt/sat/code")),
                         workdir="/opt/sat/code", memory_bytes=memory_mb << 20, cpus=1, shm_bytes=64 << 20)


def container_attempt(tmp_path: Path, plan: ContainerPlan, command: str, *, env=None, faults=(), ports=(),
                      stop_requested=None) -> LocalAttempt:
    return LocalAttempt(job="unit-job", attempt=1, node="n1", command=command, env=dict(env or {}),
                        cwd=tmp_path / "code", output_dir=tmp_path / "out", job_log=tmp_path / "job.log",
                        node_dir=tmp_path / "nodes" / "n1", image=plan.image, faults=list(faults),
                        heartbeat_timeout=120, startup_timeout=0, grace_seconds=15, poll_seconds=0.05,
                        container=plan, forward_ports=tuple(ports), stop_requested=stop_requested)


# ---- the arguments (no container needed) -------------------------------------------------------------------
def test_run_arguments_isolate_and_limit_and_carry_no_env_value(tmp_path):
    plan = ContainerPlan(image="registry.example/team/img:1", name="sat-x-a1",
                         mounts=(Mount(tmp_path / "data", "/opt/sat/data"),
                                 Mount(tmp_path / "out", "/opt/sat/output", writable=True)),
                         workdir="/opt/sat/code", memory_bytes=8 << 30, cpus=2.5, shm_bytes=1 << 30, gpus=2)
    args = podman_run_args(plan, "python train.py", ["AWS_SECRET_ACCESS_KEY", "SAT_JOB_NAME"])
    joined = " ".join(args)
    for flag in ("--cap-drop=all", "--security-opt=no-new-privileges", "--read-only", "--pull=never"):
        assert flag in args
    assert args[args.index("--user") + 1] == "1000:1000"
    assert args[args.index("--uidmap") + 1] == f"0:{HOST_ID_BASE}:65536"
    assert args[args.index("--memory") + 1] == str(8 << 30) == args[args.index("--memory-swap") + 1]
    assert args[args.index("--cpus") + 1] == "2.5" and args[args.index("--shm-size") + 1] == str(1 << 30)
    assert "--pids-limit" in args and args[args.index("--network") + 1] == "none"
    assert f"{tmp_path / 'data'}:/opt/sat/data:ro" in args and f"{tmp_path / 'out'}:/opt/sat/output:rw" in args
    # GPUs as CDI devices, as `nvidia-ctk cdi generate` names them on a GPU host
    assert [args[i + 1] for i, a in enumerate(args) if a == "--device"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    # environment by name only: podman reads each value from its own environment, never from the command line
    assert [args[i + 1] for i, a in enumerate(args) if a == "--env"] == ["AWS_SECRET_ACCESS_KEY", "SAT_JOB_NAME"]
    assert "=" not in "".join(args[i + 1] for i, a in enumerate(args) if a == "--env")
    assert args[-4:] == ["registry.example/team/img:1", "bash", "-lc", "python train.py"]
    assert json.loads(args[args.index("--entrypoint") + 1]) == ["/run/sat-init", "-g", "--"]
    assert "--privileged" not in joined and "--network=host" not in joined


def test_container_names_follow_podmans_rule():
    assert container_name("job/with spaces:and+plus", 3) == "sat-job-with-spaces-and-plus-a3"
    assert container_name("///", 1) == "sat-run-a1"


def test_the_runtime_setting_is_checked_and_names_itself(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "vm")
    with pytest.raises(ContainerRuntimeError, match=r"\[sat\] local_runtime: must be one of host, container, auto"):
        chosen_runtime()
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "host")
    assert chosen_runtime() == "host"
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_HOST_MODE", "forbidden")
    with pytest.raises(ContainerRuntimeError, match=r"local_host_mode = forbidden"):
        chosen_runtime()
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "auto")
    if podman_installed() and os.geteuid() == 0:
        assert chosen_runtime() == "container"
    else:
        with pytest.raises(ContainerRuntimeError):
            chosen_runtime()
    monkeypatch.setattr("sat_tasks.backends.local.containers.podman_installed", lambda: False)
    monkeypatch.setenv("AIRFLOW__SAT__LOCAL_RUNTIME", "container")
    with pytest.raises(ContainerRuntimeError, match="podman .* is not installed"):
        chosen_runtime()


def test_host_mode_says_the_image_is_not_used(tmp_path):
    (tmp_path / "code").mkdir()
    record = LocalAttempt(job="unit-job", attempt=1, node="n1", command="echo hello", env={}, cwd=tmp_path / "code",
                          output_dir=tmp_path / "out", job_log=tmp_path / "job.log", node_dir=tmp_path / "n1",
                          image="registry.example/team/img:1", startup_timeout=0).run(lambda _m: None)
    assert record.exit_code == 0 and record.container_states == [{"name": "unit-job", "runtime": "host"}]
    assert "[sat] attempt 1 runs on this host; image registry.example/team/img:1 is not used" in (
        tmp_path / "job.log").read_text()


# ---- real containers ---------------------------------------------------------------------------------------
@needs_podman
def test_an_attempt_runs_in_its_image_as_an_unprivileged_user(tmp_path, base_image):
    plan = plan_for(tmp_path, "user")
    command = ("id -u; id -g; echo written > /opt/sat/output/result.txt; "
               "touch /etc/sat-probe 2>&1 || true; touch /opt/sat/code/x 2>&1 || true; "
               "grep -c . /proc/self/uid_map; awk '{print $2}' /proc/self/uid_map; echo \"FOO=$FOO\"")
    lines: list[str] = []
    record = container_attempt(tmp_path, plan, command, env={"FOO": "from-the-spec"}).run(lines.append)
    assert record.exit_code == 0, lines
    assert lines[lines.index("[sat] attempt 1 runs in image " + BASE_IMAGE) + 1:][:2] == ["1000", "1000"]
    assert any("/etc/sat-probe'" in line and "Read-only file system" in line for line in lines)  # read-only root
    assert any("/opt/sat/code/x'" in line and "Read-only file system" in line for line in lines)  # a read-only mount
    assert str(HOST_ID_BASE) in lines  # a mapped user namespace: uid 0 inside is HOST_ID_BASE outside
    assert "FOO=from-the-spec" in lines
    written = tmp_path / "out" / "result.txt"
    assert written.read_text() == "written\n" and written.stat().st_uid == HOST_ID_BASE + 1000
    state = record.container_states[0]
    assert state["runtime"] == "podman" and state["image"] == BASE_IMAGE and len(state["containerID"]) == 64
    assert state["state"]["terminated"]["exitCode"] == 0
    assert podman(["container", "exists", plan.name], check=False).returncode == 1  # removed at its end


@needs_podman
def test_a_hostile_probe_reaches_its_store_and_nothing_else(tmp_path, base_image):
    store, service = Listener(b"store"), Listener(b"metadata-db")  # the run's store; a service it must not reach
    secret = "s3cr3t-" + os.urandom(8).hex()
    probe = f"""
import os, socket
def reach(host, port):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            return s.recv(64).decode() or "connected"
    except OSError as exc:
        return type(exc).__name__
print("store", reach("127.0.0.1", {store.port}))
print("service", reach("127.0.0.1", {service.port}))
print("outside", reach("1.1.1.1", 80))
print("gateway", reach("10.0.2.2", {service.port}))
for path in ({str(tmp_path)!r}, "/work", "/opt/wheels", {str(Path.cwd() / ".airflow")!r}, {str(Path.cwd() / ".sat")!r}):
    print("path", path, os.path.exists(path))
print("secret", os.environ.get("AWS_SECRET_ACCESS_KEY") == {secret!r})
open("/opt/sat/output/own.txt", "w").write("mine")
print("caps", [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0])
"""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "probe.py").write_text(probe)
    plan = plan_for(tmp_path, "probe")
    seen_argv: list[str] = []
    attempt = container_attempt(tmp_path, plan, "python3 probe.py", env={"AWS_SECRET_ACCESS_KEY": secret},
                                ports=[store.port])

    def watch_command_lines() -> None:  # while it runs: no process's command line carries the secret
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    seen_argv.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    continue
            time.sleep(0.05)

    done = threading.Event()
    watcher = threading.Thread(target=watch_command_lines, daemon=True)
    watcher.start()
    lines: list[str] = []
    try:
        record = attempt.run(lines.append)
    finally:
        done.set()
        watcher.join()
    assert record.exit_code == 0, lines
    assert "store store" in lines
    assert "service ConnectionRefusedError" in lines  # the metadata DB, the API server: another loopback port
    assert any(line.startswith("outside ") and "store" not in line and "connected" not in line for line in lines)
    assert any(line.startswith("gateway ") and "metadata" not in line for line in lines)
    assert [line for line in lines if line.startswith("path ")] and all(
        line.endswith("False") for line in lines if line.startswith("path "))
    assert "secret True" in lines and "caps 0000000000000000" in lines
    assert (tmp_path / "out" / "own.txt").read_text() == "mine"
    assert any("podman" in argv for argv in seen_argv) and not any(secret in argv for argv in seen_argv)


@needs_podman
def test_a_stop_request_reaches_the_command_as_sigterm(tmp_path, base_image):
    plan = plan_for(tmp_path, "stop")
    command = ("trap 'echo final checkpoint > /opt/sat/output/final.txt; exit 0' TERM; echo ready; "
               "while true; do sleep 0.1; done")
    asked: dict[str, str] = {}

    def stop_requested():
        return asked or None

    attempt = container_attempt(tmp_path, plan, command, stop_requested=stop_requested)
    attempt.stop_poll_seconds = 0.2
    lines: list[str] = []

    def ask_when_ready() -> None:
        deadline = time.monotonic() + 120
        while "ready" not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        asked.update({"by": "alice", "at": "now"})

    threading.Thread(target=ask_when_ready, daemon=True).start()
    record = attempt.run(lines.append)
    assert (tmp_path / "out" / "final.txt").read_text() == "final checkpoint\n"
    assert record.exit_code == 0 and record.stopped_by == "alice"


@needs_podman
def test_a_gpu_fault_kills_the_containers_processes(tmp_path, base_image):
    plan = plan_for(tmp_path, "xid")
    command = "python3 -c 'import time\nwhile True: time.sleep(0.1)' & echo started; wait"
    lines: list[str] = []
    attempt = container_attempt(tmp_path, plan, command, faults=[
        Fault.model_validate({"kind": "hardware", "attempt": 1, "after_seconds": 1, "xid": 79})])
    record = attempt.run(lines.append)
    assert record.exit_code == 137 and record.signal == 9
    assert any("Xid" in line and ": 79," in line for line in record.node_log)
    assert classify(record).kind is VerdictKind.HARDWARE
    assert podman(["container", "exists", plan.name], check=False).returncode == 1


@needs_podman
def test_a_job_over_its_memory_limit_is_oomkilled_and_internal(tmp_path, base_image):
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.fail("/dev/kmsg is not readable: the OOM evidence comes from the kernel's log (run as root)")
    plan = plan_for(tmp_path, "oom", memory_mb=128)
    record = container_attempt(tmp_path, plan, "python3 -c 'x = bytearray(400 << 20); print(len(x))'").run(
        lambda _m: None)
    assert record.exit_code == 137 and record.termination_reason == "OOMKilled"
    assert "oom-kill:" in record.termination_message and record.container_states[0]["containerID"] in (
        record.termination_message)
    verdict = classify(record)
    assert verdict.kind is VerdictKind.INTERNAL and "OOMKilled" in " ".join(verdict.evidence)
