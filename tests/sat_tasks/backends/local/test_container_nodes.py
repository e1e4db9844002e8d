"""A multi-node attempt in container mode: one container per node on a network of the attempt's own (ADR 0035).

The argument lists first (no container needed): the `ip` commands that wire the nodes' network
namespaces to the attempt's switch, each node's `podman run` and rendezvous environment, the
command each node runs. Then real containers of the Debian base image: two nodes meet on rank 0's
address and reach their store, and nothing else; a node whose container fails ends the attempt.
The 2-node DDP job in SAT's training image, through the job's DAG, is in
tests/e2e/test_container_nodes.py.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from sat_tasks.backends.local.container_run import (
    NODE_INTERFACE,
    ContainerPlan,
    Mount,
    container_name,
    local_image_digest,
    network_name,
    node_address,
    podman_run_args,
    run_network_commands,
    writable_by_container,
)
from sat_tasks.backends.local.containers import podman, podman_installed
from sat_tasks.backends.local.launch import MASTER_PORT, _per_node, node_command, rendezvous_env
from sat_tasks.backends.local.runner import LocalAttempt, PeerNode
from sat_tasks.spec import parse_spec
from tests.support.tcp_listener import Listener

BASE_IMAGE = "localhost/sat/debian-base:bookworm"

needs_podman = pytest.mark.skipif(not podman_installed() or os.geteuid() != 0,
                                  reason="podman/runc not installed (`make system-deps`) or not root")


def job_spec(**extra):
    return parse_spec({
        "name": "ddp-nodes", "framework": "pytorch", "nodes": 2,
        "resources": {"gpus_per_node": 0, "server_type": "cpu"},
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "storage": {"script_url": "s3://sat-demo/scripts/train.py"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": "python train.py --max_steps 5", **extra,
    })


# ---- the argument lists ------------------------------------------------------------------------------------
def test_the_run_network_is_wired_in_its_own_namespaces_only():
    commands = run_network_commands(100, [201, 202])
    switch, node1, node2 = "--net=/proc/100/ns/net", "--net=/proc/201/ns/net", "--net=/proc/202/ns/net"
    assert all(c[0] == "nsenter" and c[2] == "--" and c[3] == "ip" for c in commands)  # never this host's namespace
    assert {c[1] for c in commands} == {switch, node1, node2}
    assert commands[:2] == [["nsenter", switch, "--", "ip", "link", "add", "sat-switch", "type", "bridge"],
                            ["nsenter", switch, "--", "ip", "link", "set", "sat-switch", "up"]]
    assert ["nsenter", switch, "--", "ip", "link", "add", "n1", "type", "veth", "peer", "name", NODE_INTERFACE,
            "netns", "202"] in commands
    assert ["nsenter", switch, "--", "ip", "link", "set", "n0", "master", "sat-switch", "up"] in commands
    assert ["nsenter", node1, "--", "ip", "addr", "add", "10.213.0.2/24", "dev", NODE_INTERFACE] in commands
    assert ["nsenter", node2, "--", "ip", "addr", "add", "10.213.0.3/24", "dev", NODE_INTERFACE] in commands
    assert ["nsenter", node2, "--", "ip", "link", "set", NODE_INTERFACE, "up"] in commands
    # no route, no gateway, no address off the switch's subnet
    assert not [c for c in commands if "route" in c or "default" in c]
    assert [node_address(i) for i in range(3)] == ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
    with pytest.raises(ValueError):
        node_address(250)


def test_the_networks_name_carries_its_run_and_attempt():
    one, other = network_name("ddp-nodes-run-1", 1), network_name("ddp-nodes-run-2", 1)
    assert one == "sat-net-ddp-nodes-run-1-a1" and one != other and network_name("ddp-nodes-run-1", 2) != one


def test_each_node_gets_its_rank_and_rank_0s_address():
    assert rendezvous_env(1, 2, 1) == {
        "MASTER_ADDR": "10.213.0.2", "MASTER_PORT": str(MASTER_PORT), "NODE_RANK": "1", "NNODES": "2",
        "NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "10.213.0.2", "PET_MASTER_PORT": str(MASTER_PORT),
        "PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
        "GLOO_SOCKET_IFNAME": NODE_INTERFACE, "NCCL_SOCKET_IFNAME": NODE_INTERFACE}


def test_a_python_command_becomes_a_multi_node_torchrun_and_a_launcher_runs_as_written():
    assert node_command("python -u train.py --x 1") == (
        'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
        '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" train.py --x 1')
    assert node_command("python train.py --deepspeed", deepspeed=True).endswith(
        '--master_port="$MASTER_PORT" -m ckpt_engine.launch train.py --deepspeed')
    for as_written in ("bash run.sh", "python -m torch.distributed.run train.py", "python -m deepspeed train.py"):
        assert node_command(as_written) == as_written


def test_the_peer_nodes_get_their_own_container_and_environment(tmp_path):
    job = job_spec(env={"FOO": "1"})
    run = SimpleNamespace(job=job, run_id="r-42")
    plan = ContainerPlan(image=job.image.url, name="sat-ddp-nodes-r-42-a1", mounts=(), workdir="/opt/sat/code",
                         memory_bytes=1 << 30, cpus=1, shm_bytes=1 << 26,
                         labels={"sat.ai/job": job.name, "sat.ai/node": "n0"})
    env = {"FOO": "1", "SAT_NODE": "n0", "AWS_SECRET_ACCESS_KEY": "k"}
    got = _per_node(run, ["n0", "n1", "n2"], env, plan)
    assert got["run_key"] == "ddp-nodes-r-42"
    assert got["container"] == dataclasses.replace(plan, hostname="n0")
    assert env["NODE_RANK"] == "0" and env["NNODES"] == "3" and env["MASTER_ADDR"] == node_address(0)
    peers = got["peers"]
    assert [p.node for p in peers] == ["n1", "n2"]
    assert [p.container.name for p in peers] == ["sat-ddp-nodes-r-42-a1-r1", "sat-ddp-nodes-r-42-a1-r2"]
    assert [p.container.hostname for p in peers] == ["n1", "n2"]
    assert [p.container.labels["sat.ai/node"] for p in peers] == ["n1", "n2"]
    assert [(p.env["SAT_NODE"], p.env["NODE_RANK"], p.env["PET_NODE_RANK"]) for p in peers] == [
        ("n1", "1", "1"), ("n2", "2", "2")]
    assert all(p.env["MASTER_ADDR"] == "10.213.0.2" and p.env["AWS_SECRET_ACCESS_KEY"] == "k" for p in peers)
    # a node's run arguments: its own name and hostname, the environment by name only
    args = podman_run_args(peers[0].container, "true", sorted(peers[0].env))
    assert args[args.index("--name") + 1] == "sat-ddp-nodes-r-42-a1-r1"
    assert args[args.index("--hostname") + 1] == "n1"
    assert "=" not in "".join(args[i + 1] for i, a in enumerate(args) if a == "--env")
    # the job's own choice of interface stands
    own = {}
    _per_node(SimpleNamespace(job=job_spec(env={"GLOO_SOCKET_IFNAME": "lo"}), run_id="r"), ["n0", "n1"], own, plan)
    assert own["GLOO_SOCKET_IFNAME"] == "lo"


# ---- real containers ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base_image() -> str:
    if local_image_digest(BASE_IMAGE) is None:
        pytest.fail(f"{BASE_IMAGE} is not in the project's image store: `make image` builds it (make test runs it)")
    return BASE_IMAGE


# Each node: rank 0 listens on its address and answers its peer; the other connects to MASTER_ADDR (retrying while
# rank 0 starts). Both then try the store (forwarded), a host service on loopback, and an outside address.
NODE_SCRIPT = """
import os, socket, time
rank, master, port = int(os.environ["NODE_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
def reach(host, p):
    try:
        with socket.create_connection((host, p), timeout=3) as s:
            return s.recv(64).decode() or "connected"
    except OSError as exc:
        return type(exc).__name__
if rank == 0:
    server = socket.create_server((master, port))
    server.settimeout(120)
    conn, peer = server.accept()
    conn.sendall(b"hello from rank 0")
    conn.close()
    print("rank 0 met", peer[0], flush=True)
else:
    deadline = time.monotonic() + 120
    while True:
        said = reach(master, port)
        if said.startswith("hello") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(f"rank {rank} heard", said, flush=True)
print(f"rank {rank} node", os.environ["SAT_NODE"], socket.gethostname(), flush=True)
print(f"rank {rank} store", reach("127.0.0.1", STORE), flush=True)
print(f"rank {rank} service", reach("127.0.0.1", SERVICE), flush=True)
print(f"rank {rank} outside", reach("1.1.1.1", 80), flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    raise SystemExit(3)
if os.environ.get("FAIL_RANK"):
    time.sleep(600)
"""


def two_node_attempt(tmp_path: Path, image: str, env: dict[str, str], ports=()) -> LocalAttempt:
    code, out = tmp_path / "code", tmp_path / "out"
    code.mkdir(exist_ok=True)
    writable_by_container(out)
    run_key = f"unit-nodes-{os.getpid()}-{tmp_path.name}"
    plan = ContainerPlan(image=image, name=container_name(run_key, 1), hostname="n0",
                         mounts=(Mount(out, "/opt/sat/output", writable=True), Mount(code, "/opt/sat/code")),
                         workdir="/opt/sat/code", memory_bytes=256 << 20, cpus=1, shm_bytes=64 << 20)
    base = {**env, "SAT_NODE": "n0", **rendezvous_env(0, 2, 1)}
    peer = PeerNode(node="n1", env={**base, "SAT_NODE": "n1", **rendezvous_env(1, 2, 1)},
                    container=dataclasses.replace(plan, name=f"{plan.name}-r1", hostname="n1"))
    return LocalAttempt(job="unit-nodes", attempt=1, node="n0", command="python3 node.py", env=base, cwd=code,
                        output_dir=out, job_log=tmp_path / "job.log", node_dir=tmp_path / "nodes" / "n0",
                        image=image, heartbeat_timeout=300, startup_timeout=0, grace_seconds=15, poll_seconds=0.05,
                        container=plan, forward_ports=tuple(ports), peers=[peer], run_key=run_key)


def holders_of(name: str) -> list[int]:
    """The network namespace holders still running whose name starts with `name` (`ps` shows it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (b"unshare" in argv[0] or argv[:2] == [b"sh", b"-c"]) and any(
                part.decode(errors="replace").startswith(name) for part in argv[1:]):
            found.append(int(pid))
    return found


@needs_podman
def test_two_nodes_meet_on_their_network_and_reach_their_store_and_nothing_else(tmp_path, base_image):
    store, service = Listener(b"store"), Listener(b"metadata-db")
    attempt = two_node_attempt(tmp_path, base_image, {}, ports=[store.port])
    (tmp_path / "code" / "node.py").write_text(
        NODE_SCRIPT.replace("STORE", str(store.port)).replace("SERVICE", str(service.port)))
    lines: list[str] = []
    name = network_name(attempt.run_key, 1)
    while_up: list[int] = []

    def log(line: str) -> None:
        lines.append(line)
        if "one per node, on network" in line:  # said once the network is made: its holders run now
            while_up.extend(holders_of(name))

    record = attempt.run(log)
    assert record.exit_code == 0, lines
    assert len(while_up) == 3, while_up  # the switch and the two nodes' namespaces, named after the run
    assert any(f"2 containers, one per node, on network {name} (n0 10.213.0.2, n1 10.213.0.3)" in line
               for line in lines), lines
    assert "rank 0 met 10.213.0.3" in lines  # the peer came from its own address, over the run's network
    assert "[n1] rank 1 heard hello from rank 0" in lines  # the other node's output, named, in the one log
    assert "rank 0 node n0 n0" in lines and "[n1] rank 1 node n1 n1" in lines
    for prefix in ("", "[n1] "):
        assert f"{prefix}rank {prefix and 1 or 0} store store" in lines, lines
        assert f"{prefix}rank {prefix and 1 or 0} service ConnectionRefusedError" in lines, lines
        outside = [line for line in lines if line.startswith(f"{prefix}rank {prefix and 1 or 0} outside ")]
        assert outside and "connected" not in outside[0], lines
    states = record.container_states
    assert [s["name"] for s in states] == [attempt.container.name, f"{attempt.container.name}-r1"]
    ids = [s["containerID"] for s in states]
    assert all(len(i) == 64 for i in ids) and ids[0] != ids[1]  # two containers ran
    assert [s["state"]["terminated"]["exitCode"] for s in states] == [0, 0]
    job_log = (tmp_path / "job.log").read_text()
    assert "[n1] rank 1 heard hello from rank 0" in job_log
    for state in states:  # removed at the attempt's end, and so is their network
        assert podman(["container", "exists", state["name"]], check=False).returncode == 1
    assert holders_of(name) == []


@needs_podman
def test_a_node_whose_container_fails_ends_the_attempt_with_its_status(tmp_path, base_image):
    store, service = Listener(b"store"), Listener(b"metadata-db")
    attempt = two_node_attempt(tmp_path, base_image, {"FAIL_RANK": "1"}, ports=[store.port])
    (tmp_path / "code" / "node.py").write_text(
        NODE_SCRIPT.replace("STORE", str(store.port)).replace("SERVICE", str(service.port)))
    lines: list[str] = []
    record = attempt.run(lines.append)  # rank 0 would sleep 600 s: the failed node ends it
    assert record.exit_code == 3, lines
    assert any("the container of n1 exited with status 3: ending the attempt's other containers" in line
               for line in lines), lines
    assert [s["state"]["terminated"]["exitCode"] for s in record.container_states][1] == 3
    assert (record.finished_at - record.started_at).total_seconds() < 300
    assert holders_of(network_name(attempt.run_key, 1)) == []
