"""The job log's tail, and what it gained since an offset, in whole lines: one bounded read of a `run_files.ByteSource`.

The page shows the last `TAIL_BYTES` of the log and then asks for what came after the
offset it has (`read_log(source, offset)`): only the new bytes travel, and a log that grew by
more than `limit` since then skips to its last `limit` bytes (the answer says how many were
skipped: the download has them). A piece ends at its last newline, so a line still being
written comes whole with the next read, and a UTF-8 character is never cut (but in a line
longer than `limit`, which is cut where the limit falls).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from sat_tasks.core.joblog import START_MARKER
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
    `source`: where it was read (a path or a URI).
    """

    start: int
    end: int
    size: int
    text: str
    skipped: int = 0
    restarted: bool = False
    source: str = ""

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
