"""Test doubles shipped with the engine (as httpx ships MockTransport): ``memory://`` and a fault-injecting wrapper.

``MemoryStorage`` keeps files in a dict (named instances are shared per name, so a
``memory://name`` URL reaches the same files); ``FaultyStorage`` wraps any storage and
fails chosen operations (ENOSPC, EIO, a crash before a rename) to test what the engine
does then.
"""

from __future__ import annotations

import errno as errno_codes
import io
import os
import threading
from typing import BinaryIO, ClassVar

from ckpt_engine.contract import PROGRESS_NAME
from ckpt_engine.storage.base import Storage, StorageWriter


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

    _named: ClassVar[dict[str, MemoryStorage]] = {}

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
        if not key.endswith(PROGRESS_NAME):
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
