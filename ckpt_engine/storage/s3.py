"""``s3://bucket/prefix/`` storage through boto3 (imported lazily), for mirroring checkpoints to Object Storage.

Connection settings come from the environment of the training process, never from
code: the endpoint from ``CKPT_S3_ENDPOINT_URL`` (else ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, else AWS itself), the region from ``AWS_REGION`` /
``AWS_DEFAULT_REGION`` (default ``us-east-1``), credentials from boto3's standard chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, a profile, an instance role).

Object Storage has no directories and no rename, so the call order of
:mod:`ckpt_engine.storage` holds with these meanings: a "directory" is a key prefix;
``write_atomic`` is one PUT (atomic per object); ``promote`` copies objects with the
manifest copied *last* (not atomic, but a reader sees no manifest until every file is
there); ``delete_tree`` deletes the manifest *first*, so a half-deleted checkpoint is
never taken for a complete one.
"""

from __future__ import annotations

import errno as errno_codes
import io
import os
import tempfile
import threading
from typing import Any, BinaryIO
from urllib.parse import urlparse

from ckpt_engine.contract import MANIFEST_NAME, S3_ENDPOINT_ENV
from ckpt_engine.errors import StorageError
from ckpt_engine.storage.base import Storage, StorageWriter

_ENDPOINT_FALLBACK_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
DEFAULT_REGION = "us-east-1"
PART_BYTES = 16 << 20
TRANSFER_CONCURRENCY = 4
_SPOOL_BYTES = 8 << 20
_DELETE_BATCH = 1000


def endpoint_from_env() -> str | None:
    """The S3 endpoint URL the environment names, or None for AWS's own endpoints."""
    for name in (S3_ENDPOINT_ENV, *_ENDPOINT_FALLBACK_ENVS):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> (``bucket``, ``a/b/``); the prefix is empty or ends with ``/``."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise StorageError(f"{url!r} is not an s3://bucket/prefix URL")
    prefix = parsed.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return parsed.netloc, prefix


def _is_missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound")


class _BodyReader(io.RawIOBase):
    """A GetObject body as a raw stream, so ``io.BufferedReader`` gives it ``readinto``."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._body.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            super().close()


class _S3Writer(StorageWriter):
    """Spools to memory (then a temp file) and uploads on ``close()``; an aborted writer uploads nothing."""

    def __init__(self, storage: S3Storage, key: str) -> None:
        self._storage, self._key = storage, key
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - closed by close()

    def write(self, data: bytes | memoryview) -> None:
        self._spool.write(data)

    def close(self) -> None:
        try:
            self._spool.seek(0)
            self._storage.upload_stream(self._key, self._spool)
        finally:
            self._spool.close()

    def abort(self) -> None:
        self._spool.close()


class S3Storage(Storage):
    """Objects under ``s3://bucket/prefix/``; keys are ``/``-separated paths below the prefix.

    Call order as for every backend (see :mod:`ckpt_engine.storage`); in addition
    ``upload_stream`` / ``download_stream`` move a whole file with multipart, concurrent
    transfers (what the mirror uses). ``client`` may be given (tests); otherwise one is
    built from the environment on first use. Thread-safe (boto3 clients are).
    """

    def __init__(self, url: str, *, client: Any = None) -> None:
        self.bucket, self.prefix = split_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self._client = client
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client (built lazily from the environment)."""
        with self._client_lock:
            if self._client is None:
                self._client = _new_client()
            return self._client

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                              max_concurrency=TRANSFER_CONCURRENCY)

    def _key(self, key: str) -> str:
        parts = [part for part in key.split("/") if part and part != "."]
        if ".." in parts:
            raise StorageError(f"key {key!r} escapes the storage root")
        return self.prefix + "/".join(parts)

    def _dir_key(self, key: str) -> str:
        """The object-key prefix of directory ``key`` (ends with ``/`` unless it is the bucket root)."""
        full = self._key(key)
        return full if not full or full.endswith("/") else full + "/"

    def _error(self, action: str, key: str, exc: Exception) -> OSError:
        if _is_missing(exc):
            return FileNotFoundError(errno_codes.ENOENT, f"no such object ({action})", f"{self.url}{key}")
        return StorageError(f"{action} {self.url}{key} failed: {exc}")

    # ---- whole-file transfers ----------------------------------------------------------------

    def upload_stream(self, key: str, fileobj: BinaryIO) -> None:
        """Upload everything ``fileobj.read()`` yields as object ``key`` (multipart when large)."""
        try:
            self.client.upload_fileobj(fileobj, self.bucket, self._key(key), Config=self._transfer_config())
        except Exception as exc:
            if isinstance(exc, OSError):
                raise
            raise self._error("upload", key, exc) from exc

    def download_stream(self, key: str, fileobj: Any) -> None:
        """Write object ``key`` into ``fileobj`` in order (ranged, concurrent GETs when large)."""
        try:
            self.client.download_fileobj(self.bucket, self._key(key), fileobj, Config=self._transfer_config())
        except Exception as exc:
            if isinstance(exc, OSError):
                raise
            raise self._error("download", key, exc) from exc

    # ---- Storage ------------------------------------------------------------------------------

    def open_writer(self, key: str) -> StorageWriter:
        return _S3Writer(self, key)

    def open_reader(self, key: str) -> BinaryIO:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error("read", key, exc) from exc
        return io.BufferedReader(_BodyReader(response["Body"]), buffer_size=1 << 20)  # type: ignore[return-value]

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))
        except Exception as exc:
            raise self._error("put", key, exc) from exc

    def list_dir(self, prefix: str) -> list[str]:
        base = self._dir_key(prefix)
        names: set[str] = set()
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
                names.update(p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", []))
                names.update(o["Key"][len(base):] for o in page.get("Contents", []))
        except Exception as exc:
            if _is_missing(exc) or "NoSuchBucket" in str(exc):
                return []
            raise self._error("list", prefix, exc) from exc
        return sorted(name for name in names if name)

    def _list_keys(self, prefix: str) -> list[str]:
        base = self._dir_key(prefix)
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                keys.extend(o["Key"] for o in page.get("Contents", []))
        except Exception as exc:
            raise self._error("list", prefix, exc) from exc
        return keys

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            if not _is_missing(exc):
                raise self._error("head", key, exc) from exc
        try:
            response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._dir_key(key), MaxKeys=1)
        except Exception as exc:
            raise self._error("list", key, exc) from exc
        return bool(response.get("KeyCount") or response.get("Contents"))

    def size(self, key: str) -> int:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as exc:
            raise self._error("head", key, exc) from exc

    def promote(self, src: str, dst: str, *, durable: bool = True) -> None:
        """Copy ``src/*`` to ``dst/*`` (the manifest last), then delete ``src``; not atomic."""
        if self.exists(dst):
            raise FileExistsError(errno_codes.EEXIST, "destination exists", f"{self.url}{dst}")
        source, target = self._dir_key(src), self._dir_key(dst)
        keys = sorted(self._list_keys(src), key=lambda k: k.endswith("/" + MANIFEST_NAME))
        try:
            for key in keys:
                self.client.copy({"Bucket": self.bucket, "Key": key}, self.bucket, target + key[len(source):],
                                 Config=self._transfer_config())
        except Exception as exc:
            raise self._error("copy", src, exc) from exc
        self.delete_tree(src)

    def delete_tree(self, prefix: str) -> None:
        """Delete ``prefix`` and everything below it, the manifest first."""
        keys = self._list_keys(prefix)
        manifests = [k for k in keys if k.endswith("/" + MANIFEST_NAME)]
        rest = [k for k in keys if k not in manifests]
        try:
            for key in manifests:
                self.client.delete_object(Bucket=self.bucket, Key=key)
            for start in range(0, len(rest), _DELETE_BATCH):
                batch = [{"Key": k} for k in rest[start:start + _DELETE_BATCH]]
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        except Exception as exc:
            if not _is_missing(exc):
                raise self._error("delete", prefix, exc) from exc


def _new_client() -> Any:
    import boto3
    from botocore.config import Config

    endpoint = endpoint_from_env()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    config = Config(retries={"max_attempts": 8, "mode": "adaptive"}, max_pool_connections=2 * TRANSFER_CONCURRENCY,
                    s3={"addressing_style": "path"} if endpoint else {})
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region, config=config)

