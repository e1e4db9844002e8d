"""A run's status history in a few fields (what the Training Jobs list keeps), GPU-hours, and who hears of it.

Call order: the status history is saved, then `publish(summarize_history(entries).to_dict())`
hands the summary to every registered `SummaryListener` (the Airflow layer registers one
that pushes it as the task's XCom `SUMMARY_KEY`; ADR 0022). A listener that fails is ignored:
the summary is derived data, the history is the record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
    `short_node_s`: node-seconds of those closed intervals that the job's nodes did not run
    (an elastic failover resumed on fewer nodes, ADR 0029); `running_short_nodes`: the nodes the
    open interval's attempt runs without. Node-seconds = nodes x running time - the shortfall.
    """

    status: str | None = None
    status_at: str | None = None
    attempt: int | None = None
    running_s: float = 0.0
    running_since: str | None = None
    short_node_s: float = 0.0
    running_short_nodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> RunSummary:
        """The summary in `raw` (a dict as published); wrongly typed fields read as absent."""
        raw = raw if isinstance(raw, dict) else {}

        def text(name: str) -> str | None:
            return raw.get(name) if isinstance(raw.get(name), str) else None

        def number(name: str) -> float:
            value = raw.get(name)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

        attempt = raw.get("attempt")
        return cls(status=text("status"), status_at=text("status_at"),
                   attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                   running_s=number("running_s"), running_since=text("running_since"),
                   short_node_s=max(0.0, number("short_node_s")),
                   running_short_nodes=max(0, int(number("running_short_nodes"))))


def _time(value: Any) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def summarize_history(entries: list[dict[str, Any]], held: Mapping[int, int] | None = None,
                      nodes: int | None = None) -> RunSummary:
    """The summary of a status history (oldest first): the last word, its time, the highest attempt, running time.

    A `Running` interval opens at a `Running` entry and closes at the next entry with another
    status (consecutive `Running` entries are one interval); entries without a readable time
    are skipped for the arithmetic. Within it, an attempt whose start entry holds `nodes_held`
    of the job's `nodes` (an elastic failover, ADR 0029) runs `nodes - nodes_held` nodes short
    from that entry until another attempt's entry or another count (`short_node_s`,
    `running_short_nodes`). A history written before entries carried the counts: `held` (attempt
    -> the nodes its record lists) and the job's `nodes` stand in for them, when the caller has
    read the records; without them such an attempt counts as holding every node.
    """
    entries = [e for e in entries if isinstance(e, dict) and isinstance(e.get("status"), str)]
    if not entries:
        return RunSummary()
    closed = short = 0.0
    opened: datetime | None = None
    segment: tuple[datetime, int, Any] | None = None  # (since, nodes short, attempt) of the open interval's part
    for entry in entries:
        at = _time(entry.get("at"))
        if at is None:
            continue
        if entry["status"] == RUNNING:
            opened = opened or at
            found, attempt = _nodes_short(entry, held or {}, nodes), entry.get("attempt")
            if segment is None or (found is not None and found != segment[1]) or (
                    attempt is not None and segment[2] is not None and attempt != segment[2]):
                if segment is not None:
                    short += segment[1] * max(0.0, (at - segment[0]).total_seconds())
                segment = (at, found or 0, attempt)
        elif opened is not None:
            closed += max(0.0, (at - opened).total_seconds())
            if segment is not None:
                short += segment[1] * max(0.0, (at - segment[0]).total_seconds())
            opened, segment = None, None
    attempts = [a for e in entries if isinstance(a := e.get("attempt"), int) and not isinstance(a, bool)]
    last = entries[-1]
    return RunSummary(status=last["status"], status_at=last.get("at") if isinstance(last.get("at"), str) else None,
                      attempt=max(attempts) if attempts else None, running_s=round(closed, 3),
                      running_since=opened.isoformat() if opened is not None else None,
                      short_node_s=round(short, 3), running_short_nodes=segment[1] if segment is not None else 0)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _nodes_short(entry: dict[str, Any], held: Mapping[int, int], nodes: int | None) -> int | None:
    """How many of the job's nodes a Running entry's attempt runs without (1 of 2 held: 1); None: the entry says not.

    The entry's own `nodes_held` of `nodes`; else, for an attempt's start entry of an older history,
    the count its record lists (`held`) of the job's `nodes`.
    """
    count, of = _count(entry.get("nodes_held")), _count(entry.get("nodes"))
    if count is None and entry.get("task") == "launch" and nodes is not None:
        attempt = entry.get("attempt")
        count, of = _count(held.get(attempt) if isinstance(attempt, int) else None), nodes
    if count is None or of is None or count == 0:
        return None
    return max(0, of - count)


def running_seconds(running_s: float, running_since: datetime | None, now: datetime) -> float:
    """Time spent Running so far: the closed intervals plus the open one up to `now`."""
    return running_s + (max(0.0, (now - running_since).total_seconds()) if running_since is not None else 0.0)


def gpu_hours(nodes: int, gpus_per_node: int, seconds_running: float) -> float:
    """GPU-hours: nodes x GPUs per node x running time (hours)."""
    return nodes * gpus_per_node * seconds_running / 3600.0


def node_hours(nodes: int, seconds_running: float) -> float:
    """Node-hours: nodes x running time (hours); what a job without GPUs (a CPU job) used."""
    return nodes * seconds_running / 3600.0


def short_node_seconds(short_node_s: float, running_short_nodes: int, running_since: datetime | None,
                       now: datetime) -> float:
    """Node-seconds the job's nodes did not run so far (elastic attempts on fewer nodes): closed plus open part."""
    return (short_node_s or 0.0) + (running_short_nodes or 0) * running_seconds(0.0, running_since, now)


def usage(nodes: int | None, gpus_per_node: int | None, seconds_running: float,
          short_node_s: float = 0.0) -> dict[str, Any]:
    """What a run used while `Running` (every attempt, failovers included), as the view shows it.

    Node-seconds = nodes x `seconds_running` - `short_node_s` (what elastic attempts on fewer
    nodes did not hold). `gpu_hours` (x GPUs per node) and `node_hours`, 3 decimals; `cpu_only`:
    the job asked for no GPU, so its GPU-hours are 0 and its node-hours say what it used.
    """
    nodes, gpus = nodes or 0, gpus_per_node or 0
    node_s = max(0.0, nodes * seconds_running - (short_node_s or 0.0))
    return {"gpu_hours": round(gpus * node_s / 3600.0, 3), "node_hours": round(node_s / 3600.0, 3),
            "cpu_only": gpus == 0}


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
