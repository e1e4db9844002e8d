"""What a fault's detection waited for on the local backend, and no longer does (issue 32.4, ADR 0031).

The time from the attempt's end to the verdict ("detect") ran through the runner's poll
interval and the metrics sidecar's stop at nice 19 / SCHED_IDLE. These tests check the
behaviour (the exit is seen before the interval is out; the stopping sidecar's threads are
back at normal priority), not how fast: the deadlines are generous bounds on an event.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sat_tasks.backends.local.metrics_sidecar import _normal_priority
from sat_tasks.backends.local.runner import LocalAttempt

HOUR = 3600.0


def test_the_runner_sees_the_command_exit_without_waiting_out_its_poll_interval(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    runner = LocalAttempt(
        job="unit-job", attempt=1, node="n0", command="python -c 'print(\"trained\")'",
        env={"SAT_OUTPUT_DIR": str(tmp_path / "out"), "SAT_JOB_NAME": "unit-job"},
        cwd=tmp_path / "code", output_dir=tmp_path / "out", job_log=tmp_path / "job.log",
        node_dir=tmp_path / "nodes" / "n0", heartbeat_timeout=HOUR, startup_timeout=0, grace_seconds=5.0,
        poll_seconds=HOUR,  # a sleep of the whole interval would outlast the bound below by far
    )
    records = []
    watcher = threading.Thread(target=lambda: records.append(runner.run(lambda _line: None)), daemon=True)
    watcher.start()
    watcher.join(timeout=120)  # a bound on the event on a loaded machine, far below the interval
    assert not watcher.is_alive(), "the runner slept out its poll interval after the command had exited"
    assert records[0].exit_code == 0 and "trained" in records[0].log_tail


LOWERED = textwrap.dedent("""
    import os, sys, threading, time
    def idle():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # as the sidecar's sampler thread
        time.sleep(600)
    os.setpriority(os.PRIO_PROCESS, 0, 19)  # as the sidecar's main thread (`yield_cpu`)
    threading.Thread(target=idle, daemon=True).start()
    time.sleep(0.5)
    print("lowered", flush=True)
    time.sleep(600)
""")


def _may_raise_priority() -> bool:
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
@pytest.mark.skipif(not _may_raise_priority(), reason="raising a priority back needs root, CAP_SYS_NICE or RLIMIT_NICE")
def test_a_stopping_sidecar_gets_normal_priority_back_on_every_thread() -> None:
    child = subprocess.Popen([sys.executable, "-c", LOWERED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "lowered"
        threads = [int(tid) for tid in os.listdir(f"/proc/{child.pid}/task")]
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {19}
        assert os.SCHED_IDLE in {os.sched_getscheduler(t) for t in threads}
        _normal_priority(child.pid)
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {0}
        assert {os.sched_getscheduler(t) for t in threads} == {os.SCHED_OTHER}
    finally:
        child.kill()
        child.wait()

