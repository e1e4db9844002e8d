"""The node's metrics sidecar on the local backend: `python -m ckpt_engine.metrics` beside each attempt.

The runner starts it before the command and stops it (SIGTERM, a last sample, the upload)
after the attempt's processes are gone, so every attempt has its system and job series,
whatever the command is and however soon it dies (ADR 0015). It runs outside the attempt's
process group and without the attempt's tag: a fault injected into the attempt does not
touch it, and the runner's "processes left running" sweep does not count it. Its environment is
the attempt's (`runtime_env.process_environment`: the allow-list, not the service's secrets).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ckpt_engine.contract import METRICS_DIR_ENV
from ckpt_engine.contract import METRICS_SIDECAR_ENV as SIDECAR_ENV
from sat_tasks.core.bounded import tail_lines
from sat_tasks.core.handoffs import Log

__all__ = ["SIDECAR_ENV", "MetricsSidecar"]

STOP_TIMEOUT_S = 30.0
#: What `stop` relays of the sidecar's own log into the task log: its end (a sidecar that retried uploads for hours
#: logged a line each time).
LOG_TAIL_BYTES = 64 << 10


class MetricsSidecar:
    """One sidecar process; `start()` returns None when the attempt records no metrics (no `SAT_METRICS_DIR`)."""

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        self.env = env
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None
        self._stop_requested = False

    def start(self) -> MetricsSidecar | None:
        if not self.env.get(METRICS_DIR_ENV):
            return None
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ckpt_engine.metrics"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        return self

    def request_stop(self) -> None:
        """SIGTERM now, at normal CPU priority (returns at once; `stop` waits): the attempt's processes are gone.

        The sidecar runs at nice 19 and SCHED_IDLE so that it never takes CPU from training
        (ADR 0017). Once the attempt has ended there is no training to yield to, and its last
        sample and upload are on a fault's recovery path (the launch task, then the verdict,
        wait for them), where a nice-19 process on a loaded host waits behind every other one.
        Raising a priority back needs the privilege (root, CAP_SYS_NICE or RLIMIT_NICE) a
        lowering did not; without it the sidecar stops at the priority it has. Once: the
        sidecar's stop is under way after the first SIGTERM, a second one says nothing new.
        """
        if self.proc is None or self.proc.poll() is not None or self._stop_requested:
            return
        self._stop_requested = True
        _normal_priority(self.proc.pid)
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop(self, log: Log) -> list[str]:
        """SIGTERM (`request_stop`), wait for its last sample and upload; the lines it logged (e.g. why there is no
        GPU series)."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.request_stop()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log(f"[sat metrics] the sidecar did not end within {STOP_TIMEOUT_S:g}s of SIGTERM: killed")
                self.proc.kill()
                self.proc.wait()
        try:
            lines, size = tail_lines(self.log_file, LOG_TAIL_BYTES)
        except OSError:
            return []
        note = f"[sat metrics] (the sidecar logged {size} bytes: its last {LOG_TAIL_BYTES // 1024} KiB follow)"
        cut = [note] if size > LOG_TAIL_BYTES else []
        return cut + [line if line.startswith("[sat") else f"[sat metrics] {line}" for line in lines if line.strip()]


def _normal_priority(pid: int) -> None:
    """Every thread of process `pid` back to SCHED_OTHER at nice 0, where this process may raise it (best effort)."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):  # not Linux, or the process is gone
        return
    for tid in threads:
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        except (AttributeError, OSError):  # not permitted (no privilege to raise it), or the thread ended
            continue
