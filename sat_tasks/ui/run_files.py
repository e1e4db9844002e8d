"""A run's files as the job page reads them: bounded byte ranges of a file or an object, the job log's freshest copy, the results' listing.

Nothing here reads a whole file into memory: a source answers its size, one byte range
(`read`, at most what the caller asks) or its bytes in chunks (`chunks`, for a streamed
download). Where the job log is while the job runs (`job_log_source`), freshest first:

1. the local backend's `<work dir>/.../job.log`, appended line by line while the attempt runs
   (the API server reads it where it shares the worker's disk, as under `make up`);
2. `<results>/job.log` in Object Storage, uploaded when the run ends (`upload_results`, `finalize`);
3. Kubernetes: the finished attempts' sections `<results>/attempts/attempt-<k>.log` (classify
   stores each at the end of its attempt), read as one log in attempt order; while the run is
   active, the running attempt's section follows them as its backend reads it from its pods
   (`Backend.live_log`; `ui.log_tail.read_job_log` says what a reader's offset means there).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from ckpt_engine import contract
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import RunLayout
from sat_tasks.spec import split_s3_uri

CHUNK_BYTES = 1 << 20  # a streamed download's piece
MAX_LISTED = 1000  # the Outputs tab lists at most this many of a run's objects
_ATTEMPT_LOG = re.compile(r"attempt-(\d+)\.log$")
READ_ERRORS = (BotoCoreError, ClientError, OSError)  # a store or a disk that cannot be read now


class ByteSource(Protocol):
    """Bytes that can be read in bounded pieces. Call order: `size()`, then `read(...)` or `chunks(...)`."""

    where: str  # what a person reads: where the bytes come from

    def size(self) -> int: ...

    def read(self, start: int, length: int) -> bytes: ...

    def chunks(self, stop: int, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class FileSource:
    """A local file (the local backend's job.log, still growing while the attempt runs)."""

    path: Path

    @property
    def where(self) -> str:
        return "the run's work directory, as the job writes it"  # not the server's path

    def size(self) -> int:
        return self.path.stat().st_size

    def read(self, start: int, length: int) -> bytes:
        with open(self.path, "rb") as handle:
            handle.seek(start)
            return handle.read(max(0, length))

    def chunks(self, stop: int, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The first `stop` bytes (the size when the download began: later lines wait for the next one)."""
        with open(self.path, "rb") as handle:
            left = stop
            while left > 0 and (chunk := handle.read(min(chunk_size, left))):
                left -= len(chunk)
                yield chunk


@dataclass(frozen=True)
class ObjectSource:
    """An Object Storage object, read by byte ranges (`Range: bytes=a-b`); `known_size` spares the HEAD."""

    hook: Any
    uri: str
    known_size: int | None = None

    @property
    def where(self) -> str:
        return self.uri

    def size(self) -> int:
        if self.known_size is not None:
            return self.known_size
        bucket, key = split_s3_uri(self.uri)
        return int(self.hook.get_conn().head_object(Bucket=bucket, Key=key)["ContentLength"])

    def read(self, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        bucket, key = split_s3_uri(self.uri)
        body = self.hook.get_conn().get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")["Body"]
        try:
            return body.read(length)
        finally:
            body.close()

    def chunks(self, stop: int, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]:
        if stop <= 0:
            return
        bucket, key = split_s3_uri(self.uri)
        body = self.hook.get_conn().get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{stop - 1}")["Body"]
        try:
            left = stop
            while left > 0 and (chunk := body.read(min(chunk_size, left))):
                left -= len(chunk)
                yield chunk
        finally:
            body.close()


@dataclass(frozen=True)
class JoinedSource:
    """Several sources read as one, in order (the Kubernetes attempts' sections of the job log)."""

    parts: tuple[ObjectSource, ...]

    @property
    def where(self) -> str:
        return ", ".join(part.where for part in self.parts)

    def size(self) -> int:
        return sum(part.size() for part in self.parts)

    def _spans(self, start: int, stop: int) -> Iterator[tuple[ObjectSource, int, int]]:
        base = 0
        for part in self.parts:
            size = part.size()
            low, high = max(start, base), min(stop, base + size)
            if low < high:
                yield part, low - base, high - low
            base += size

    def read(self, start: int, length: int) -> bytes:
        return b"".join(part.read(offset, count) for part, offset, count in self._spans(start, start + length))

    def chunks(self, stop: int, chunk_size: int = CHUNK_BYTES) -> Iterator[bytes]:
        for part, _offset, count in self._spans(0, stop):
            yield from part.chunks(count, chunk_size)


@dataclass(frozen=True)
class JobLogCopy:
    """The job log's freshest copy: its bytes (None before its first line) and, where it is the attempts' stored
    sections, their attempts (a running attempt's section may follow them); None for a whole copy."""

    source: ByteSource | None
    attempts: frozenset[int] | None = None


def job_log_source(layout: RunLayout, hook: Any) -> JobLogCopy:
    """The run's job log where it is freshest (the module's docstring says the order)."""
    if layout.job_log.is_file():
        return JobLogCopy(FileSource(layout.job_log))
    bucket, key = split_s3_uri(layout.results_uri + contract.JOB_LOG_NAME)
    found = hook.get_conn().list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents") or []
    if found and found[0]["Key"] == key:
        return JobLogCopy(ObjectSource(hook, layout.results_uri + contract.JOB_LOG_NAME, int(found[0]["Size"])))
    sections = []
    for name, size in object_sizes(hook, layout.results_uri + contract.ATTEMPTS_DIR, limit=MAX_LISTED).items():
        if match := _ATTEMPT_LOG.fullmatch(name):
            sections.append((int(match.group(1)), ObjectSource(hook, layout.results_uri + contract.ATTEMPTS_DIR + name,
                                                               size)))
    sections.sort()
    return JobLogCopy(JoinedSource(tuple(source for _, source in sections)) if sections else None,
                      frozenset(attempt for attempt, _ in sections))


# ---- the results' files ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResultFile:
    """One object under a run's results prefix: its name there, its size, and the group the Outputs tab shows it in."""

    name: str
    size: int
    group: str


# (group, how its names start), first match wins; what matches none is a record of the run.
GROUPS = (("Model and outputs", (contract.OUTPUT_DIR,)), ("Checkpoints", (contract.MIRROR_DIR,)),
          ("Report and log", (contract.REPORT_NAME, contract.REPORT_HTML_NAME, contract.JOB_LOG_NAME)),
          ("Metrics", (contract.METRICS_DIR,)))
RECORDS = "The run's records"


def group_of(name: str) -> str:
    for group, starts in GROUPS:
        if any(name == start or (start.endswith("/") and name.startswith(start)) for start in starts):
            return group
    return RECORDS


def object_sizes(hook: Any, prefix_uri: str, *, limit: int) -> dict[str, int]:
    """At most `limit` objects under an s3:// prefix: name relative to it -> size (pages of up to 1000, no more)."""
    bucket, prefix = split_s3_uri(prefix_uri)
    sizes: dict[str, int] = {}
    paginator = hook.get_conn().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, PaginationConfig={"MaxItems": limit}):
        for item in page.get("Contents", []):
            sizes[item["Key"][len(prefix):]] = int(item["Size"])
    return sizes


@dataclass(frozen=True)
class ResultListing:
    """The Outputs tab: the files by group (in `GROUPS` order, the records last) and whether the list stops early."""

    groups: tuple[tuple[str, tuple[ResultFile, ...]], ...]
    clipped: bool
    limit: int

    def as_dict(self) -> dict[str, Any]:
        return {"groups": [{"group": group, "files": [{"name": f.name, "size": f.size} for f in files]}
                           for group, files in self.groups], "clipped": self.clipped, "limit": self.limit}


def list_result_files(hook: Any, results_uri: str, limit: int = MAX_LISTED) -> ResultListing:
    """The objects under the run's results prefix, grouped, at most `limit` (one more is read to know there are more)."""
    sizes = object_sizes(hook, results_uri, limit=limit + 1)
    clipped = len(sizes) > limit
    files = [ResultFile(name, size, group_of(name)) for name, size in sorted(sizes.items())[:limit]]
    order = [group for group, _ in GROUPS] + [RECORDS]
    groups = tuple((group, tuple(f for f in files if f.group == group)) for group in order)
    return ResultListing(tuple((group, found) for group, found in groups if found), clipped, limit)


def result_file_source(hook: Any, results_uri: str, name: str) -> ObjectSource | None:
    """The object `name` under the run's results prefix (its size known), None when there is none."""
    uri = results_uri + check_file_name(name)
    bucket, key = split_s3_uri(uri)
    client = hook.get_conn()
    try:
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except client.exceptions.ClientError as error:
        if str(error.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return ObjectSource(hook, uri, size)


class BadFileName(SatError, ValueError):
    """A file name that does not name an object inside the run's results (the message says the rule)."""


FILE_NAME_RULE = ("a path inside the run's results: parts separated by '/', none empty, '.' or '..', "
                  "no backslash or control character")


def check_file_name(name: str) -> str:
    """`name` when it names an object inside the run's results prefix, else BadFileName."""
    parts = name.split("/")
    if (not name or len(name) > 1024 or any(part in ("", ".", "..") for part in parts) or "\\" in name
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise BadFileName(f"file: {FILE_NAME_RULE} (got {name[:80]!r})")
    return name


def attachment_headers(filename: str, size: int) -> dict[str, str]:
    """A download's headers: its name (an ASCII fallback and the UTF-8 name, RFC 6266) and its length."""
    from urllib.parse import quote

    fallback = re.sub(r"[^A-Za-z0-9._-]+", "_", filename) or "download"
    return {"Content-Disposition": f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}",
            "Content-Length": str(size)}
