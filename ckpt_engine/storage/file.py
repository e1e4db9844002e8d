"""``file://``: a local (or mounted) filesystem, with O_DIRECT writes where the filesystem allows them."""

from __future__ import annotations

import ctypes
import errno as errno_codes
import mmap
import os
import shutil
import threading
from typing import BinaryIO

from ckpt_engine.errors import StorageError
from ckpt_engine.storage.base import Storage, StorageWriter


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
