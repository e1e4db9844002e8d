"""A run's status history in a few fields (what the Training Jobs list keeps), GPU-hours, and who hears of each change.

Call order: the status history is saved, then `publish(summarize_history(entries).to_dict())`
hands the summary to every registered `SummaryListener` (the Airflow layer registers one
that pushes it as the task's XCom `SUMMARY_KEY`; ADR 0022). A listener that fails is ignored:
the summary is derived data, the history is the record.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

SUMMARY_KEY = "sat_summary"  # the XCom key the summaries travel under
RUNNING = "Running"  # the status word of a job whose nodes train (JobStatus.RUNNING)


@dataclass(frozen=True)
class RunSummary:
    """What the list keeps of a run's status history.

    `running_s`: seconds spent in `Running` in closed intervals (every attempt, failovers
    included); `running_since`: the start of the open interval (the job is Running now).
    """

    status: str | None = None
    status_at: str | None = None
    attempt: int | None = None
    running_s: float = 0.0
    running_since: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> RunSummary:
        """The summary in `raw` (a dict as published); wrongly typed fields read as absent."""
        raw = raw if isinstance(raw, dict) else {}

        def text(name: str) -> str | None:
            return raw.get(name) if isinstance(raw.get(name), str) else None

        attempt = raw.get("attempt")
        running = raw.get("running_s")
        return cls(status=text("status"), status_at=text("status_at"),
                   attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                   running_s=float(running) if isinstance(running, (int, float)) and not isinstance(running, bool)
                   else 0.0, running_since=text("running_since"))


def _time(value: Any) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def summarize_history(entries: list[dict[str, Any]]) -> RunSummary:
    """The summary of a status history (oldest first): the last word, its time, the highest attempt, running time.

    A `Running` interval opens at a `Running` entry and closes at the next entry with another
    status (consecutive `Running` entries are one interval); entries without a readable time
    are skipped for the arithmetic.
    """
    entries = [e for e in entries if isinstance(e, dict) and isinstance(e.get("status"), str)]
    if not entries:
        return RunSummary()
    closed = 0.0
    opened: datetime | None = None
    for entry in entries:
        at = _time(entry.get("at"))
        if at is None:
            continue
        if entry["status"] == RUNNING:
            opened = opened or at
        elif opened is not None:
            closed += max(0.0, (at - opened).total_seconds())
            opened = None
    attempts = [a for e in entries if isinstance(a := e.get("attempt"), int) and not isinstance(a, bool)]
    last = entries[-1]
    return RunSummary(status=last["status"], status_at=last.get("at") if isinstance(last.get("at"), str) else None,
                      attempt=max(attempts) if attempts else None, running_s=round(closed, 3),
                      running_since=opened.isoformat() if opened is not None else None)


def running_seconds(running_s: float, running_since: datetime | None, now: datetime) -> float:
    """Time spent Running so far: the closed intervals plus the open one up to `now`."""
    return running_s + (max(0.0, (now - running_since).total_seconds()) if running_since is not None else 0.0)


def gpu_hours(nodes: int, gpus_per_node: int, seconds_running: float) -> float:
    """GPU-hours: nodes x GPUs per node x running time (hours)."""
    return nodes * gpus_per_node * seconds_running / 3600.0


class SummaryListener:
    """Hears of each published summary (an extension point: subclass and register; the default does nothing)."""

    @staticmethod
    def summary_published(fields: dict[str, Any]) -> None:
        """`fields`: a `RunSummary.to_dict()`, or a part of one (e.g. `{"goodput": 0.93}` from finalize)."""


LISTENERS: list[SummaryListener] = []


def register(listener: SummaryListener) -> None:
    """Add `listener` once (registering the same class twice keeps one)."""
    if not any(type(existing) is type(listener) for existing in LISTENERS):
        LISTENERS.append(listener)


def publish(fields: dict[str, Any]) -> None:
    """Hand `fields` to every listener; a listener's error is swallowed (the history is the record)."""
    for listener in LISTENERS:
        try:
            listener.summary_published(fields)
        except Exception as error:  # noqa: BLE001 - the index is derived data: a failed push never fails a task
            logging.getLogger(__name__).warning("the run summary was not published: %s: %s",
                                                type(error).__name__, error)
