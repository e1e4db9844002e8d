"""The attempt's window: which events of a node (NodeClaim, Kueue Workload) are about an attempt, and how many are kept.

A node outlives the pods it runs, so its events are read only from a little before the
attempt's pod started (`WINDOW_BEFORE`) to a little after it ended (`WINDOW_AFTER`), at most
`MAX_EVENTS_PER_OBJECT` of them (the newest). The Kubernetes backend and `sat classify
--node-events` use the same window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sat_tasks.core.clock import parse_time

#: Events of the node this long before the pod started are about an earlier workload
#: (a stale Xid of the day before).
WINDOW_BEFORE = timedelta(seconds=60)
#: ... and this long after the attempt ended still about this one: the node controller marks
#: a node that stopped answering NotReady only after its grace period (40-50 s), and a Spot
#: node is deleted minutes after its instance stopped.
WINDOW_AFTER = timedelta(minutes=5)
#: At most this many events per object (pod, node, NodeClaim, Workload): the newest.
MAX_EVENTS_PER_OBJECT = 100


def _utc(moment: datetime | None) -> datetime | None:
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def _time(value: Any) -> datetime | None:
    return _utc(parse_time(value)) if isinstance(value, (str, datetime)) else None


def event_time(event: dict[str, Any]) -> datetime | None:
    """When an event last happened: lastTimestamp, eventTime, firstTimestamp, else its creation; None if unknown."""
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        moment = _time(event.get(key))
        if moment:
            return moment
    metadata = event.get("metadata")
    return _time(metadata.get("creationTimestamp")) if isinstance(metadata, dict) else None


def by_time(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events oldest first (those without a time first, in their order)."""
    earliest = datetime.min.replace(tzinfo=UTC)
    return sorted(events, key=lambda e: (event_time(e) is not None, event_time(e) or earliest))


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


@dataclass(frozen=True)
class AttemptWindow:
    """The time an attempt ran, widened by `WINDOW_BEFORE` and `WINDOW_AFTER`; None: open on that side."""

    start: datetime | None = None
    end: datetime | None = None

    @classmethod
    def around(cls, started: datetime | None, ended: datetime | None) -> AttemptWindow:
        """The window of an attempt that started and ended then (either may be unknown)."""
        started, ended = _utc(started), _utc(ended)
        return cls(started - WINDOW_BEFORE if started else None, ended + WINDOW_AFTER if ended else None)

    @classmethod
    def of_pod(cls, pod: dict[str, Any]) -> AttemptWindow:
        """From the pod's start (`status.startTime`, else when it was scheduled) to its end (the last
        container's `finishedAt`; for a pod in a final phase without one, its last condition change)."""
        status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
        conditions = _dicts(status.get("conditions"))
        scheduled = [c.get("lastTransitionTime") for c in conditions if c.get("type") == "PodScheduled"]
        start = _time(status.get("startTime")) or _time(next(iter(scheduled), None))
        finished = []
        for entry in _dicts(status.get("containerStatuses")) + _dicts(status.get("initContainerStatuses")):
            for state in ("state", "lastState"):
                terminated = (entry.get(state) or {}).get("terminated") if isinstance(entry.get(state), dict) else None
                if isinstance(terminated, dict):
                    finished.append(_time(terminated.get("finishedAt")))
        if not any(finished) and status.get("phase") in ("Succeeded", "Failed"):
            finished = [_time(c.get("lastTransitionTime")) for c in conditions]
        return cls.around(start, max((moment for moment in finished if moment), default=None))

    def holds(self, event: dict[str, Any]) -> bool:
        """Whether the event happened in the window (an event without a time is kept)."""
        moment = event_time(event)
        if moment is None:
            return True
        return (self.start is None or moment >= self.start) and (self.end is None or moment <= self.end)

    def select(self, events: list[dict[str, Any]], limit: int = MAX_EVENTS_PER_OBJECT) -> tuple[list[dict[str, Any]], int, int]:
        """The events in the window, oldest first, at most `limit` (the newest); and how many were
        outside the window and how many over the bound were left out."""
        inside = by_time([e for e in events if self.holds(e)])
        kept = newest(inside, limit)
        return kept, len(events) - len(inside), len(inside) - len(kept)


def newest(events: list[dict[str, Any]], limit: int = MAX_EVENTS_PER_OBJECT) -> list[dict[str, Any]]:
    """The last `limit` of `events` (oldest first: the newest)."""
    return events[-limit:] if len(events) > limit else events
