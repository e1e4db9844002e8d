"""SIGTERM (a Spot notice): finish the in-flight checkpoint, take a final one within a grace period, exit 143."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("ckpt_engine")

EXIT_STATUS = 128 + signal.SIGTERM
# Launchers that SIGKILL their ranks a fixed time after passing SIGTERM on, whatever the
# ranks' grace period: `deepspeed.launcher.launch` (terminate_process_tree, hard-coded).
HARD_KILL_LAUNCHERS = {"deepspeed.launcher.launch": 30.0}


def launcher_kill_after() -> tuple[str, float] | None:
    """The parent launcher that SIGKILLs this process a fixed time after SIGTERM, and that time.

    Read from the parent's command line (Linux ``/proc``); None when the parent is none of
    :data:`HARD_KILL_LAUNCHERS` or cannot be read.
    """
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            args = handle.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for name, seconds in HARD_KILL_LAUNCHERS.items():
        if name in args:
            return name, seconds
    return None


class StopVote:
    """Ranks agree on stopping for a SIGTERM that may reach them steps apart, or reach only some.

    Every rank calls :meth:`poll` once per optimizer step with its own flag. Round k, a
    MAX all-reduce of the flags, is started at step k in the background (on a gloo group:
    a host tensor, no device sync) and read at step k+1, so every rank learns the same
    answer at the same step, one step after the first rank saw its signal. A rank that
    stopped alone would leave the others blocked in the next step's gradient all-reduce.
    Must be constructed on every rank (creating a gloo group is collective).
    """

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self._dist = dist
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.work: Any = None

    def poll(self, local: bool) -> bool:
        """True, on every rank at the same step, once any rank has asked to stop."""
        if self.work is not None:
            self.work.wait()
            self.work = None
            if self.flag.item():
                return True
        self.flag.fill_(int(local))
        self.work = self._dist.all_reduce(self.flag, op=self._dist.ReduceOp.MAX, group=self.group, async_op=True)
        return False

    def drain(self) -> bool:
        """Finish the round in flight (training ended: every rank calls this once): did a rank ask to stop?"""
        return self.poll(False) if self.work is not None else False


class GracefulTermination:
    """Turns SIGTERM into a request the training loop honours at its next step boundary.

    Call order: ``install()`` (the handler, and a watchdog thread that waits) -> (signal
    arrives: ``requested`` becomes True, the watchdog says so and starts the grace period)
    -> the loop saves a final checkpoint and waits for it -> ``finish()`` exits with 128+15.
    If that takes longer than ``grace_seconds`` the watchdog calls ``on_timeout`` and exits
    with the same status anyway.

    The handler runs in the main thread between two bytecodes, wherever the training code
    is; so it takes no lock that code may hold: no thread start (``threading``'s registry
    lock), no logging (a stream's buffer), only flags and the set of an event nobody else in
    the main thread waits on. A second SIGTERM is a no-op once the flag is up (the metrics
    sidecar deadlocked on exactly that: ADR 0017's addendum of session 39).
    """

    def __init__(self, grace_seconds: float, *, on_timeout: Callable[[], None] | None = None) -> None:
        self.grace_seconds = grace_seconds
        self.on_timeout = on_timeout
        self.requested = False
        self.requested_at: float | None = None
        self.final_step: int | None = None
        self._reason = ""
        self._previous: Any = None
        self._asked = threading.Event()
        self._said = threading.Event()  # the watchdog logged the request (finish() waits for the line)
        self._finished = threading.Event()
        self._watchdog_thread: threading.Thread | None = None

    def install(self) -> bool:
        """Register the SIGTERM handler (only possible from the main thread) and start the watchdog."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("[Concurrent Checkpoint] not in the main thread: SIGTERM handling disabled")
            return False
        self._start_watchdog()
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        launcher = launcher_kill_after()
        if launcher is not None and launcher[1] < self.grace_seconds:
            log.warning("[Concurrent Checkpoint] %s SIGKILLs its ranks %.0fs after SIGTERM, before the final "
                        "checkpoint's grace period of %.0fs ends; launch with torchrun (SAT sets "
                        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT) to give the final checkpoint all of it",
                        launcher[0], launcher[1], self.grace_seconds)
        return True

    def uninstall(self) -> None:
        """Restore the previous SIGTERM handler."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.request("SIGTERM received")

    def request(self, reason: str) -> None:
        """Ask for the final checkpoint and exit (the signal handler, or another rank's SIGTERM); idempotent."""
        if self.requested:
            return
        self.requested, self.requested_at, self._reason = True, time.monotonic(), reason
        self._start_watchdog()  # running since install(): from the handler this starts nothing
        self._asked.set()

    def _start_watchdog(self) -> None:
        if self._watchdog_thread is None:
            self._watchdog_thread = threading.Thread(target=self._watchdog, name="ckpt-sigterm-watchdog", daemon=True)
            self._watchdog_thread.start()

    def _watchdog(self) -> None:
        self._asked.wait()
        log.warning("[Concurrent Checkpoint] %s: finishing the in-flight checkpoint and taking a final one "
                    "within %.0fs", self._reason, self.grace_seconds)
        self._said.set()
        started = self.requested_at if self.requested_at is not None else time.monotonic()
        if self._finished.wait(max(0.0, started + self.grace_seconds - time.monotonic())):
            return
        if self.on_timeout is not None:
            self.on_timeout()
        logging.shutdown()
        os._exit(EXIT_STATUS)

    def note_final_checkpoint(self, step: int) -> None:
        """Remember which step the final checkpoint is."""
        self.final_step = step

    def finish(self) -> None:
        """Everything is committed: exit with the signal's status."""
        if self._asked.is_set():
            self._said.wait(5.0)  # the request's line comes before this one in the log
        self._finished.set()
        log.warning("[Concurrent Checkpoint] final checkpoint %s committed; exiting with status %d",
                    f"checkpoint-{self.final_step}" if self.final_step is not None else "(none)", EXIT_STATUS)
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(EXIT_STATUS)


def finish_process_group() -> None:
    """Destroy the default process group the script left behind (never imports torch itself).

    Call it only after the script or the training ended normally (as torchtitan does: a rank that failed in the
    middle of a collective must not block in a teardown). A script written for the ``deepspeed``
    launcher rarely calls ``destroy_process_group``; left to the interpreter's finalization, gloo's
    worker threads can abort the process (SIGABRT, "terminate called without an active
    exception") after it succeeded, and torchrun reports the node failed (pytorch/pytorch#190489).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
