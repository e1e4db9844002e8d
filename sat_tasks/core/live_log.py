"""The running attempt's part of the job log, read where the attempt writes it, and the cursor a reader follows it by.

A backend whose attempts keep their log elsewhere than the job log the view reads (Kubernetes:
in the pods, until classify stores the attempt's section) answers `Backend.live_log` with a
`LiveLog`: whole lines, the section's opening line first on a first read. Such a log has no
byte offsets a reader could ask from (the pod log API reads from the end, by lines, and the
first bytes of those); the reader goes on from a `LiveCursor` instead: the runtime's
timestamp of the last line it has and how many lines with exactly that timestamp it has
(two lines of one write can share it). ADR 0026 says what the view makes of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sat_tasks.errors import SatError

CURSOR_RULE = "<attempt>:<pod>:<nanoseconds>:<lines or 'closed'> as the previous answer's `cursor` gave it"
_CURSOR = re.compile(r"(\d{1,6}):([a-z0-9][a-z0-9.-]{0,252}):(\d{1,20}):(\d{1,9}|closed)")
# RFC 3339 with up to nanoseconds, as the container runtime prefixes a line (`timestamps=true`).
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


class BadCursor(SatError, ValueError):
    """A cursor that no answer gave (the message says the rule)."""


@dataclass(frozen=True)
class LiveCursor:
    """Where a reader of a live section is: the attempt, the pod it follows, the last line it has.

    `at`: that line's timestamp in nanoseconds since the epoch (0: only the opening line so
    far); `count`: the lines it has with exactly `at`; `closed`: it has the section's closing
    line (the container ended), nothing more comes from this pod.
    """

    attempt: int
    source: str
    at: int = 0
    count: int = 0
    closed: bool = False

    def encode(self) -> str:
        return f"{self.attempt}:{self.source}:{self.at}:{'closed' if self.closed else self.count}"

    @classmethod
    def parse(cls, text: str) -> LiveCursor:
        match = _CURSOR.fullmatch(text)
        if match is None:
            raise BadCursor(f"cursor: {CURSOR_RULE} (got {text[:80]!r})")
        attempt, source, at, count = match.groups()
        closed = count == "closed"
        return cls(int(attempt), source, int(at), 0 if closed else int(count), closed)

    def after(self, at: int) -> LiveCursor:
        """The cursor once the reader has one more line stamped `at`."""
        return LiveCursor(self.attempt, self.source, at, self.count + 1 if at == self.at else 1)


def split_stamp(line: str) -> tuple[int | None, str]:
    """A `timestamps=true` log line as (nanoseconds since the epoch, the line as the container wrote it)."""
    match = _STAMP.match(line)
    if match is None:
        return None, line
    whole, fraction, zone = match.groups()
    seconds = int(datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp())
    return seconds * 10**9 + int((fraction or "0").ljust(9, "0")), line[match.end():]


@dataclass(frozen=True)
class LiveLog:
    """What a read of the running attempt's log gave.

    `text`: whole lines (the section's opening line first when the read began it; `[sat]` lines
    where lines were left out or the container ended); `cursor`: where the next read goes on
    from (None: the read failed, keep the one you have); `more`: the read stopped at its bound,
    more lines are waiting; `note`: where it was read and what is missing, for a person.
    """

    attempt: int | None
    text: str
    cursor: LiveCursor | None
    more: bool = False
    note: str = ""
