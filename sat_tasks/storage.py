"""Object Storage through the Amazon provider's S3Hook: parallel, verified, idempotent transfers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterable

from sat_tasks.spec import split_s3_uri

if TYPE_CHECKING:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

DEFAULT_CONN_ID = "sat_object_storage"
DEFAULT_WORKERS = 8
SMALL_OBJECT_BYTES = 8 << 20  # below boto3's multipart threshold
Log = Callable[[str], None]


class UnsafeKeyError(ValueError):
    """An object key would land outside the target directory."""


class TransferVerificationError(RuntimeError):
    """A transferred file does not match the size or checksum the store reported."""


class SourceNotFoundError(FileNotFoundError):
    """The Object Storage prefix holds no objects."""


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
    checksum_verified: int = 0
    keys: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form without the key list (which can be long)."""
        data = asdict(self)
        data.pop("keys")
        return data


def object_storage_hook(conn_id: str = DEFAULT_CONN_ID) -> S3Hook:
    """The S3Hook for SAT's Object Storage connection (endpoint URL in the connection extra)."""
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    return S3Hook(aws_conn_id=conn_id, transfer_config_args={"max_concurrency": 4})


def safe_relative_path(key: str, prefix: str) -> PurePosixPath:
    """The path of `key` below `prefix`, refusing keys that would escape the target directory."""
    rel = key[len(prefix):] if key.startswith(prefix) else key
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
    return path


def md5_of(path: Path, chunk: int = 8 << 20) -> str:
    """Hex MD5 of a file (S3's ETag for single-part uploads)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _etag(meta: dict[str, Any]) -> str:
    return str(meta.get("ETag", "")).strip('"')


def _is_single_part(etag: str) -> bool:
    return len(etag) == 32 and "-" not in etag


def _matches(path: Path, size: int, etag: str) -> bool:
    if not path.is_file() or path.stat().st_size != size:
        return False
    if _is_single_part(etag):
        return md5_of(path) == etag
    return True  # multipart ETag: size is the check we can make locally


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

    Keys are placed at their path relative to the prefix. Files already present with the
    same size (and MD5, when the ETag is one) are skipped. Each download goes to a
    `.part` file renamed into place after its size and checksum check.
    """
    bucket, prefix = split_s3_uri(source_uri)
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    objects = [m for m in hook.iter_file_metadata(prefix=prefix, bucket_name=bucket) if not m["Key"].endswith("/")]
    if not objects:
        raise SourceNotFoundError(f"no objects under {source_uri}")
    plan = [(meta, dest / safe_relative_path(meta["Key"], prefix)) for meta in objects]  # refuse before copying
    report = TransferReport(source=source_uri, destination=str(dest), files=len(plan))
    report.bytes_total = sum(int(meta["Size"]) for meta, _ in plan)
    log(f"staging {len(plan)} objects ({_fmt_bytes(report.bytes_total)}) from {source_uri} to {dest}")
    client = hook.get_conn()

    def fetch(meta: dict[str, Any], target: Path) -> tuple[str, int, bool, bool]:
        size, etag = int(meta["Size"]), _etag(meta)
        if _matches(target, size, etag):
            return meta["Key"], size, False, _is_single_part(etag)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        if size < SMALL_OBJECT_BYTES:  # one GET; the transfer manager's set-up costs more than the file
            body = client.get_object(Bucket=bucket, Key=meta["Key"])["Body"]
            with open(part, "wb") as handle:
                shutil.copyfileobj(body, handle, 1 << 20)
        else:
            client.download_file(bucket, meta["Key"], str(part), Config=hook.transfer_config)
        got = part.stat().st_size
        if got != size:
            part.unlink(missing_ok=True)
            raise TransferVerificationError(f"s3://{bucket}/{meta['Key']}: expected {size} bytes, got {got}")
        if _is_single_part(etag) and md5_of(part) != etag:
            part.unlink(missing_ok=True)
            raise TransferVerificationError(f"s3://{bucket}/{meta['Key']}: MD5 does not match the ETag")
        os.replace(part, target)
        return meta["Key"], size, True, _is_single_part(etag)

    _run_parallel(plan, fetch, report, workers=workers, log=log, verb="staged", progress_every=progress_every)
    report.seconds = round(time.monotonic() - started, 3)
    log(
        f"staged {report.files} files: {report.transferred} copied ({_fmt_bytes(report.bytes_transferred)}), "
        f"{report.skipped} already present, {report.checksum_verified} checksums verified, in {report.seconds}s"
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
    log(f"uploading {len(files)} files ({_fmt_bytes(report.bytes_total)}) from {src} to {dest_uri}")
    started = time.monotonic()

    def put(path: Path, key: str) -> tuple[str, int, bool, bool]:
        hook.load_file(filename=path, key=key, bucket_name=bucket, replace=True)
        return key, path.stat().st_size, True, False

    plan = [(path, prefix + path.relative_to(src).as_posix()) for path in files]
    _run_parallel(plan, put, report, workers=workers, log=log, verb="uploaded", progress_every=progress_every)
    report.seconds = round(time.monotonic() - started, 3)
    log(f"uploaded {report.files} files ({_fmt_bytes(report.bytes_transferred)}) in {report.seconds}s")
    return report


def _run_parallel(plan, fn, report: TransferReport, *, workers: int, log: Log, verb: str, progress_every: float) -> None:
    last = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="sat-transfer") as pool:
        futures = [pool.submit(fn, a, b) for a, b in plan]
        try:
            for done, future in enumerate(as_completed(futures), start=1):
                key, size, transferred, verified = future.result()
                report.keys.append(key)
                if transferred:
                    report.transferred += 1
                    report.bytes_transferred += size
                else:
                    report.skipped += 1
                report.checksum_verified += int(verified)
                if time.monotonic() - last >= progress_every:
                    last = time.monotonic()
                    log(f"{verb} {done}/{len(plan)} files ({_fmt_bytes(report.bytes_transferred)})")
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def write_json(hook: S3Hook, uri: str, payload: Any) -> None:
    """Write one JSON document to `uri`."""
    bucket, key = split_s3_uri(uri)
    hook.load_string(json.dumps(payload, indent=2, default=str), key=key, bucket_name=bucket, replace=True)


def read_json(hook: S3Hook, uri: str) -> Any | None:
    """Read one JSON document from `uri`; None when it does not exist."""
    bucket, key = split_s3_uri(uri)
    if not hook.check_for_key(key, bucket_name=bucket):
        return None
    return json.loads(hook.read_key(key, bucket_name=bucket))


def download_object(hook: S3Hook, uri: str, dest: str | Path) -> Path:
    """Download one object (the training script) to `dest`, atomically."""
    bucket, key = split_s3_uri(uri)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    hook.get_conn().download_file(bucket, key, str(part))
    os.replace(part, dest)
    return dest


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
