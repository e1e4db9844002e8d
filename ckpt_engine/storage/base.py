"""The Storage interface and the URL-scheme registry (the package registers ``file://``, ``s3://`` and ``memory://``).

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

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import urlparse

from ckpt_engine.errors import UnsupportedSchemeError


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
