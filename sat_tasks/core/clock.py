"""Time as SAT records it: tz-aware UTC, ISO 8601."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def now_utc() -> datetime:
    """The current time, UTC, tz-aware."""
    return datetime.now(timezone.utc)


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (`Z` or an offset) as a datetime; None when absent or unreadable."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
