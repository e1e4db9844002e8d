"""Mirror committed checkpoints to Object Storage in the background; restore the newest complete one on a fresh node.

The mirror keeps the local layout under its URL: ``<url>checkpoint-<step>/<file>`` plus
``manifest.json``, uploaded last. As locally, a mirrored checkpoint without its manifest
is incomplete and never restored. Any :class:`~ckpt_engine.storage.Storage` works as the
mirror (``s3://`` in production, ``memory://`` or ``file://`` in tests).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from ckpt_engine.contract import (
    MANIFEST_NAME,
    PROGRESS_NAME,
    TMP_PREFIX,
    TRASH_PREFIX,
    FileEntry,
    Manifest,
    checkpoint_dir,
)
from ckpt_engine.errors import CorruptCheckpointError
from ckpt_engine.manifest import (
    format_checksum,
    list_checkpoint_steps,
    new_hasher,
    verify_checkpoint,
)
from ckpt_engine.storage.base import Storage, open_storage

log = logging.getLogger("ckpt_engine")

DEFAULT_WAIT_S = 600.0
_CHUNK = 8 << 20


@dataclass
class MirrorRecord:
    """One checkpoint copied to the mirror."""

    step: int
    files: int
    total_bytes: int
    seconds: float


class _HashingReader:
    """``read()`` of a stream, hashing what passes; deliberately not seekable (transfers read it once, in order)."""

    def __init__(self, stream: BinaryIO, checksum: str) -> None:
        self.stream, self.hasher, self.size = stream, new_hasher(checksum), 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.hasher.update(data)
        self.size += len(data)
        return data


class _HashingWriter:
    """``write()`` into a StorageWriter, hashing what passes; not seekable, so downloads arrive in order."""

    def __init__(self, writer: Any, checksum: str) -> None:
        self.writer, self.hasher, self.size = writer, new_hasher(checksum), 0

    def write(self, data: bytes | memoryview) -> int:
        self.hasher.update(data)
        self.writer.write(data)
        count = len(memoryview(data).cast("B"))
        self.size += count
        return count


def copy_verified(src: Storage, src_key: str, dst: Storage, dst_key: str, entry: FileEntry) -> None:
    """Copy one checkpoint file, checking its size and checksum against ``entry`` on the way.

    Raises CorruptCheckpointError on a mismatch (the caller discards what ``dst`` holds)
    and FileNotFoundError when the source file is missing.
    """
    upload = getattr(dst, "upload_stream", None)
    download = getattr(src, "download_stream", None)
    if upload is not None:
        with src.open_reader(src_key) as stream:
            reader = _HashingReader(stream, entry.checksum)
            upload(dst_key, reader)
        size, checksum = reader.size, format_checksum(reader.hasher)
    else:
        writer = dst.open_writer(dst_key)
        sink = _HashingWriter(writer, entry.checksum)
        try:
            if download is not None:
                download(src_key, sink)
            else:
                with src.open_reader(src_key) as stream:
                    while chunk := stream.read(_CHUNK):
                        sink.write(chunk)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        size, checksum = sink.size, format_checksum(sink.hasher)
    if size != entry.size or checksum != entry.checksum:
        raise CorruptCheckpointError(f"{src_key}: {size} bytes {checksum}, manifest says {entry.size} bytes "
                                     f"{entry.checksum}")


def _manifest_bytes(storage: Storage, directory: str) -> tuple[bytes, Manifest]:
    try:
        raw = storage.read_bytes(f"{directory}/{MANIFEST_NAME}")
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{directory}: no manifest (incomplete checkpoint)") from None
    manifest = Manifest.from_json(raw)
    if checkpoint_dir(manifest.step) != directory:
        raise CorruptCheckpointError(f"{directory}: manifest is for step {manifest.step}")
    return raw, manifest


class CheckpointMirror:
    """Copies each committed checkpoint to ``url`` in one background thread, and the engine's progress.

    Call order: ``submit(step)`` after every local commit (never blocks; a submission
    replaces one still queued, so the newest checkpoint goes next) and
    ``publish_progress(raw)`` when progress.json changes (the newest snapshot replaces a
    queued one; it goes up after any queued checkpoint, as ``<url>progress.json``) ->
    ``wait(timeout)`` before exit -> ``close()``. One upload runs at a time: every file named in the local
    manifest, each verified against it while read, then the manifest; then retention
    keeps the ``keep_last`` newest complete mirrored checkpoints (0 keeps all) plus the
    one just mirrored, and deletes incomplete leftovers. ``on_mirrored(step)`` runs after
    each success. A failed upload is logged and leaves no manifest; training never sees it.
    """

    def __init__(self, local: Storage, url: str | Storage, *, keep_last: int = 3,
                 on_mirrored: Callable[[int], None] | None = None) -> None:
        self.local = local
        self.remote = open_storage(url)
        self.keep_last = keep_last
        self.on_mirrored = on_mirrored
        self.last_mirrored_step: int | None = None
        self.last_error: BaseException | None = None
        self.records: list[MirrorRecord] = []
        self._cond = threading.Condition()
        self._pending: int | None = None
        self._progress: bytes | None = None
        self._busy: int | str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where checkpoints are mirrored."""
        return self.remote.url

    def submit(self, step: int) -> None:
        """Queue ``checkpoint-<step>`` for upload (replacing a queued older one); returns at once."""
        with self._cond:
            if self._closed:
                log.warning("[Concurrent Checkpoint] mirror closed; checkpoint-%d is not mirrored", step)
                return
            if self._pending is not None:
                log.info("[Concurrent Checkpoint] mirror: checkpoint-%d superseded by checkpoint-%d before its "
                         "upload started", self._pending, step)
            self._pending = step
            self._start()

    def publish_progress(self, raw: bytes) -> None:
        """Queue a progress.json snapshot for ``<url>progress.json`` (replacing a queued one); returns at once."""
        with self._cond:
            if self._closed:
                return
            self._progress = bytes(raw)
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ckpt-mirror", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _upload_progress(self, raw: bytes) -> None:
        try:
            self.remote.write_atomic(PROGRESS_NAME, raw, durable=False)
        except Exception as exc:  # noqa: BLE001 - advisory, like the local file: logged, training goes on
            log.warning("[Concurrent Checkpoint] could not mirror %s to %s: %r", PROGRESS_NAME, self.url, exc)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and self._progress is None and not self._closed:
                    self._cond.wait()
                if self._pending is None and self._progress is not None:
                    raw, self._progress, self._busy = self._progress, None, PROGRESS_NAME
                    step = None
                elif self._pending is None:
                    return
                else:
                    step, self._pending, self._busy = self._pending, None, self._pending
            if step is None:
                try:
                    self._upload_progress(raw)
                finally:
                    with self._cond:
                        self._busy = None
                        self._cond.notify_all()
                continue
            try:
                self.mirror_checkpoint(step)
            except Exception as exc:  # noqa: BLE001 - logged; the mirror never stops training
                self.last_error = exc
                if not self.local.exists(f"{checkpoint_dir(step)}/{MANIFEST_NAME}"):
                    log.warning("[Concurrent Checkpoint] checkpoint-%d was replaced or removed locally before its "
                                "mirror upload finished; a newer one will be mirrored", step)
                else:
                    log.error("[Concurrent Checkpoint] mirroring checkpoint-%d to %s failed (the mirror keeps "
                              "checkpoint-%s): %r", step, self.url, self.last_mirrored_step, exc)
            finally:
                with self._cond:
                    self._busy = None
                    self._cond.notify_all()

    def mirror_checkpoint(self, step: int) -> MirrorRecord:
        """Upload local ``checkpoint-<step>`` now (in the calling thread): data files, then the manifest."""
        started = time.perf_counter()
        directory = checkpoint_dir(step)
        raw, manifest = _manifest_bytes(self.local, directory)
        self.remote.delete_tree(directory)  # an older copy of this step (manifest first): never mix two
        try:
            for name, entry in sorted(manifest.files.items()):
                copy_verified(self.local, f"{directory}/{name}", self.remote, f"{directory}/{name}", entry)
            self.remote.write_atomic(f"{directory}/{MANIFEST_NAME}", raw)
        except BaseException:
            try:
                self.remote.delete_tree(directory)
            except Exception as exc:  # noqa: BLE001 - best effort: without a manifest the leftover is never restored
                log.warning("[Concurrent Checkpoint] could not remove the partial mirror of %s: %r", directory, exc)
            raise
        record = MirrorRecord(step=step, files=len(manifest.files), seconds=time.perf_counter() - started,
                              total_bytes=sum(e.size for e in manifest.files.values()))
        self.records.append(record)
        self.last_mirrored_step = step
        log.info("[Concurrent Checkpoint] mirrored checkpoint-%d to %s (%.1f MB in %.2fs)", step, self.url,
                 record.total_bytes / 1e6, record.seconds)
        if self.on_mirrored is not None:
            self.on_mirrored(step)
        self.apply_retention(step)
        return record

    def apply_retention(self, newest: int) -> None:
        """Delete incomplete mirrored checkpoints and complete ones beyond the ``keep_last`` newest."""
        steps = list_checkpoint_steps(self.remote)
        complete = [s for s in steps if self.remote.exists(f"{checkpoint_dir(s)}/{MANIFEST_NAME}")]
        kept = set(complete[:self.keep_last] if self.keep_last else complete) | {newest}
        for step in steps:
            if step not in kept:
                self.remote.delete_tree(checkpoint_dir(step))

    def wait(self, timeout: float | None = DEFAULT_WAIT_S) -> bool:
        """Block until no upload is queued or running (at most ``timeout`` s; None waits forever)."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._progress is not None or self._busy is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("[Concurrent Checkpoint] mirror upload of checkpoint-%s did not finish within %.0fs; "
                                "the mirror's newest complete checkpoint is checkpoint-%s",
                                self._busy if self._busy is not None else self._pending, timeout,
                                self.last_mirrored_step)
                    return False
                self._cond.wait(None if remaining == math.inf else remaining)
        return True

    def close(self, timeout: float | None = DEFAULT_WAIT_S) -> None:
        """Wait (bounded) for the queued upload, then stop the thread."""
        self.wait(timeout)
        with self._cond:
            self._closed = True
            self._pending = None
            self._progress = None
            self._cond.notify_all()


def restore_from_mirror(local: Storage, url: str | Storage, step: int = -1) -> int | None:
    """Download the mirror's newest complete checkpoint (or ``step``) when ``local`` lacks it; returns its step.

    Nothing is downloaded when ``local`` already holds a complete checkpoint at least as
    new (for ``step >= 0``: ``checkpoint-<step>`` itself): the node-local copy the previous
    attempt committed, which a failover finds when its new node shares the old one's disk
    (the local backend's nodes are one host: every attempt of a run has the same checkpoint
    root). The log says which copy the resume uses. When that copy is the very step asked
    for (SAT's failover sets ``CKPT_LAST_STEP`` to the last committed step), the mirror is
    not even listed: nothing there could be wanted, and a storage client and a listing cost
    seconds of a recovery on a loaded host. Mirrored checkpoints newer than the local one
    are tried newest first (``step >= 0``: ``step``, then older ones); an incomplete or
    corrupt one is skipped for the one before. Files are verified against the mirrored
    manifest while downloaded, land in a temp directory and appear with one rename.
    Other storage errors (unreachable mirror, denied access) propagate: a resume must not
    silently start from scratch. Returns the step downloaded, None when nothing was.
    """
    bound = step if step >= 0 else math.inf
    local_best = _newest_local(local, bound)
    if local_best is not None and local_best >= bound:
        _note_local_copy(local_best, url)
        return None
    remote = open_storage(url)
    candidates = [s for s in list_checkpoint_steps(remote) if s <= bound and (local_best is None or s > local_best)]
    for candidate in candidates:
        try:
            restore_checkpoint(remote, local, candidate)
        except (CorruptCheckpointError, FileNotFoundError) as exc:
            log.warning("[Concurrent Checkpoint] skipping mirrored checkpoint-%d: %s", candidate, exc)
            continue
        log.info("[Concurrent Checkpoint] Restored checkpoint-%d from the mirror %s (Object Storage: downloaded, "
                 "verified against its manifest)", candidate, remote.url)
        return candidate
    if local_best is not None:
        _note_local_copy(local_best, remote.url)
    else:
        log.info("[Concurrent Checkpoint] no complete mirrored checkpoint (step %d) in %s", step, remote.url)
    return None


def _note_local_copy(step: int, url: str | Storage) -> None:
    # the checksums are verified where the resume chooses its checkpoint (every restore is), not twice
    log.info("[Concurrent Checkpoint] checkpoint-%d: the node-local copy is the newest wanted (its manifest and file "
             "sizes check out; its checksums are verified before it loads); nothing downloaded from %s", step,
             url.url if isinstance(url, Storage) else url)


def _newest_local(local: Storage, bound: float) -> int | None:
    """Newest local checkpoint <= ``bound`` with a manifest and the right sizes (checksums are checked on resume)."""
    for found in list_checkpoint_steps(local):
        if found <= bound and verify_checkpoint(local, checkpoint_dir(found), deep=False).ok:
            return found
    return None


def restore_checkpoint(remote: Storage, local: Storage, step: int) -> None:
    """Copy mirrored ``checkpoint-<step>`` into ``local`` atomically, verified; raises CorruptCheckpointError."""
    directory = checkpoint_dir(step)
    raw, manifest = _manifest_bytes(remote, directory)
    started = time.perf_counter()
    tmp = f"{TMP_PREFIX}{step}-restore-{uuid.uuid4().hex[:8]}"
    try:
        for name, entry in sorted(manifest.files.items()):
            copy_verified(remote, f"{directory}/{name}", local, f"{tmp}/{name}", entry)
        local.write_atomic(f"{tmp}/{MANIFEST_NAME}", raw)
        if verify_checkpoint(local, directory, deep=False).ok:
            log.info("[Concurrent Checkpoint] checkpoint-%d appeared locally meanwhile; keeping it", step)
            local.delete_tree(tmp)
            return
        if local.exists(directory):  # an incomplete or corrupt local copy: rename away first, delete after
            trash = f"{TRASH_PREFIX}{directory}-{uuid.uuid4().hex[:8]}"
            local.promote(directory, trash)
            local.promote(tmp, directory)
            local.delete_tree(trash)
        else:
            local.promote(tmp, directory)
    except BaseException:
        local.delete_tree(tmp)
        raise
    total = sum(e.size for e in manifest.files.values())
    log.info("[Concurrent Checkpoint] downloaded checkpoint-%d (%.1f MB) in %.2fs", step, total / 1e6,
             time.perf_counter() - started)
