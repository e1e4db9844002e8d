"""The node's sidecar sampler: the system and job series of one attempt, beside whatever command it runs.

The launcher (the local runner; the pod's PID 1 supervisor) starts ``python -m
ckpt_engine.metrics`` beside the training command and sets ``SAT_METRICS_SIDECAR=1`` for
the command, whose own recorder then writes only the training and checkpoint series.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from typing import Protocol

from ckpt_engine.contract import METRICS_DIR_ENV, PROGRESS_FILE_ENV
from ckpt_engine.metrics.recorder import MetricsRecorder, yield_cpu

PARENT_CHECK_S = 5.0  # after the first step the sidecar's main thread wakes only to see whether its launcher lives


def _first_step(progress_file: str, attempt: int | None) -> int | None:
    """The step in progress.json when the engine stamped it with ``attempt`` (None before the first step)."""
    try:
        with open(progress_file, encoding="utf-8") as handle:
            progress = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(progress, dict) or not isinstance(progress.get("step"), int):
        return None
    if attempt is not None and progress.get("attempt") not in (None, attempt):
        return None
    return progress["step"]


class Stop(Protocol):
    """What the sidecar waits on: a ``threading.Event`` (tests, a thread) or ``SignalStop`` (the process)."""

    def wait(self, timeout: float) -> bool: ...


def run_sidecar(stop: Stop, *, poll_s: float = 1.0, parent_pid: int | None = None,
                rec: MetricsRecorder | None = None) -> MetricsRecorder:
    """The node's system and job series for one attempt, whatever the command is, until ``stop`` or the parent ends.

    The launcher (the local runner; the pod's PID 1 supervisor) starts it beside the command,
    so every attempt has them, also one whose script does not use SAT's engine and one that
    dies before its first interval: a sample at once (status ``Starting``), a ``first_step``
    job record (uploaded at once) when progress.json shows the attempt's first training step,
    a sample every interval, and a last one (status ``Ended``) when stopped (SIGTERM).
    """
    if rec is None:
        rec = MetricsRecorder.from_env(os.environ.get(METRICS_DIR_ENV, "").strip() or ".", ("system", "job"))
    progress_file = os.environ.get(PROGRESS_FILE_ENV, "").strip()
    attempt = rec.identity["attempt"]
    yield_cpu()  # the main thread (and the threads it starts) at nice 19: yields the CPU to training
    rec.status = "Starting"
    rec.sample()
    # The periodic samples come from a SCHED_IDLE thread: it never preempts a training thread
    # when it wakes, which nice 19 alone does (ADR 0017: +2-3% step time at a 1 s interval on
    # two busy cores). This thread keeps the prompt ones: the first_step record and the last sample.
    rec.start(idle=True)
    seen_step = not progress_file
    while not stop.wait(min(poll_s, rec.interval_s) if not seen_step else max(poll_s, PARENT_CHECK_S)):
        if parent_pid is not None and os.getppid() != parent_pid:
            break  # the launcher is gone (the pod's supervisor, the local runner): the attempt ended
        if seen_step:
            continue
        try:
            step = _first_step(progress_file, attempt)
            if step is not None:
                seen_step = True
                rec.note_first_step(step)
                rec.sample()
        except Exception as exc:  # noqa: BLE001 - metrics never stop an attempt
            rec.say(f"[sat metrics] sample failed: {type(exc).__name__}: {exc}")
    rec.close("Ended")
    return rec


class SignalStop:
    """A stop request that comes as SIGTERM or SIGINT, taken synchronously: ``wait`` is ``Event.wait``'s shape.

    The signals are blocked (in the calling thread, and so in every thread it starts after) and
    received with ``sigtimedwait``: no Python signal handler runs. A handler that set a
    ``threading.Event`` deadlocked the sidecar when a second SIGTERM arrived while the first
    handler held the event's (non-reentrant) lock — the launcher's stop path may signal twice,
    and on a loaded host the window is wide — so the attempt's last sample never came and its
    launcher killed it 30 s later. Create it in the main thread before any other thread starts.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        self._set = False

    def wait(self, timeout: float) -> bool:
        """True once a stop signal came (at once if it came before); else False after ``timeout`` seconds."""
        if not self._set:
            self._set = signal.sigtimedwait(self.SIGNALS, max(0.0, timeout)) is not None
        return self._set


# Libraries whose INFO lines are not the job's: botocore says "Found credentials in environment variables." on
# every client the uploads make, and the sidecar's output is the job log's (issue 45.6).
QUIET_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def configure_logging() -> None:
    """The sidecar's lines at INFO, to stderr (the job log); the AWS SDK's and HTTP library's at WARNING and up."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """``python -m ckpt_engine.metrics``: the sidecar (``--check``: only whether it can run here)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        return 0 if os.environ.get(METRICS_DIR_ENV, "").strip() else 1
    configure_logging()
    run_sidecar(SignalStop(), parent_pid=os.getppid())
    return 0
