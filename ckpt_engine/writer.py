"""Persist and commit through the storage interface: staged segments -> files, the manifest last, then the promote."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from ckpt_engine.contract import (
    MANIFEST_NAME,
    TRASH_PREFIX,
    FileEntry,
    Manifest,
    checkpoint_dir,
)
from ckpt_engine.errors import PersistError
from ckpt_engine.formats import FilePlan
from ckpt_engine.manifest import (
    format_checksum,
    list_checkpoint_steps,
    new_hasher,
)
from ckpt_engine.metrics.recorder import yield_cpu
from ckpt_engine.planner import (
    UNIVERSAL_DIR,
    SavePlan,
    retention,
    universal_views_to_delete,
)
from ckpt_engine.pool import HostBufferPool, Slab
from ckpt_engine.stager import Abort, Segment, SegmentQueue
from ckpt_engine.storage.base import Storage, StorageWriter

if TYPE_CHECKING:
    from ckpt_engine.multirank import RankCoordinator

log = logging.getLogger("ckpt_engine")

BACKGROUND_PRIORITIES = ("idle", "nice", "normal")
"""``background_priority`` of the engine's writer, commit and retention threads (see :func:`background_thread`)."""


def check_background_priority(priority: str) -> None:
    """Raise ValueError naming the option unless ``priority`` is one of BACKGROUND_PRIORITIES."""
    if priority not in BACKGROUND_PRIORITIES:
        raise ValueError(f"background_priority must be one of {BACKGROUND_PRIORITIES}, got {priority!r}")


def background_thread(priority: str) -> Callable[[], None]:
    """A thread-pool initializer that lowers its thread's CPU priority below the training threads'.

    ``idle``: SCHED_IDLE (Linux; the thread runs on a CPU no normal thread wants and never
    preempts one on wake-up), ``nice``: nice 19 on the thread alone (Linux gives every
    thread its own nice value), ``normal``: unchanged. Lowering needs no privilege; where
    it is refused the thread keeps running as it was (see ADR 0030).
    """
    check_background_priority(priority)

    def lower() -> None:
        if priority != "normal":
            got = yield_cpu(0, idle=priority == "idle")
            log.debug("[Concurrent Checkpoint] background thread priority: %s", got)

    return lower


PIECE_BYTES = 1 << 20
"""Staged bytes reach the file's renderer in pieces this large at most: what the renderer reads (a zip
record's CRC) is still in the CPU cache when the checksum reads it right after, so the bytes come from
memory once instead of twice; the disk still gets one write per run of pieces (:class:`_HashingSink`)."""


class _HashingSink:
    """Hashes a file's bytes as they come (on this thread) and writes staged pieces in runs, straight from the slab.

    ``stage(slab, offset, piece)`` announces the staged piece the renderer will write next;
    when it does, the piece joins the pending run if it follows it in the same slab.
    Anything else written flushes the run first, so the file's order is kept. The slab
    memory goes to the storage writer as it is (O_DIRECT where the storage allows it): no
    copy through Python bytes. The caller flushes before releasing a slab's segment.
    """

    def __init__(self, writer: StorageWriter) -> None:
        self.writer, self.hasher, self.size = writer, new_hasher(), 0
        self._next: tuple[Slab, int, memoryview] | None = None  # the announced piece
        self._run: tuple[Slab, int, int] | None = None  # (slab, start, end) written at the next flush

    def stage(self, slab: Slab, offset: int, piece: memoryview) -> None:
        """The renderer's next write is expected to be ``piece``, at ``offset`` in ``slab``."""
        self._next = (slab, offset, piece)

    def write(self, data: bytes | memoryview) -> None:
        announced, self._next = self._next, None
        view = memoryview(data).cast("B")
        self.hasher.update(view)
        self.size += len(view)
        if announced is not None and announced[2] is data:
            slab, offset, _ = announced
            if self._run is not None and self._run[0] is slab and self._run[2] == offset:
                self._run = (slab, self._run[1], offset + len(view))
                return
            self.flush()
            self._run = (slab, offset, offset + len(view))
            return
        self.flush()
        self.writer.write(view)

    def flush(self) -> None:
        """Write the pending run of staged pieces."""
        if self._run is not None:
            (slab, start, end), self._run = self._run, None
            self.writer.write(memoryview(slab.array[start:end]))

    def discard(self) -> None:
        """After a failure: forget the pending run (its file is deleted)."""
        self._run = self._next = None


class _Unopened(StorageWriter):
    """The storage writer before the file is open: nothing is written through it (a drain only discards)."""

    def write(self, data: bytes | memoryview) -> None:
        raise PersistError("the file is not open")

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _FileSegments:
    """One file's staged bytes as its renderer pulls them, piece by piece; each slab's segment is released once written."""

    def __init__(self, pool: HostBufferPool, plan: FilePlan, segments_queue: SegmentQueue) -> None:
        self.pool, self.plan, self.queue = pool, plan, segments_queue
        self.sink = _HashingSink(_Unopened())  # the file's, once opened
        self.consumed = 0  # bytes of segments written (or dropped) and released
        self.current: Segment | None = None  # a packed segment may hold several blobs: handed out piece by piece
        self.used = 0  # bytes of ``current`` already handed out
        self.aborted = False  # the stager's Abort was received: nothing more will come

    def __call__(self, index: int) -> Iterator[memoryview]:
        remaining = self.plan.blobs[index].nbytes
        while remaining > 0:
            if self.current is None:
                self.take_next()
            current = self.current
            assert current is not None
            take = min(remaining, current.nbytes - self.used, PIECE_BYTES)
            start = current.offset + self.used
            piece = memoryview(current.slab.array[start:start + take])
            self.sink.stage(current.slab, start, piece)
            yield piece
            self.used += take  # written: the slab is released only once all of the segment is
            remaining -= take
            if self.used == current.nbytes:
                self.release_current()

    def take_next(self) -> None:
        item = self.queue.get()
        if isinstance(item, Abort):
            self.aborted = True
            raise PersistError("staging failed") from item.error
        self.current, self.used = item, 0  # first: a failing event below is released like any segment
        if item.event is not None:
            item.event.synchronize()  # raises on a device fault (e.g. after an Xid)

    def release_current(self, *, written: bool = True) -> None:
        if self.current is not None:
            if written:
                self.sink.flush()  # the segment's last run reaches the storage before its slab may be reused
            self.pool.unref(self.current.slab)
            self.consumed += self.current.nbytes
            self.current = None

    def drain(self) -> None:
        """After a failure: free the slabs still queued for this file."""
        self.sink.discard()
        self.release_current(written=False)
        while not self.aborted and self.consumed < self.plan.payload_bytes:
            item = self.queue.get()
            if isinstance(item, Abort):
                break
            self.pool.unref(item.slab)
            self.consumed += item.nbytes


class CheckpointWriter:
    """Writes planned files from staged segments and commits checkpoints under one storage root.

    Retention deletes and replaced checkpoints are removed on ``janitor`` (nothing waits for them).
    """

    def __init__(self, storage: Storage, pool: HostBufferPool, janitor: cf.ThreadPoolExecutor) -> None:
        self.storage, self.pool, self.janitor = storage, pool, janitor

    def write_file(self, tmp: str, plan: FilePlan, segments_queue: SegmentQueue) -> FileEntry:
        """Render ``plan`` into ``tmp`` from its staged segments (a writer thread's work); its size and checksum."""
        segments = _FileSegments(self.pool, plan, segments_queue)
        writer = None
        try:
            writer = self.storage.open_writer(f"{tmp}/{plan.name}")
            sink = segments.sink = _HashingSink(writer)
            plan.render(sink, segments)
            sink.flush()
            writer.close()
            return FileEntry(size=sink.size, checksum=format_checksum(sink.hasher))
        except BaseException:
            if writer is not None:
                writer.abort()
            segments.drain()
            raise

    def commit(self, plan: SavePlan, entries: dict[str, FileEntry],
               coordinator: RankCoordinator | None) -> dict[str, FileEntry] | None:
        """Write the manifest last and promote the temp dir to ``checkpoint-<step>``; the entries committed.

        With a ``coordinator`` only the committing rank promotes (the others get None).
        """
        if coordinator is not None:  # ckpt_engine.multirank: other ranks announce, rank 0 merges
            merged = coordinator.finish(self.storage, plan.step, plan.temp_dir, entries, plan.metadata)
            if merged is None:
                return None
            entries = merged
        manifest = Manifest(step=plan.step, files=entries, layout=plan.layout, metadata=plan.metadata)
        self.storage.write_atomic(f"{plan.temp_dir}/{MANIFEST_NAME}", manifest.to_json())
        self.promote(plan.temp_dir, checkpoint_dir(plan.step))
        return entries

    def promote(self, tmp: str, final: str) -> None:
        """Rename ``tmp`` to ``final``; a checkpoint already there is moved away first and deleted after."""
        if self.storage.exists(final):
            trash = self.move_to_trash(final)
            self.storage.promote(tmp, final)
            self.discard(trash)
        else:
            self.storage.promote(tmp, final)

    def abandon(self, plan: SavePlan, error: BaseException, coordinator: RankCoordinator | None) -> None:
        """A failed checkpoint: tell the other ranks, delete its temp dir (the committing rank's)."""
        if coordinator is not None:
            coordinator.failed(self.storage, plan.step, plan.temp_dir, error)
        if coordinator is None or coordinator.is_committer:
            self.storage.delete_tree(plan.temp_dir)

    def move_to_trash(self, directory: str) -> str:
        """Rename first (atomic), delete after: a crash never leaves a partly deleted checkpoint visible.

        The rename is not fsynced: journaling filesystems keep metadata operations in order,
        so a power loss can undo it only together with the deletes behind it, and any
        checkpoint with a missing file fails verification anyway.
        """
        trash = f"{TRASH_PREFIX}{directory}-{uuid.uuid4().hex[:8]}"
        self.storage.promote(directory, trash, durable=False)  # a crash that undoes it leaves a whole checkpoint
        return trash

    def discard(self, trash: str) -> None:
        """Delete a renamed-away checkpoint in the background: freeing a large file's blocks takes
        a while, and nothing waits for it (an interrupted delete leaves a trash directory that the
        next start removes)."""
        self.janitor.submit(self.storage.delete_tree, trash)

    def committed_steps(self) -> list[int]:
        """Steps with a committed checkpoint (a manifest), highest first."""
        return [s for s in list_checkpoint_steps(self.storage)
                if self.storage.exists(f"{checkpoint_dir(s)}/{MANIFEST_NAME}")]

    def apply_retention(self, newest: int, *, keep_last: int, protected: Collection[int]) -> list[int]:
        """Delete what :func:`ckpt_engine.planner.retention` does not keep, with their universal views; the steps kept.

        Kept: highest first. A universal view (``universal/checkpoint-<step>/``) whose checkpoint
        is not kept goes too; it holds no checkpoint file, only what DeepSpeed's conversion made.
        """
        kept, doomed = retention(self.committed_steps(), keep_last=keep_last, newest=newest, protected=protected)
        for step in doomed:
            self.discard(self.move_to_trash(checkpoint_dir(step)))
        for name in universal_views_to_delete(self.storage.list_dir(UNIVERSAL_DIR), kept):
            self.janitor.submit(self.storage.delete_tree, f"{UNIVERSAL_DIR}/{name}")
        return kept
