"""Checksums of checkpoint files, and verification against the manifest.

The manifest's schema, and the format versions its reader upgrades from, are in ``ckpt_engine.contract``.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import mmap
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from ckpt_engine.contract import MANIFEST_NAME, FileEntry, Manifest, parse_step
from ckpt_engine.errors import CorruptCheckpointError
from ckpt_engine.storage.base import Storage

_READ_BLOCK = 8 << 20


CHUNK_BYTES = 16 << 20
CHECKSUM_PREFIX = "xxh3_64/16MiB:"
LEGACY_CHECKSUM_PREFIX = "xxh3_64:"  # one xxh3-64 over the whole file (checkpoints written before chunking)
_HASH_THREADS = max(1, min(4, os.cpu_count() or 1))
_hash_pool: cf.ThreadPoolExecutor | None = None
_hash_pool_lock = threading.Lock()


class ChunkedHasher:
    """xxh3-64 of every 16 MiB chunk of a file, combined by one more xxh3-64 over the chunk digests.

    Streaming ``update`` calls and :func:`checksum_buffer` (chunks hashed on several
    threads at once) give the same value, so verification runs at the speed of all cores
    while writers hash as the bytes pass. xxhash releases the GIL on large inputs.
    """

    prefix = CHECKSUM_PREFIX

    def __init__(self) -> None:
        self._digests = bytearray()
        self._current = xxhash.xxh3_64()
        self._fill = 0

    def update(self, data: bytes | memoryview) -> None:
        """Add the next bytes of the file."""
        view = memoryview(data).cast("B")
        while view:
            take = min(len(view), CHUNK_BYTES - self._fill)
            self._current.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == CHUNK_BYTES:
                self._digests += self._current.digest()
                self._current, self._fill = xxhash.xxh3_64(), 0

    def hexdigest(self) -> str:
        """The combined digest of everything added so far."""
        tail = self._current.digest() if self._fill or not self._digests else b""
        return xxhash.xxh3_64(bytes(self._digests) + tail).hexdigest()


class _WholeFileHasher:
    """The legacy checksum: one xxh3-64 over the whole file."""

    prefix = LEGACY_CHECKSUM_PREFIX

    def __init__(self) -> None:
        self._hasher = xxhash.xxh3_64()

    def update(self, data: bytes | memoryview) -> None:
        self._hasher.update(data)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def new_hasher(checksum: str | None = None) -> Any:
    """A streaming hasher: the current algorithm, or the one ``checksum`` (a manifest value) was made with."""
    if checksum is not None and checksum.startswith(LEGACY_CHECKSUM_PREFIX):
        return _WholeFileHasher()
    return ChunkedHasher()


def format_checksum(hasher: Any) -> str:
    """Checksum text as stored in the manifest (algorithm prefix, then hex digest)."""
    return f"{hasher.prefix}{hasher.hexdigest()}"


def hash_pool() -> cf.ThreadPoolExecutor:
    """The process-wide threads that hash chunks (created on first use)."""
    global _hash_pool
    with _hash_pool_lock:
        if _hash_pool is None:
            _hash_pool = cf.ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="ckpt-hash")
        return _hash_pool


_MADV_POPULATE_READ = 22  # Linux >= 5.14: map a file's cached pages in one call, without copy-on-write
_PAGE = mmap.PAGESIZE
_libc_madvise: Any = None


def _prefault(chunk: memoryview) -> None:
    """Map a memory-mapped chunk's pages in one system call instead of one fault per page (best effort)."""
    global _libc_madvise
    if not sys.platform.startswith("linux") or len(chunk) < _PAGE:
        return
    if _libc_madvise is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc_madvise = libc.madvise
    address = np.frombuffer(chunk, dtype=np.uint8).ctypes.data
    start = address - address % _PAGE
    _libc_madvise(start, len(chunk) + (address - start), _MADV_POPULATE_READ)  # EINVAL on old kernels: ignored


def checksum_buffer(data: bytes | memoryview | Any, like: str | None = None) -> str:
    """Checksum of bytes held in memory (or memory-mapped), its chunks hashed in parallel.

    ``like`` is a manifest checksum whose algorithm to use (legacy whole-file values are
    computed on one thread).
    """
    view = memoryview(data).cast("B")
    if like is not None and like.startswith(LEGACY_CHECKSUM_PREFIX):
        hasher = _WholeFileHasher()
        hasher.update(view)
        return format_checksum(hasher)
    offsets = range(0, max(len(view), 1), CHUNK_BYTES)

    def chunk_digest(offset: int) -> bytes:
        chunk = view[offset:offset + CHUNK_BYTES]
        _prefault(chunk)
        return xxhash.xxh3_64(chunk).digest()

    digests = hash_pool().map(chunk_digest, offsets)
    return f"{CHECKSUM_PREFIX}{xxhash.xxh3_64(b''.join(digests)).hexdigest()}"


@dataclass
class VerifyReport:
    """Result of checking one checkpoint directory against its manifest."""

    name: str
    step: int
    ok: bool
    problems: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    hashed: list[str] = field(default_factory=list)  # files whose checksums this check computed


def list_checkpoint_steps(storage: Storage, root: str = "") -> list[int]:
    """Steps of every ``checkpoint-<step>`` directory under ``root``, newest first."""
    steps = (parse_step(name) for name in storage.list_dir(root))
    return sorted((step for step in steps if step is not None), reverse=True)


def read_manifest(storage: Storage, directory: str) -> Manifest:
    """The manifest of ``directory``; a missing one means an incomplete checkpoint."""
    key = f"{directory}/{MANIFEST_NAME}" if directory else MANIFEST_NAME
    try:
        raw = storage.read_bytes(key)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{directory}: no manifest (incomplete checkpoint)") from None
    return Manifest.from_json(raw)


def hash_file(storage: Storage, key: str, like: str | None = None) -> tuple[int, str]:
    """Size and checksum of a stored file (in the algorithm of ``like``, a manifest checksum, if given).

    A local file is memory-mapped and its chunks hashed in parallel; other backends are
    read in blocks.
    """
    path = storage.local_path(key)
    if path is not None:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return 0, checksum_buffer(b"", like)
            with mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as mapped:
                return size, checksum_buffer(mapped, like)
    hasher, size = new_hasher(like), 0
    with storage.open_reader(key) as fh:
        while block := fh.read(_READ_BLOCK):
            hasher.update(block)
            size += len(block)
    return size, format_checksum(hasher)


def split_for_ranks(files: Mapping[str, FileEntry], world_size: int) -> list[list[str]]:
    """The files of a manifest dealt out to ``world_size`` ranks for hashing, about equal bytes each.

    Largest file first to the rank with the fewest bytes so far (ties: lowest rank, then
    name order), so every rank that reads the same manifest computes the same split.
    """
    shares: list[list[str]] = [[] for _ in range(max(world_size, 1))]
    loads = [0] * len(shares)
    for name, entry in sorted(files.items(), key=lambda item: (-item[1].size, item[0])):
        rank = min(range(len(shares)), key=lambda r: (loads[r], r))
        shares[rank].append(name)
        loads[rank] += entry.size
    return shares


def verify_checkpoint(storage: Storage, directory: str, *, deep: bool = True,
                      share: tuple[int, int] | None = None) -> VerifyReport:
    """Check presence, sizes and (``deep``) checksums of every file named in the manifest.

    ``share=(rank, world_size)`` hashes only that rank's part of the files
    (:func:`split_for_ranks`); the other ranks hash the rest and the caller combines the
    verdicts. Presence and sizes are still checked for every file (cheap).
    """
    step = parse_step(directory.rsplit("/", 1)[-1])
    report = VerifyReport(name=directory, step=-1 if step is None else step, ok=False)
    try:
        manifest = read_manifest(storage, directory)
    except CorruptCheckpointError as exc:
        report.problems.append(str(exc))
        return report
    except OSError as exc:
        report.problems.append(f"{MANIFEST_NAME}: could not be read ({exc})")
        return report
    report.manifest = manifest
    mine = set(split_for_ranks(manifest.files, share[1])[share[0]]) if share is not None else set(manifest.files)
    if step is not None and manifest.step != step:
        report.problems.append(f"manifest step {manifest.step} does not match directory {directory}")
    for name, entry in manifest.files.items():
        key = f"{directory}/{name}"
        try:
            if not storage.exists(key):
                report.problems.append(f"{name}: missing")
                continue
            size = storage.size(key)
            if size != entry.size:
                report.problems.append(f"{name}: size {size} != {entry.size} in manifest (truncated?)")
                continue
            if deep and name in mine:
                report.hashed.append(name)
                _, checksum = hash_file(storage, key, entry.checksum)
                if checksum != entry.checksum:
                    report.problems.append(f"{name}: checksum {checksum} != {entry.checksum} in manifest")
        except OSError as exc:  # EIO from a failing disk or mount: unusable, like a corrupt file
            report.problems.append(f"{name}: could not be read ({exc})")
    report.ok = not report.problems
    return report
