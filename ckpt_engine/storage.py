"""Storage backends, chosen by URL scheme: ``file://`` and an in-memory test double.

Call order the engine follows for one checkpoint (every backend must make it safe):

1. ``open_writer(tmp/<file>)`` -> ``write()``... -> ``close()`` (data is durable after close);
2. ``write_atomic(tmp/manifest.json)`` last;
3. ``promote(tmp, final)``: one atomic rename makes the checkpoint visible;
4. ``delete_tree(old)`` for retention.

A reader treats a directory without a manifest as incomplete, never as data. New
backends (an ``s3://`` mirror, say) register a factory with :func:`register_scheme`;
their SDKs are imported inside the factory, never at import time of this module.
"""

from __future__ import annotations

import ctypes
import errno as errno_codes
import io
import mmap
import os
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import urlparse

from ckpt_engine.errors import StorageError, UnsupportedSchemeError


class StorageWriter(ABC):
    """A file being written; ``close()`` makes the bytes durable (fsync)."""

    @abstractmethod
    def write(self, data: bytes | memoryview) -> None:
        """Append all of ``data``."""

    @abstractmethod
    def close(self) -> None:
        """Flush, fsync and close."""

    @abstractmethod
    def abort(self) -> None:
        """Close without any durability promise (the caller discards the file)."""


class Storage(ABC):
    """A flat namespace of ``/``-separated keys under one root URL."""

    url: str

    @abstractmethod
    def open_writer(self, key: str) -> StorageWriter:
        """Create (or truncate) ``key`` for writing."""

    @abstractmethod
    def open_reader(self, key: str) -> BinaryIO:
        """Open ``key`` for binary reading."""

    @abstractmethod
    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Replace ``key`` with ``data`` atomically (temp, rename); ``durable`` also fsyncs file and directory.

        Readers never see a partial file either way; ``durable=False`` (progress.json) only
        gives up surviving a power loss, and saves two fsyncs.
        """

    @abstractmethod
    def list_dir(self, prefix: str) -> list[str]:
        """Names of the direct children of ``prefix`` (empty if it does not exist)."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` names a file or a directory."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Size of file ``key`` in bytes."""

    @abstractmethod
    def promote(self, src: str, dst: str, *, durable: bool = True) -> None:
        """Atomically rename directory ``src`` to ``dst`` (``dst`` must not exist); ``durable`` fsyncs both sides.

        ``durable=False`` is for renames a crash may undo harmlessly (moving a checkpoint
        aside to delete it: readers verify what they find).
        """

    @abstractmethod
    def delete_tree(self, prefix: str) -> None:
        """Remove ``prefix`` and everything under it; missing is not an error."""

    def read_bytes(self, key: str) -> bytes:
        """Whole content of ``key``."""
        with self.open_reader(key) as fh:
            return fh.read()

    def local_path(self, key: str) -> str | None:
        """A local filesystem path for ``key`` when the backend has one, else None."""
        return None


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _LocalWriter(StorageWriter):
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, data: bytes | memoryview) -> None:
        _write_all(self._fd, data)

    def close(self) -> None:
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)

    def abort(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


_DIRECT_BLOCK = 4096
_DIRECT_BUFFER = 8 << 20


class _DirectWriter(StorageWriter):
    """O_DIRECT writer through a page-aligned bounce buffer: no page-cache copy, little CPU.

    The last partial block is padded, written, and the file truncated to its true size.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        self._buffer = mmap.mmap(-1, _DIRECT_BUFFER)
        self._view = memoryview(self._buffer)
        self._fill = 0
        self._size = 0

    def _flush(self, nbytes: int) -> None:
        view = self._view[:nbytes]
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def write(self, data: bytes | memoryview) -> None:
        source = memoryview(data).cast("B")
        self._size += len(source)
        while source:
            if self._fill % _DIRECT_BLOCK == 0 and len(source) >= _DIRECT_BLOCK \
                    and _address(source) % _DIRECT_BLOCK == 0:
                if self._fill:  # block-aligned tail of the bounce buffer first, keeping file order
                    self._flush(self._fill)
                    self._fill = 0
                direct = len(source) - len(source) % _DIRECT_BLOCK  # staged bytes go straight to disk
                view = source[:direct]
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                source = source[direct:]
                continue
            count = min(len(source), _DIRECT_BUFFER - self._fill)
            self._view[self._fill:self._fill + count] = source[:count]
            self._fill += count
            source = source[count:]
            if self._fill == _DIRECT_BUFFER:
                self._flush(_DIRECT_BUFFER)
                self._fill = 0

    def close(self) -> None:
        try:
            if self._fill:
                padded = -(-self._fill // _DIRECT_BLOCK) * _DIRECT_BLOCK
                self._view[self._fill:padded] = bytes(padded - self._fill)
                self._flush(padded)
                os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        finally:
            self._release()

    def abort(self) -> None:
        self._release()

    def _release(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._view.release()
        self._buffer.close()


def _address(view: memoryview) -> int:
    """Memory address of a buffer's first byte."""
    if view.readonly:
        return -1  # bytes objects: never aligned on purpose, always bounced
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _open_local_writer(path: str, direct: bool) -> StorageWriter:
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return _DirectWriter(path)
        except OSError as exc:  # tmpfs and some network filesystems refuse O_DIRECT
            if exc.errno not in (errno_codes.EINVAL, errno_codes.EOPNOTSUPP):
                raise
    return _LocalWriter(path)


def fsync_dir(path: str) -> None:
    """fsync a directory, making the names created or renamed in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStorage(Storage):
    """Local or mounted filesystem; durability through fsync of files and directories.

    ``direct_io`` writes data files with O_DIRECT (no page-cache copy: far less CPU
    taken from training), falling back to buffered writes where it is refused.
    """

    def __init__(self, root: str | os.PathLike[str], *, direct_io: bool = True) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.url = "file://" + self.root
        self.direct_io = direct_io

    def _path(self, key: str) -> str:
        path = os.path.normpath(os.path.join(self.root, key))
        if os.path.commonpath([path, self.root]) != self.root:
            raise StorageError(f"key {key!r} escapes the storage root")
        return path

    def open_writer(self, key: str) -> StorageWriter:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return _open_local_writer(path, self.direct_io)

    def open_reader(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        path = self._path(key)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        writer = _LocalWriter(tmp)
        try:
            writer.write(data)
            writer.close() if durable else writer.abort()  # abort: close without fsync
        except BaseException:
            writer.abort()
            _remove_quietly(tmp)
            raise
        os.replace(tmp, path)
        if durable:
            fsync_dir(parent)

    def list_dir(self, prefix: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(prefix)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def size(self, key: str) -> int:
        return os.path.getsize(self._path(key))

    def promote(self, src: str, dst: str, *, durable: bool = True) -> None:
        src_path, dst_path = self._path(src), self._path(dst)
        if durable:
            fsync_dir(src_path)
        os.rename(src_path, dst_path)
        if durable:
            fsync_dir(os.path.dirname(dst_path))

    def delete_tree(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def local_path(self, key: str) -> str | None:
        return self._path(key)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class _MemoryWriter(StorageWriter):
    def __init__(self, store: MemoryStorage, key: str) -> None:
        self._store, self._key, self._buf = store, key, io.BytesIO()

    def write(self, data: bytes | memoryview) -> None:
        self._buf.write(data)

    def close(self) -> None:
        with self._store._lock:
            self._store._files[self._key] = self._buf.getvalue()

    def abort(self) -> None:
        self._buf = io.BytesIO()


class MemoryStorage(Storage):
    """In-memory storage for tests (as httpx ships ``MockTransport``); thread-safe."""

    _named: dict[str, MemoryStorage] = {}

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._files: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> MemoryStorage:
        """The process-wide instance called ``name`` (created on first use)."""
        return cls._named.setdefault(name, cls(name))

    @staticmethod
    def _norm(key: str) -> str:
        return "/".join(part for part in key.split("/") if part and part != ".")

    def open_writer(self, key: str) -> StorageWriter:
        return _MemoryWriter(self, self._norm(key))

    def open_reader(self, key: str) -> BinaryIO:
        with self._lock:
            try:
                return io.BytesIO(self._files[self._norm(key)])
            except KeyError:
                raise FileNotFoundError(errno_codes.ENOENT, "no such key", key) from None

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        with self._lock:
            self._files[self._norm(key)] = bytes(data)

    def list_dir(self, prefix: str) -> list[str]:
        base = self._norm(prefix)
        base = base + "/" if base else ""
        with self._lock:
            names = {k[len(base):].split("/", 1)[0] for k in self._files if k.startswith(base)}
        return sorted(names)

    def exists(self, key: str) -> bool:
        key = self._norm(key)
        with self._lock:
            return key in self._files or any(k.startswith(key + "/") for k in self._files)

    def size(self, key: str) -> int:
        with self._lock:
            return len(self._files[self._norm(key)])

    def promote(self, src: str, dst: str, *, durable: bool = True) -> None:
        src, dst = self._norm(src) + "/", self._norm(dst) + "/"
        with self._lock:
            if any(k.startswith(dst) for k in self._files):
                raise FileExistsError(errno_codes.EEXIST, "destination exists", dst)
            for key in [k for k in self._files if k.startswith(src)]:
                self._files[dst + key[len(src):]] = self._files.pop(key)

    def delete_tree(self, prefix: str) -> None:
        prefix = self._norm(prefix)
        with self._lock:
            for key in [k for k in self._files if k == prefix or k.startswith(prefix + "/")]:
                del self._files[key]

    def corrupt(self, key: str, data: bytes) -> None:
        """Replace a file's bytes behind the engine's back (for corruption tests)."""
        with self._lock:
            self._files[self._norm(key)] = data


class _FaultyWriter(StorageWriter):
    def __init__(self, owner: FaultyStorage, inner: StorageWriter) -> None:
        self._owner, self._inner = owner, inner

    def write(self, data: bytes | memoryview) -> None:
        self._owner._account(len(memoryview(data).cast("B")))
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()


class FaultyStorage(Storage):
    """Wraps a backend and fails writes with ``OSError(errno)`` once armed (ENOSPC, EIO tests)."""

    def __init__(self, inner: Storage, *, error: int = errno_codes.ENOSPC, after_bytes: int = 0) -> None:
        self.inner, self.error, self.after_bytes = inner, error, after_bytes
        self.url = inner.url
        self.armed = False
        self.failures = 0
        self._written = 0
        self._lock = threading.Lock()

    def arm(self, *, error: int | None = None, after_bytes: int | None = None) -> None:
        """Fail every write once ``after_bytes`` more bytes were written."""
        with self._lock:
            self.error = self.error if error is None else error
            self.after_bytes = self.after_bytes if after_bytes is None else after_bytes
            self._written, self.armed = 0, True

    def disarm(self) -> None:
        """Let writes succeed again."""
        with self._lock:
            self.armed = False

    def _account(self, nbytes: int) -> None:
        with self._lock:
            if not self.armed:
                return
            self._written += nbytes
            if self._written > self.after_bytes:
                self.failures += 1
                raise OSError(self.error, os.strerror(self.error))

    def open_writer(self, key: str) -> StorageWriter:
        return _FaultyWriter(self, self.inner.open_writer(key))

    def open_reader(self, key: str) -> BinaryIO:
        return self.inner.open_reader(key)

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        if not key.endswith("progress.json"):
            self._account(len(data))
        self.inner.write_atomic(key, data, durable=durable)

    def list_dir(self, prefix: str) -> list[str]:
        return self.inner.list_dir(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def promote(self, src: str, dst: str, *, durable: bool = True) -> None:
        self.inner.promote(src, dst, durable=durable)

    def delete_tree(self, prefix: str) -> None:
        self.inner.delete_tree(prefix)

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)


StorageFactory = Callable[[str], Storage]
_SCHEMES: dict[str, StorageFactory] = {}


def register_scheme(scheme: str, factory: StorageFactory) -> None:
    """Make ``open_storage`` build ``factory(url)`` for URLs starting with ``scheme://``."""
    _SCHEMES[scheme] = factory


def open_storage(url: str | os.PathLike[str] | Storage) -> Storage:
    """The backend for ``url``; a bare path means ``file://``."""
    if isinstance(url, Storage):
        return url
    text = os.fspath(url)
    scheme = urlparse(text).scheme if "://" in text else "file"
    try:
        factory = _SCHEMES[scheme]
    except KeyError:
        raise UnsupportedSchemeError(
            f"no storage backend for {scheme}:// (known: {sorted(_SCHEMES)}); register one with register_scheme()"
        ) from None
    return factory(text)


def _file_factory(url: str) -> Storage:
    return FileStorage(url[len("file://"):] if url.startswith("file://") else url)


register_scheme("file", _file_factory)
register_scheme("memory", lambda url: MemoryStorage.named(url[len("memory://"):]))


def _s3_factory(url: str) -> Storage:
    from ckpt_engine.s3 import S3Storage  # boto3 itself is imported when the first request is made

    return S3Storage(url)


register_scheme("s3", _s3_factory)
