"""The local backend's warm interpreter: a process with the framework imported that runs the next run's script."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sat_tasks.backends.local import warm as local_warm
from sat_tasks.backends.local import warm_interpreter
from sat_tasks.io import warm_pool
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import steps

SCRIPT = """\
import os, signal, sys, time
print("argv", sys.argv[1:], "X", os.environ.get("X"), "cwd", os.path.basename(os.getcwd()),
      "json preloaded", "json" in sys.modules, flush=True)
if sys.argv[1:2] == ["term"]:
    signal.signal(signal.SIGTERM, lambda *_: (print("final checkpoint", flush=True), sys.exit(0)))
if sys.argv[1:2] == ["pool"]:  # non-daemon workers, stopped by threading's exit hook, as at interpreter exit
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(2)
    print("pool says", pool.submit(lambda: 41 + 1).result(), flush=True)
if sys.argv[1:2] in (["term"], ["sleep"]):
    open("ready", "w").close()
    time.sleep(120)
sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
"""
MODULE = warm_interpreter.__name__


def _wait_for(condition, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.fixture
def server(tmp_path):
    sock = str(tmp_path / "s.sock")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "serve", "--socket", sock, "--preload", "json",
                             "--until", str(time.time() + 300)], stdin=subprocess.DEVNULL)
    _wait_for(lambda: os.path.exists(sock), "the server's socket")
    yield proc, sock
    proc.terminate()
    proc.wait(timeout=30)


def _client(tmp_path, sock, *args, **env):
    (tmp_path / "train.py").write_text(SCRIPT)
    return subprocess.Popen([sys.executable, "-m", MODULE, "run", "--socket", sock, "--", "train.py", *args],
                            cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_script_runs_in_the_warm_child_with_its_argv_env_cwd_and_exit_status(tmp_path, server):
    _, sock = server
    out, _ = _client(tmp_path, sock, "3", "b", X="one").communicate(timeout=60)
    assert f"{warm_interpreter.BANNER}: json already imported" in out
    assert f"argv ['3', 'b'] X one cwd {tmp_path.name} json preloaded True" in out
    client = _client(tmp_path, sock, "0", X="two")
    assert "X two" in client.communicate(timeout=60)[0] and client.returncode == 0


def test_the_child_exits_like_an_interpreter_with_a_thread_pool_left_open(tmp_path, server):
    _, sock = server
    client = _client(tmp_path, sock, "pool")
    out, _ = client.communicate(timeout=60)  # it hung here while the pool's workers were joined unstopped
    assert "pool says 42" in out and client.returncode == 0


def test_sigterm_reaches_the_script_and_sigkill_of_the_client_ends_the_child(tmp_path, server):
    _, sock = server
    client = _client(tmp_path, sock, "term")
    _wait_for(lambda: (tmp_path / "ready").exists(), "the script to start")
    client.send_signal(signal.SIGTERM)
    out, _ = client.communicate(timeout=60)
    assert "final checkpoint" in out and client.returncode == 0
    (tmp_path / "ready").unlink()
    client = _client(tmp_path, sock, "sleep")
    _wait_for(lambda: (tmp_path / "ready").exists(), "the script to start")
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), server[0].pid)]
    assert len(children) == 1
    client.kill()
    client.wait(timeout=30)
    _wait_for(lambda: not _running(children[0]), "the child to end with its client")


def _child_of(pid: int, parent: int) -> bool:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, IndexError, ValueError):
        return False


def test_without_a_server_the_client_runs_the_script_cold(tmp_path):
    client = _client(tmp_path, str(tmp_path / "none.sock"), "4")
    out, _ = client.communicate(timeout=60)
    assert "starting cold" in out and "json preloaded False" in out and client.returncode == 4


def test_the_server_leaves_at_its_deadline_which_a_request_moves(tmp_path):
    sock = str(tmp_path / "s.sock")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "serve", "--socket", sock, "--preload", "",
                             "--until", str(time.time() + 120)])
    _wait_for(lambda: os.path.exists(sock), "the server's socket")
    assert warm_interpreter.extend(sock, time.time() - 1)
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(sock) and not warm_interpreter.extend(sock, time.time())


def test_a_warm_job_hands_its_interpreter_to_the_next_run_and_releases_it(warm_job, lines, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "json")
    job = warm_job.job()
    first = warm_job.run_id()
    steps.stage_data(job, first, log=lines.append)
    warm_job.complete(job, first)
    steps.cleanup_run(job, first, log=lines.append)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    pid = state.interpreter_pid
    try:
        assert pid and state.interpreter_socket == local_warm.socket_path(job)
        _wait_for(lambda: os.path.exists(state.interpreter_socket), "the warm interpreter's socket")

        second = warm_job.run_id()
        staged = steps.stage_data(job, second, log=lines.append)
        assert staged["warm"]["reused"]["interpreter"]["pid"] == pid
        assert f"warm pool: warm interpreter pid {pid} handed over (the framework is already imported)" in lines
        assert local_warm._alive(pid)  # handed over, not released with the rest
        run = JobRun(job, second)
        command = local_warm.warm_command(run, "python train.py 5")
        assert command.endswith(f"{warm_interpreter.__file__} run --socket {state.interpreter_socket} -- train.py 5")
        run.code_dir.mkdir(parents=True, exist_ok=True)
        (run.code_dir / "train.py").write_text(SCRIPT)
        done = subprocess.run(["bash", "-c", command], cwd=run.code_dir, capture_output=True, text=True, timeout=60)
        assert done.returncode == 5 and "json preloaded True" in done.stdout
        assert f"{warm_interpreter.BANNER}: json already imported" in done.stderr
        warm_job.complete(job, second)
        steps.cleanup_run(job, second, log=lines.append)
        assert warm_pool.WarmPoolStore(warm_job.hook).load(job).interpreter_pid == pid
        assert f"warm pool: warm interpreter pid {pid} kept for the next run" in lines

        # a third run that fails keeps nothing warm and lets the interpreter go
        third = warm_job.run_id()
        steps.stage_data(job, third, log=lines.append)
        from sat_tasks.core.status import JobStatus

        warm_job.complete(job, third, status=JobStatus.FAILED)
        assert f"process/warm-interpreter-{pid}" in steps.cleanup_run(job, third, log=lines.append)
        _wait_for(lambda: not local_warm._alive(pid), "the interpreter to stop")
        _wait_for(lambda: not os.path.exists(state.interpreter_socket), "the socket to go")
    finally:
        local_warm.release_interpreter(pid, None)


def test_jobs_with_faults_or_other_commands_get_no_interpreter(warm_job, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "json")
    assert local_warm.interpreter_eligible(warm_job.job())
    assert not local_warm.interpreter_eligible(warm_job.job(faults=[{"kind": "hang", "after_seconds": 5}]))
    assert not local_warm.interpreter_eligible(warm_job.job(nodes=2))
    assert not local_warm.interpreter_eligible(warm_job.job(command="torchrun --nproc_per_node 2 train.py"))
    assert not local_warm.interpreter_eligible(warm_job.job(command="python -m train.main"))
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "none")
    assert not local_warm.interpreter_eligible(warm_job.job())


def test_the_child_trains_at_normal_priority_though_the_preload_ran_idle(tmp_path, server):
    _, sock = server
    (tmp_path / "policy.py").write_text("import os; print('policy', os.sched_getscheduler(0), flush=True)\n")
    client = subprocess.Popen([sys.executable, "-m", MODULE, "run", "--socket", sock, "--", "policy.py"],
                              cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    out, _ = client.communicate(timeout=60)
    assert f"policy {os.SCHED_OTHER}" in out


def test_a_server_with_an_owner_serves_past_its_deadline_until_the_owner_is_gone(tmp_path):
    """The failover standby's lease (ADR 0031): while its owner (a launch) runs the deadline does not end it."""
    owners = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    sock = str(tmp_path / "s.sock")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "serve", "--socket", sock, "--preload", "json",
                             "--until", str(time.time() - 1), "--owner", str(owners[0].pid), "--grace", "0"])
    try:
        _wait_for(lambda: os.path.exists(sock), "the server's socket")
        out, _ = _client(tmp_path, sock, "0").communicate(timeout=60)
        assert "json preloaded True" in out  # served by the warm child, its deadline long past
        assert warm_interpreter.extend(sock, time.time() - 1, owner=owners[1].pid)  # the next launch takes it over
        owners[0].kill()
        owners[0].wait(timeout=30)
        out, _ = _client(tmp_path, sock, "0").communicate(timeout=60)
        assert "json preloaded True" in out  # the first owner is gone, the second still runs
        owners[1].kill()
        owners[1].wait(timeout=30)
        assert proc.wait(timeout=60) == 0 and not os.path.exists(sock)
    finally:
        for process in (*owners, proc):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _delayed_server(sock: str, delay: float, owner: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", MODULE, "serve", "--socket", sock, "--preload", "json",
                             "--until", str(time.time() + 300), "--owner", str(owner), "--grace", "300",
                             "--delay", str(delay)], stdin=subprocess.DEVNULL)


def test_a_delayed_server_imports_after_its_delay_or_at_once_for_a_client(tmp_path):
    """A standby's `--delay`: nothing imported while it waits; imported when the delay is over, or at once when
    a client connects (it waits for the imports)."""
    owner = subprocess.Popen(["sleep", "300"])
    servers = []
    try:
        waiting, soon = str(tmp_path / "waiting.sock"), str(tmp_path / "soon.sock")
        servers = [_delayed_server(waiting, 600, owner.pid), _delayed_server(soon, 1, owner.pid)]
        _wait_for(lambda: warm_interpreter.is_ready(soon), "the imports after a 1 s delay")
        assert os.path.exists(waiting) and not warm_interpreter.is_ready(waiting)  # 600 s: still waiting
        out, _ = _client(tmp_path, waiting, "0").communicate(timeout=60)
        assert "json preloaded True" in out  # the client did not wait out the delay
        assert warm_interpreter.is_ready(waiting)
    finally:
        for process in (owner, *servers):
            process.kill()
            process.wait(timeout=30)


def test_a_delayed_server_leaves_without_importing_when_its_owner_ends_or_on_sigterm(tmp_path):
    """An attempt that fails before the standby's delay is over leaves no standby behind: the server exits
    (the next launch starts its own); SIGTERM (the run's cleanup) ends the wait too."""
    owner = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "300"])
    servers = []
    try:
        first, second = str(tmp_path / "first.sock"), str(tmp_path / "second.sock")
        servers = [_delayed_server(first, 600, owner.pid), _delayed_server(second, 600, other.pid)]
        _wait_for(lambda: os.path.exists(first) and os.path.exists(second), "the two servers' sockets")
        owner.kill()
        owner.wait(timeout=30)
        assert servers[0].wait(timeout=60) == 0
        servers[1].terminate()
        assert servers[1].wait(timeout=60) == 0
        for sock in (first, second):
            assert not os.path.exists(sock) and not os.path.exists(warm_interpreter.ready_path(sock))
    finally:
        for process in (owner, other, *servers):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_failover_attempt_runs_in_the_runs_standby_interpreter(warm_job, monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "json")
    monkeypatch.setattr(local_warm, "STANDBY_DELAY_S", 0.0)  # its imports at once (the delay: the tests above)
    monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", "true")
    hardware = [{"kind": "hardware", "attempt": 1, "at_step": 5}]
    job = warm_job.job(job_failover=True, warm_pool=None, faults=hardware)
    run = JobRun(job, warm_job.run_id())
    path = local_warm.standby_socket_path(run)
    try:
        assert local_warm.warm_command(run, "python train.py 5") == "python train.py 5"  # attempt 1 cold; one starts
        _wait_for(lambda: warm_interpreter.is_ready(path), "the standby's imports")
        # not the launch's child (Airflow's supervisor saw a launch with a child end 5 s late), nor in its session
        (standby,) = local_warm._standby_pids(path)
        assert _parent_of(standby) != os.getpid() and os.getsid(standby) != os.getsid(0)
        command = local_warm.warm_command(run, "python train.py 5")  # a failover's attempt
        assert command.endswith(f"{warm_interpreter.__file__} run --socket {path} -- train.py 5")
        (tmp_path / "train.py").write_text(SCRIPT)
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 5 and "json preloaded True" in done.stdout
    finally:
        released = local_warm.release_standby(run)
    assert len(released) == 1 and released[0].startswith("process/warm-interpreter-")
    _wait_for(lambda: not os.path.exists(path), "the standby to stop")
    assert not os.path.exists(warm_interpreter.ready_path(path))
    hang = [{"kind": "hang", "attempt": 1, "after_seconds": 5}]
    for other in (warm_job.job(job_failover=True, warm_pool=None, faults=hang), warm_job.job(warm_pool=None),
                  warm_job.job(job_failover=True, warm_pool=None, command="torchrun --nproc_per_node 2 train.py")):
        assert not local_warm.standby_eligible(other)
    monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", "false")
    assert not local_warm.standby_eligible(job)


def test_the_standby_is_auto_by_default_and_auto_follows_the_memory_available(warm_job, monkeypatch):
    """`auto` by default: on with STANDBY_MIN_AVAILABLE_BYTES available, off below, off where /proc/meminfo
    cannot be read; `true` and `false` as written."""
    monkeypatch.delenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", raising=False)
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "json")
    job = warm_job.job(job_failover=True, warm_pool=None)
    assert local_warm._memory_available() > 0  # this Linux host's own /proc/meminfo
    for value in (None, "auto"):  # the default, then written
        if value:
            monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", value)
        for available, expected in ((local_warm.STANDBY_MIN_AVAILABLE_BYTES, True),
                                    (local_warm.STANDBY_MIN_AVAILABLE_BYTES - 1, False), (None, False)):
            monkeypatch.setattr(local_warm, "_memory_available", lambda value=available: value)
            assert local_warm.standby_eligible(job) is expected, (value, available)
    monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", "true")
    assert local_warm.standby_eligible(job)
    monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", "false")
    monkeypatch.setattr(local_warm, "_memory_available", lambda: 1 << 40)
    assert not local_warm.standby_eligible(job)


def test_a_failover_leaves_a_standby_still_importing_alone_and_starts_cold(warm_job, monkeypatch, tmp_path):
    """A standby that has not finished its imports is neither asked (a connection would hurry it to normal priority,
    into the cold attempt's way: seen as +40% on the suite's failover tests) nor doubled by a second one."""
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "json")
    monkeypatch.setenv("AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER", "true")
    job = warm_job.job(job_failover=True, warm_pool=None, faults=[{"kind": "hardware", "attempt": 1, "at_step": 5}])
    run = JobRun(job, warm_job.run_id())
    path = local_warm.standby_socket_path(run)
    server = warm_interpreter.bind_private(path)  # bound and listening, as a server is while it imports
    server.listen(8)
    importing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "warm_interpreter", "serve",
                                  "--socket", path])
    try:
        # its command line shows once it has exec'd (before, /proc shows the forking pytest's)
        _wait_for(lambda: local_warm._standby_pids(path) == [importing.pid], "the importing stand-in")
        assert not warm_interpreter.is_ready(path)
        assert local_warm.warm_command(run, "python train.py 5") == "python train.py 5"  # cold
        readable, _, _ = select.select([server], [], [], 0.5)
        assert not readable  # nobody connected: it was not hurried
        assert local_warm._standby_pids(path) == [importing.pid]  # and no second standby started
    finally:
        importing.kill()
        importing.wait(timeout=30)
        server.close()
        os.unlink(path)
