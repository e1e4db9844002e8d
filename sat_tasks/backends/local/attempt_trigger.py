"""The triggerer's watch over a local attempt's process (`attempt_process`): the `launch` task defers to it.

`AttemptEndTrigger` fires once, when one of these holds (checked every `poll_seconds`, a stat
and a read of /proc each, no Object Storage request):

- `ended`, `interrupted`, `failed` or `error`: the process wrote its outcome;
- `started` (only while `announced` is false): the attempt's Running entry is recorded, so the
  task publishes the run's summary (ADR 0022) and defers again;
- `gone`: the process is not running and left no outcome (killed, the host restarted);
- `elsewhere`: this triggerer runs on another host than the process (the local backend's
  processes and files are one host's).

Its event's payload carries what the task needs next (`relaunches`, `log_offset`): `dag.test()`
hands the task the event alone, not the deferral's own kwargs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from sat_tasks.backends.local.attempt_process import is_alive, outcome_path, read_outcome, started_path

#: How often the trigger looks (seconds): the end of an attempt is seen this late at most.
POLL_SECONDS = 2.0


class AttemptEndTrigger(BaseTrigger):
    """Fires when attempt `attempt`'s process (`pid`, started at `start_ticks` on `host`) ends, or its attempt starts.

    Args:
        attempts_dir: the run's `attempts/` folder on the host's disk.
        attempt: 1-based attempt number.
        pid, start_ticks, host: the process (`attempt_process.Supervisor`).
        relaunches: how often the process was started again after it was gone (echoed in the event).
        announced: the attempt's start was already published (no `started` event).
        log_offset: how much of the process's log the task has copied into its own (echoed).
        poll_seconds: the time between two looks.
    """

    def __init__(self, *, attempts_dir: str, attempt: int, pid: int, start_ticks: int, host: str,
                 relaunches: int = 0, announced: bool = False, log_offset: int = 0,
                 poll_seconds: float = POLL_SECONDS) -> None:
        super().__init__()
        self.attempts_dir = attempts_dir
        self.attempt = attempt
        self.pid = pid
        self.start_ticks = start_ticks
        self.host = host
        self.relaunches = relaunches
        self.announced = announced
        self.log_offset = log_offset
        self.poll_seconds = poll_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "attempts_dir": self.attempts_dir, "attempt": self.attempt, "pid": self.pid,
            "start_ticks": self.start_ticks, "host": self.host, "relaunches": self.relaunches,
            "announced": self.announced, "log_offset": self.log_offset, "poll_seconds": self.poll_seconds})

    def check(self) -> dict[str, Any] | None:
        """The event's payload when the trigger fires now; None while the attempt's process runs on."""
        if socket.gethostname() != self.host:
            return self._payload("elsewhere", message=f"the attempt's process runs on {self.host}, this triggerer on "
                                                      f"{socket.gethostname()}: the local backend needs both on one host")
        attempts = Path(self.attempts_dir)
        outcome = read_outcome(attempts, self.attempt) if outcome_path(attempts, self.attempt).exists() else None
        if outcome is None and not is_alive(self.pid, self.start_ticks):
            outcome = read_outcome(attempts, self.attempt)  # written just before it exited
            if outcome is None:
                return self._payload("gone")
        if outcome is not None:
            return self._payload(str(outcome.get("outcome")), message=str(outcome.get("message") or ""))
        if not self.announced and started_path(attempts, self.attempt).exists():
            return self._payload("started")
        return None

    def _payload(self, status: str, message: str = "") -> dict[str, Any]:
        return {"status": status, "attempt": self.attempt, "pid": self.pid, "relaunches": self.relaunches,
                "log_offset": self.log_offset, "message": message}

    async def on_kill(self) -> None:
        """A person acted on the deferred task (mark failed, clear, a run ended): what the task's `on_kill` did.

        SIGTERM to the attempt's process: the training takes its final checkpoint and the attempt
        is interrupted, not ended (a triggerer's restart or a completed trigger never calls this).
        """
        if socket.gethostname() == self.host and is_alive(self.pid, self.start_ticks):
            self.log.info("attempt %s: the task was stopped: SIGTERM to its process %s", self.attempt, self.pid)
            os.kill(self.pid, signal.SIGTERM)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            payload = self.check()
            if payload is not None:
                self.log.info("attempt %s: %s (process %s)", self.attempt, payload["status"], self.pid)
                yield TriggerEvent(payload)
                return
            await asyncio.sleep(self.poll_seconds)
