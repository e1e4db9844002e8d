"""Object Storage through the Amazon provider's S3Hook: parallel, verified, idempotent transfers."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sat_tasks.core import bounded
from sat_tasks.core.bounded import fmt_bytes, too_large
from sat_tasks.core.handoffs import Log
from sat_tasks.errors import SatError
from sat_tasks.spec import split_s3_uri

if TYPE_CHECKING:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

DEFAULT_CONN_ID = "sat_object_storage"
DEFAULT_WORKERS = 8
SMALL_OBJECT_BYTES = 8 << 20  # below boto3's multipart threshold
STREAM_CHUNK_BYTES = 1 << 20  # what a streamed read holds in memory at once
# A download's temp file is `<file>.sat.part` beside it; staging refuses keys with a part ending in it,
# so no key can name another key's temp file (`x` and `x.part` are two files).
PART_SUFFIX = ".sat.part"


def sat_root(setting: str, prefix: str, results_destination: str) -> str:
    """A prefix SAT owns (warm pool states, the node health ledger): `[sat] <setting>` when set, else
    `<results_destination>/<prefix>` (the prefix starts with `_`, which no job name can)."""
    from sat_tasks.config import sat_setting

    root = sat_setting(setting, "")
    return (root.rstrip("/") + "/") if root else results_destination.rstrip("/") + "/" + prefix


def sat_roots(setting: str, prefix: str) -> list[str]:
    """Every such root of the deployment: `[sat] <setting>`'s one, else one per results destination of
    the job specs in `[sat] jobs_dir` (a spec that does not load is passed over)."""
    from sat_tasks.config import sat_setting
    from sat_tasks.spec import SpecError, load_spec

    if sat_setting(setting, ""):
        return [sat_root(setting, prefix, "")]
    roots = set()
    for path in sorted(Path(sat_setting("jobs_dir")).glob("*.y*ml")):
        try:
            roots.add(sat_root(setting, prefix, load_spec(path).results.destination))
        except (SpecError, OSError):
            continue
    return sorted(roots)


class UnsafeKeyError(SatError, ValueError):
    """An object key would land outside the target directory."""


class TransferVerificationError(SatError, RuntimeError):
    """A transferred file does not match the size or checksum the store reported."""


class SourceNotFoundError(SatError, FileNotFoundError):
    """The Object Storage prefix holds no objects: check the data source URI and that the data was uploaded."""


@dataclass
class TransferReport:
    """What a staging or upload run did; small enough for XCom."""

    source: str
    destination: str
    files: int = 0
    transferred: int = 0
    skipped: int = 0
    bytes_transferred: int = 0
    bytes_total: int = 0
    seconds: float = 0.0
    checks: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)

    @property
    def checksum_verified(self) -> int:
        """Files verified by a checksum (S3's or an MD5 ETag), not by their size only."""
        return sum(n for method, n in self.checks.items() if method != "size")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form without the key list (which can be long)."""
        data = asdict(self)
        data.pop("keys")
        data["checksum_verified"] = self.checksum_verified
        return data


def object_storage_hook(conn_id: str = DEFAULT_CONN_ID) -> S3Hook:
    """The S3Hook for SAT's Object Storage connection (endpoint URL in the connection extra).

    One per process and connection content (`sat_tasks.io.object_storage_hook`): its boto3 client is
    made once, not per task or request.
    """
    from sat_tasks.io.object_storage_hook import shared_hook

    return shared_hook(conn_id)


def safe_relative_path(key: str, prefix: str) -> PurePosixPath:
    """The path of `key` below `prefix`, refusing keys that would escape the target directory."""
    rel = key.removeprefix(prefix)
    if prefix and not prefix.endswith("/") and rel.startswith("/"):
        rel = rel[1:]  # prefix "data" and key "data/x": the separator is not part of the path
    if not rel:
        raise UnsafeKeyError(f"object key {key!r} names the prefix itself, not a file below it")
    if "\\" in rel or "\x00" in rel:
        raise UnsafeKeyError(f"object key {key!r}: backslashes and NUL bytes are not allowed in staged keys")
    path = PurePosixPath(rel)
    if rel.startswith("/") or any(part in ("..", ".") for part in path.parts) or key.startswith("/"):
        raise UnsafeKeyError(
            f"object key {key!r} would escape the target directory ('..', '.' or absolute paths are refused)"
        )
    if any(part.endswith(PART_SUFFIX) for part in path.parts):
        raise UnsafeKeyError(f"object key {key!r}: names ending in {PART_SUFFIX!r} are staging's temp files")
    return path


def check_distinct_paths(pairs: Iterable[tuple[str, PurePosixPath]]) -> None:
    """Refuse keys that would land on one file (`a//b` and `a/b`) or on a file and a folder (`a`, `a/b`).

    `pairs` are (key, its relative path); raises UnsafeKeyError naming both keys.
    """
    files: dict[PurePosixPath, str] = {}
    folders: dict[PurePosixPath, str] = {}
    for key, path in pairs:
        if path in files:
            raise UnsafeKeyError(f"object keys {files[path]!r} and {key!r} both stage to {path.as_posix()!r}: "
                                 "rename one of them")
        if path in folders:
            raise UnsafeKeyError(f"object key {key!r} stages to the file {path.as_posix()!r}, which key "
                                 f"{folders[path]!r} needs as a folder: rename one of them")
        files[path] = key
        for parent in path.parents:
            if parent in files:
                raise UnsafeKeyError(f"object key {key!r} needs {parent.as_posix()!r} as a folder, which key "
                                     f"{files[parent]!r} stages to as a file: rename one of them")
            folders.setdefault(parent, key)


# ---- verifying a staged object -----------------------------------------------------------------
# The additional checksums S3 keeps (`ChecksumMode=ENABLED`), strongest first. CRC32C and
# CRC64NVME need awscrt (botocore's optional CRT) to be computed here; without it they are
# passed over for the next check.
S3_CHECKSUMS = ("SHA256", "SHA1", "CRC64NVME", "CRC32C", "CRC32")
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
_KMS_ENCRYPTION = frozenset({"aws:kms", "aws:kms:dsse"})
_CHUNK = 8 << 20


@dataclass(frozen=True)
class ObjectCheck:
    """How one object is verified: `method` (`sha256` ... `crc32`, `md5`, `size`) and the value to match.

    S3 checksums are base64 of the big-endian digest (as S3 returns them); MD5 is hex (the ETag).
    """

    method: str
    expected: str | None = None

    @property
    def is_checksum(self) -> bool:
        return self.method != "size"


def _crt_checksums() -> dict[str, Callable[[bytes, int], int]]:
    try:
        from awscrt import checksums  # optional: botocore[crt]
    except ImportError:
        return {}
    return {"crc32c": checksums.crc32c, "crc64nvme": checksums.crc64nvme}


def local_checksum_methods() -> frozenset[str]:
    """The checksum methods this process can compute (`sha256`, `sha1`, `crc32`, `md5`; CRT ones with awscrt)."""
    return frozenset({"sha256", "sha1", "crc32", "md5", *_crt_checksums()})


def object_check(meta: Mapping[str, Any]) -> ObjectCheck:
    """The strongest check a HEAD or GET response (`ChecksumMode=ENABLED`) allows for its object.

    1. A full-object checksum S3 keeps (SHA256, SHA1, CRC64NVME, CRC32C, CRC32), if it can be
       computed here. A composite checksum (a multipart upload's checksum of part checksums:
       `-<parts>` suffix, `ChecksumType: COMPOSITE`, or a multipart ETag without
       `ChecksumType: FULL_OBJECT`) is not the file's and is passed over.
    2. MD5, only when the object says its ETag is one: single-part (32 hex digits) and not
       encrypted with SSE-KMS or SSE-C, whose ETags are not the content's MD5.
    3. Size otherwise.
    """
    etag = str(meta.get("ETag", "")).strip('"')
    multipart = "-" in etag
    checksum_type = meta.get("ChecksumType")
    computable = local_checksum_methods()
    for algorithm in S3_CHECKSUMS:
        value = meta.get(f"Checksum{algorithm}")
        if not value or algorithm.lower() not in computable:
            continue
        composite = "-" in value or checksum_type == "COMPOSITE" or (multipart and checksum_type != "FULL_OBJECT")
        if not composite:
            return ObjectCheck(algorithm.lower(), value)
    encrypted = meta.get("ServerSideEncryption") in _KMS_ENCRYPTION or bool(meta.get("SSECustomerAlgorithm"))
    if _MD5_ETAG.match(etag) and not encrypted:
        return ObjectCheck("md5", etag)
    return ObjectCheck("size")


def file_checksum(path: Path, method: str) -> str:
    """The checksum of a local file in the encoding S3 uses for `method` (base64; MD5 as hex)."""
    crt = _crt_checksums()
    if method in ("sha256", "sha1", "md5"):
        digest = hashlib.new(method, usedforsecurity=False)
        with open(path, "rb") as handle:
            while block := handle.read(_CHUNK):
                digest.update(block)
        return digest.hexdigest() if method == "md5" else base64.b64encode(digest.digest()).decode()
    if method == "crc32" or method in crt:
        update, width = (zlib.crc32, 4) if method == "crc32" else (crt[method], 8 if method == "crc64nvme" else 4)
        value = 0
        with open(path, "rb") as handle:
            while block := handle.read(_CHUNK):
                value = update(block, value)
        return base64.b64encode(value.to_bytes(width, "big")).decode()
    raise ValueError(f"cannot compute a {method} checksum here")


def verify_file(path: Path, check: ObjectCheck, size: int) -> str | None:
    """None when `path` has `size` bytes and passes `check`; else what is wrong."""
    got = path.stat().st_size if path.is_file() else None
    if got != size:
        return f"expected {size} bytes, got {got}"
    if check.is_checksum:
        actual = file_checksum(path, check.method)
        if actual != check.expected:
            return f"{check.method.upper()} does not match (object {check.expected}, file {actual})"
    return None


def describe_checks(checks: Mapping[str, int]) -> str:
    """`3 by CRC32, 1 by MD5, 2 by size only` for a staging summary."""
    parts = [f"{n} by {'size only' if method == 'size' else method.upper()}" for method, n in sorted(
        checks.items(), key=lambda item: (item[0] == "size", item[0])) if n]
    return ", ".join(parts) or "none"


def stage_prefix(
    hook: S3Hook,
    source_uri: str,
    dest_dir: str | Path,
    *,
    workers: int = DEFAULT_WORKERS,
    log: Log = print,
    progress_every: float = 2.0,
) -> TransferReport:
    """Copy every object under `source_uri` into `dest_dir`, in parallel, verified and idempotent.

    Keys are placed at their path relative to the prefix. Each object is verified by the
    strongest check it allows (`object_check`: an S3 checksum, else an MD5 ETag, else its
    size), read from the same response that brings its bytes (`ChecksumMode=ENABLED`);
    `report.checks` counts the checks and the summary line names them. A file already
    present that passes the check is not downloaded again. Each download goes to a
    `<file>.sat.part` temp file (removed on any failure) renamed into place after its
    check. Keys that would land on one path (`a//b`, `a/b`) are refused before any copy.
    """
    bucket, prefix = split_s3_uri(source_uri)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    objects = [m for m in hook.iter_file_metadata(prefix=prefix, bucket_name=bucket) if not m["Key"].endswith("/")]
    if not objects:
        raise SourceNotFoundError(f"no objects under {source_uri}")
    relative = [(meta["Key"], safe_relative_path(meta["Key"], prefix)) for meta in objects]  # refuse before copying
    check_distinct_paths(relative)
    plan = [(meta, dest / rel) for meta, (_, rel) in zip(objects, relative)]
    report = TransferReport(source=source_uri, destination=str(dest), files=len(plan))
    report.bytes_total = sum(int(meta["Size"]) for meta, _ in plan)
    log(f"staging {len(plan)} objects ({fmt_bytes(report.bytes_total)}) from {source_uri} to {dest}")
    client = hook.get_conn()

    def fetch(meta: dict[str, Any], target: Path) -> tuple[str, int, bool, str]:
        key, size = meta["Key"], int(meta["Size"])
        if target.is_file() and target.stat().st_size == size:
            check = object_check(client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
            if verify_file(target, check, size) is None:
                return key, size, False, check.method
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + PART_SUFFIX)
        try:
            if size < SMALL_OBJECT_BYTES:  # one GET; the transfer manager's set-up costs more than the file
                response = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
                check = object_check(response)
                with open(part, "wb") as handle:
                    shutil.copyfileobj(response["Body"], handle, 1 << 20)
            else:
                check = object_check(client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"))
                client.download_file(bucket, key, str(part), Config=hook.transfer_config)
            problem = verify_file(part, check, size)
            if problem:
                raise TransferVerificationError(f"s3://{bucket}/{key}: {problem}")
            os.replace(part, target)
        except BaseException:  # a failed or interrupted download leaves no temp file behind
            part.unlink(missing_ok=True)
            raise
        return key, size, True, check.method

    _run_parallel(plan, fetch, report, workers=workers, log=log, verb="staged", progress_every=progress_every)
    report.seconds = round(time.monotonic() - started, 3)
    log(
        f"staged {report.files} files: {report.transferred} copied ({fmt_bytes(report.bytes_transferred)}), "
        f"{report.skipped} already present, in {report.seconds}s; verified: {describe_checks(report.checks)}"
    )
    return report


def upload_dir(
    hook: S3Hook,
    src_dir: str | Path,
    dest_uri: str,
    *,
    workers: int = DEFAULT_WORKERS,
    log: Log = print,
    exclude: Iterable[str] = (),
    progress_every: float = 2.0,
) -> TransferReport:
    """Upload every file below `src_dir` to `dest_uri` (multipart for large files), in parallel."""
    bucket, prefix = split_s3_uri(dest_uri)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    src = Path(src_dir)
    excluded = tuple(exclude)
    files = sorted(
        p for p in src.rglob("*") if p.is_file() and not any(part in excluded for part in p.relative_to(src).parts)
    )
    report = TransferReport(source=str(src), destination=dest_uri, files=len(files))
    report.bytes_total = sum(p.stat().st_size for p in files)
    log(f"uploading {len(files)} files ({fmt_bytes(report.bytes_total)}) from {src} to {dest_uri}")
    started = time.monotonic()

    def put(path: Path, key: str) -> tuple[str, int, bool, str | None]:
        hook.load_file(filename=path, key=key, bucket_name=bucket, replace=True)
        return key, path.stat().st_size, True, None

    plan = [(path, prefix + path.relative_to(src).as_posix()) for path in files]
    _run_parallel(plan, put, report, workers=workers, log=log, verb="uploaded", progress_every=progress_every)
    report.seconds = round(time.monotonic() - started, 3)
    log(f"uploaded {report.files} files ({fmt_bytes(report.bytes_transferred)}) in {report.seconds}s")
    return report


def _run_parallel(plan, fn, report: TransferReport, *, workers: int, log: Log, verb: str, progress_every: float) -> None:
    last = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="sat-transfer") as pool:
        futures = [pool.submit(fn, a, b) for a, b in plan]
        try:
            for done, future in enumerate(as_completed(futures), start=1):
                key, size, transferred, method = future.result()
                report.keys.append(key)
                if transferred:
                    report.transferred += 1
                    report.bytes_transferred += size
                else:
                    report.skipped += 1
                if method is not None:
                    report.checks[method] = report.checks.get(method, 0) + 1
                if time.monotonic() - last >= progress_every:
                    last = time.monotonic()
                    log(f"{verb} {done}/{len(plan)} files ({fmt_bytes(report.bytes_transferred)})")
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def prefix_fingerprint(hook: S3Hook, uri: str) -> dict[str, Any]:
    """A digest of what lies under `uri` (keys, sizes, ETags): it changes when an object is added, replaced or removed."""
    bucket, prefix = split_s3_uri(uri)
    digest = hashlib.sha256()
    count = 0
    for meta in sorted(hook.iter_file_metadata(prefix=prefix, bucket_name=bucket), key=lambda m: m["Key"]):
        digest.update(f"{meta['Key']}\0{meta['Size']}\0{meta.get('ETag', '')}\n".encode())
        count += 1
    return {"digest": digest.hexdigest(), "objects": count}


def write_json(hook: S3Hook, uri: str, payload: Any) -> None:
    """Write one JSON document to `uri`."""
    bucket, key = split_s3_uri(uri)
    hook.load_string(json.dumps(payload, indent=2, default=str), key=key, bucket_name=bucket, replace=True)


def read_json(hook: S3Hook, uri: str, *, max_bytes: int | None = None) -> Any | None:
    """Read one JSON document from `uri` (one GET); None when it does not exist.

    Raises ObjectTooLargeError, naming the object and the bound, for a document over `max_bytes`
    (MAX_JSON_BYTES unless given; `read_bounded`).
    """
    data = read_bounded(hook, uri, max_bytes)
    return None if data is None else json.loads(data)


def read_bounded(hook: S3Hook, uri: str, max_bytes: int | None = None) -> bytes | None:
    """The bytes of the object at `uri` (one GET), None when it (or its bucket) does not exist.

    Raises ObjectTooLargeError for an object over `max_bytes`, by its Content-Length and by what
    its body holds: at most one 1 MiB chunk past the bound is read before the body is closed.
    `max_bytes`: MAX_JSON_BYTES unless given.
    """
    max_bytes = bounded.MAX_JSON_BYTES if max_bytes is None else max_bytes
    client = hook.get_conn()
    try:
        stream = open_object_stream(hook, uri)
    except client.exceptions.NoSuchBucket:
        return None  # as a missing key (what a HEAD's 404 said before)
    if stream is None:
        return None
    parts: list[bytes] = []
    total = 0
    try:
        if stream.size <= max_bytes:
            for chunk in stream.chunks:
                parts.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    break
    finally:
        stream.chunks.close()  # type: ignore[attr-defined]  # a generator: closes the object's body
    if stream.size > max_bytes or total > max_bytes:
        raise too_large(uri, max(stream.size, total), max_bytes)
    return b"".join(parts)


@dataclass(frozen=True)
class ObjectStream:
    """An object opened for reading: its size and its bytes in chunks of at most `STREAM_CHUNK_BYTES`.

    Iterate `chunks` once (it closes the object's body at its end, or when the iterator is closed).
    """

    size: int
    chunks: Iterator[bytes]


def open_object_stream(hook: S3Hook, uri: str, chunk_size: int = STREAM_CHUNK_BYTES) -> ObjectStream | None:
    """Open the object at `uri` for a streamed read (a download of any size in bounded memory); None when missing."""
    bucket, key = split_s3_uri(uri)
    client = hook.get_conn()
    try:
        answer = client.get_object(Bucket=bucket, Key=key)
    except client.exceptions.NoSuchKey:
        return None
    return ObjectStream(size=int(answer.get("ContentLength") or 0), chunks=_chunks(answer["Body"], chunk_size))


def _chunks(body: Any, chunk_size: int) -> Iterator[bytes]:
    try:
        while chunk := body.read(chunk_size):
            yield chunk
    finally:
        body.close()


def download_object(hook: S3Hook, uri: str, dest: str | Path) -> Path:
    """Download one object (the training script) to `dest`, atomically."""
    bucket, key = split_s3_uri(uri)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + PART_SUFFIX)
    try:
        hook.get_conn().download_file(bucket, key, str(part))
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return dest


