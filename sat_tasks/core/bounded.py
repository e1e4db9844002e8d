"""Bounded reads of what a job's training process writes and SAT reads back.

A run's training writes some of the files SAT reads (progress.json, the metrics series, its
logs): on this host under the run's directory, in Object Storage under the run's results. A
job that writes 10 GiB there must not make the runner, the CLI or a page hold 10 GiB. A
document is read whole only within `MAX_JSON_BYTES` (`read_file`; `object_storage.read_bounded`
for objects); a log or a series is read from its end (`tail_file`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sat_tasks.errors import SatError

#: The most one document SAT reads back may hold (`read_file`, `object_storage.read_bounded` and `read_json`).
#: SAT's own JSON (status history, attempt records, the report) stays far below it; what a job's training
#: writes may not: whatever a job puts there, one read holds at most this in memory.
MAX_JSON_BYTES = 64 << 20


class ObjectTooLargeError(SatError, ValueError):
    """A document over `MAX_JSON_BYTES` (or the caller's bound): not read."""


def fmt_bytes(n: float) -> str:
    """`n` bytes as people read them (1.5 KiB, 3.0 MiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover (the loop returns)


def too_large(name: str, size: int, max_bytes: int) -> ObjectTooLargeError:
    """The error for `name` holding `size` bytes over `max_bytes`."""
    return ObjectTooLargeError(f"{name} holds {fmt_bytes(size)}, more than the {fmt_bytes(max_bytes)} a document "
                               f"SAT reads back may hold: not read")


def read_file(path: str | Path, max_bytes: int | None = None) -> bytes:
    """The bytes of the file at `path`, at most `max_bytes` (MAX_JSON_BYTES unless given, read at call time).

    Raises OSError as `open` does, and ObjectTooLargeError naming the file and the bound for one
    over it: by its size when opened and by what it holds (a file still growing), reading at most
    one byte past the bound.
    """
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if size > max_bytes:
            raise too_large(str(path), size, max_bytes)
        handle.seek(0)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise too_large(str(path), len(data), max_bytes)
    return data


def tail_file(path: str | Path, limit: int) -> tuple[bytes, int]:
    """The last `limit` bytes of the file at `path` and its size (OSError as `open` raises it)."""
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(max(0, size - limit))
        return handle.read(limit), size


def tail_lines(path: str | Path, limit: int) -> tuple[list[str], int]:
    """The whole lines among the last `limit` bytes of the file at `path` (the one the bound cut left out), and
    the file's size (OSError as `open` raises it)."""
    data, size = tail_file(path, limit + 1)  # the byte before the bound: does a whole line start there?
    whole = size <= limit or data[:1] == b"\n"
    lines = data[-limit:].decode("utf-8", errors="replace").splitlines()
    return (lines if whole else lines[1:]), size


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines text, in order; a line that is not one (cut, torn, a list) is left out.

    For series a job's training appends to while SAT reads (a cut first line of a tail, a torn last one).
    """
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
