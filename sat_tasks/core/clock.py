"""Time as SAT records it: tz-aware UTC, ISO 8601."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def now_utc() -> datetime:
    """The current time, UTC, tz-aware."""
    return datetime.now(UTC)


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (`Z` or an offset) as a datetime; None when absent or unreadable."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))  # 3.11 reads a trailing "Z" as UTC itself
    except ValueError:
        return None
