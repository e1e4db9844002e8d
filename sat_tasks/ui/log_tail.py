"""The job log's tail, and what it gained since an offset, in whole lines: one bounded read of a `run_files.ByteSource`.

The page shows the last `TAIL_BYTES` of the log and then asks for what came after the
offset it has (`read_log(source, offset)`): only the new bytes travel, and a log that grew by
more than `limit` since then skips to its last `limit` bytes (the answer says how many were
skipped: the download has them). A piece ends at its last newline, so a line still being
written comes whole with the next read, and a UTF-8 character is never cut (but in a line
longer than `limit`, which is cut where the limit falls).

A live section (`read_job_log`): while a Kubernetes attempt runs, its lines are in its pods,
not yet in a stored section (`core.live_log`, `backends.kubernetes.pod_log`). The log a
reader sees is then the stored sections (bytes [0, E)) followed by the running attempt's
section as the backend reads it. Offsets below E are the stored sections' bytes, as above. A
live section has no byte offsets to ask from: its reader holds a `cursor` (the answer gives
it) and its `offset` past E only counts the bytes it was given (`size` is that count too:
what is known of the log so far); `more`: the read stopped at its bound, ask again at once.
A reader without a cursor past E, or whose attempt has ended meanwhile (its section is now
stored, every rank's log in it, in other bytes than the reader was given), is `restarted`:
it gets the log's tail again. While no pod of a running attempt can be read (not started,
gone), the answer has no new line and `source` says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from typing import Any

from sat_tasks.core.joblog import START_MARKER
from sat_tasks.core.live_log import LiveCursor, LiveLog
from sat_tasks.ui.run_files import ByteSource

TAIL_BYTES = 64 * 1024  # what the page shows first
MAX_READ_BYTES = 1 << 20  # the most one request reads (and the byte before a tail, to know where its line begins)
# The lines that open and close an attempt's section (`core.joblog`), and the start of training: the page marks them.
MARKER = re.compile(r"\[sat\] attempt \d+ (?:of job |ended: )|" + re.escape(START_MARKER))


def is_marker(line: str) -> bool:
    """Whether a job-log line opens or closes an attempt's section, or says training (re)starts."""
    return MARKER.search(line) is not None


@dataclass(frozen=True)
class LogPiece:
    """Bytes [start, end) of the log as text, and how the reader goes on.

    `offset`: where to ask from next time (`end`); `size`: the log's size when read;
    `skipped`: bytes between the offset asked and `start` left out (older than the limit);
    `restarted`: the log is shorter than the offset asked (another copy of it: read from its tail);
    `source`: where it was read (a path or a URI); `cursor`: where a reader of a live section goes on from
    (the module's docstring); `more`: the read stopped at its bound, more is waiting.
    """

    start: int
    end: int
    size: int
    text: str
    skipped: int = 0
    restarted: bool = False
    source: str = ""
    cursor: str | None = None
    more: bool = False

    @property
    def offset(self) -> int:
        return self.end

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "offset": self.offset}


def read_log(source: ByteSource, offset: int | None = None, limit: int = TAIL_BYTES, *,
             growing: bool = True) -> LogPiece:
    """The log's last `limit` bytes (offset None), or what it gained after `offset` (at most `limit` bytes).

    `growing`: the run may still write to the log, so a last line without its newline waits;
    once the run has ended it is shown as it is.
    """
    limit = max(1, min(limit, MAX_READ_BYTES))
    size = source.size()
    restarted = offset is not None and offset > size
    if offset is None or restarted:
        start = max(0, size - limit)
        skipped = 0
    else:
        start = max(offset, size - limit)
        skipped = start - offset
    if start > 0 and (offset is None or restarted or skipped):
        # A tail may begin mid-line: read the byte before too, and drop the part line (unless it is all there is).
        data = source.read(start - 1, min(limit, size - start) + 1)
        cut = data.find(b"\n")
        if 0 <= cut < len(data) - 1:
            dropped = cut  # the bytes of the part line (none when `start` is a line's first byte)
            data, start, skipped = data[cut + 1:], start + dropped, skipped + (dropped if skipped else 0)
        else:
            data = data[1:]
    else:
        data = source.read(start, min(limit, size - start))
    last, whole = data.rfind(b"\n"), growing or start + len(data) < size
    if whole and last >= 0:
        data = data[:last + 1]  # a line cut by the limit, or still being written, comes whole next time
    elif whole and len(data) < limit:
        data = b""  # only part of a line so far
    return LogPiece(start=start, end=start + len(data), size=size, text=data.decode("utf-8", errors="replace"),
                    skipped=skipped, restarted=restarted, source=source.where)


# (cursor, limit, lines) -> the running attempt's section after `cursor` as its backend reads it (`Backend.live_log`)
LiveReader = Callable[[LiveCursor | None, int, int], LiveLog | None]
LIVE_TAIL_LINES = 1000  # a first read of a live section: its last lines


def read_job_log(stored: ByteSource | None, attempts: Collection[int], live: LiveReader, offset: int | None = None,
                 cursor: LiveCursor | None = None, limit: int = TAIL_BYTES) -> LogPiece:
    """The stored sections (`attempts`' sections, complete) followed by the running attempt's live section.

    The module's docstring says what `offset` and `cursor` mean here.
    """
    limit = max(1, min(limit, MAX_READ_BYTES))
    size = stored.size() if stored is not None else 0
    where = stored.where if stored is not None else ""
    if cursor is not None:
        if offset is None or offset < size or cursor.attempt in attempts:
            return _tail(stored, size, live, limit, restarted=True)
        got = live(cursor, limit, LIVE_TAIL_LINES)
        if got is None or got.cursor is None:  # nothing readable now: the reader waits where it is
            why = got.note if got is not None else (f"attempt {cursor.attempt}'s pod is no longer there; its section "
                                                    "comes when classify stores it")
            return LogPiece(offset, offset, offset, "", source=_joined(where, why), cursor=cursor.encode())
        if (got.cursor.attempt, got.cursor.source) != (cursor.attempt, cursor.source):  # another pod's section
            return _tail(stored, size, live, limit, restarted=True, got=got)
        end = offset + len(got.text.encode())
        return LogPiece(offset, end, end, got.text, source=_joined(where, got.note), cursor=got.cursor.encode(),
                        more=got.more)
    if offset is None or offset > size:  # a first read, or a live offset without its cursor
        return _tail(stored, size, live, limit, restarted=offset is not None)
    if offset < size and stored is not None:  # the stored sections first; the live one follows once they are read
        piece = read_log(stored, offset, limit, growing=False)
        return LogPiece(piece.start, piece.end, size, piece.text, skipped=piece.skipped, source=where, more=True)
    got = live(None, limit, LIVE_TAIL_LINES)
    if got is None or got.cursor is None:
        return LogPiece(size, size, size, "", source=_joined(where, got.note if got else ""))
    end = size + len(got.text.encode())
    return LogPiece(size, end, end, got.text, source=_joined(where, got.note), cursor=got.cursor.encode(),
                    more=got.more)


def _tail(stored: ByteSource | None, size: int, live: LiveReader, limit: int, *, restarted: bool,
          got: LiveLog | None = None) -> LogPiece:
    """The log's last `limit` bytes: the live section's first read, and the stored sections' tail before it."""
    got = got or live(None, limit, LIVE_TAIL_LINES)
    fresh = got is not None and got.cursor is not None
    text = got.text if fresh else ""
    room, start, before = limit - len(text.encode()), size, ""
    if room > 0 and stored is not None and size:
        piece = read_log(stored, None, room, growing=False)
        start, before = piece.start, piece.text
    end = size + len(text.encode())
    where = stored.where if stored is not None else ""
    return LogPiece(start, end, end, before + text, restarted=restarted, source=_joined(where, got.note if got else ""),
                    cursor=got.cursor.encode() if fresh else None, more=bool(got and got.more))


def _joined(where: str, note: str) -> str:
    return "; then ".join(part for part in (where, note) if part)
