"""The checkpoint engine: stage -> persist -> commit, each separately awaitable.

Call order: ``save(step, state)`` (returns a :class:`SaveHandle` once the state is
planned; with ``lazy=False`` also once it is staged) -> keep training, but call
``handle.wait_staged()`` before the optimizer next mutates parameters when ``lazy`` ->
``wait()`` before exit -> ``load(step=None)`` on restart.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import json
import logging
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ckpt_engine.contract import (
    MANIFEST_NAME,
    PROGRESS_NAME,
    TMP_PREFIX,
    TRASH_PREFIX,
    FileEntry,
    Manifest,
    ProgressRecord,
    checkpoint_dir,
    utc_now,
)
from ckpt_engine.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    PersistError,
)
from ckpt_engine.formats import (
    FilePlan,
    gc_paused,
    is_flat_tensor_dict,
    parse_safetensors,
    plan_safetensors,
    plan_torch_file,
)
from ckpt_engine.manifest import (
    checksum_buffer,
    format_checksum,
    hash_pool,
    list_checkpoint_steps,
    new_hasher,
    verify_checkpoint,
)
from ckpt_engine.metrics import recorder as metrics_recorder
from ckpt_engine.pool import DEFAULT_SLAB_BYTES, SEGMENT_ALIGNMENT, HostBufferPool, Slab
from ckpt_engine.sniff import load_torch_file
from ckpt_engine.storage.base import Storage, StorageWriter, open_storage

if TYPE_CHECKING:
    from ckpt_engine.mirror import CheckpointMirror
    from ckpt_engine.multirank import RankCoordinator

log = logging.getLogger("ckpt_engine")

PROGRESS_EVERY_S = 0.25
# A step-only progress update reaches the mirror (Object Storage) at most this often; commits,
# resumes and errors go at once. The orchestrator reads the mirrored file on Kubernetes.
PROGRESS_MIRROR_EVERY_S = 30.0
ON_ERROR_CHOICES = ("continue", "raise")
_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_GIB = 1 << 30


@dataclass
class Segment:
    """A staged run of bytes in a slab; ``event`` (CUDA) must complete before it is read."""

    slab: Slab
    offset: int
    nbytes: int
    event: Any = None


@dataclass
class _Abort:
    error: BaseException


@dataclass
class CommitRecord:
    """What one committed checkpoint cost."""

    step: int
    directory: str
    total_bytes: int
    blocking_s: float
    stage_s: float
    persist_s: float
    commit_s: float
    waited_for_previous_s: float


class SaveHandle:
    """One checkpoint in flight: ``staged`` and ``persisted`` are separately awaitable futures."""

    def __init__(self, step: int, staged: cf.Future[float], persisted: cf.Future[CommitRecord | None]) -> None:
        self.step = step
        self.staged = staged
        self.persisted = persisted
        self.blocking_s = 0.0

    def wait_staged(self, timeout: float | None = None) -> float:
        """Block until every tensor is copied to host buffers; returns the staging time."""
        return self.staged.result(timeout)

    def wait(self, timeout: float | None = None) -> CommitRecord | None:
        """Block until committed; raises PersistError if the checkpoint failed."""
        return self.persisted.result(timeout)

    def done(self) -> bool:
        """Whether the checkpoint is committed or has failed."""
        return self.persisted.done()


_OVERLAP_MIN_BYTES = 1 << 20
FIRST_SEGMENT_BYTES = 4 << 20  # segment size while the first slab fills (see CheckpointEngine._stage)
# memmove without releasing the GIL, for small copies: releasing it for a few bytes means
# queueing behind the writer thread to get it back (up to the 5 ms switch interval)
_memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value)
_RELEASE_GIL_ABOVE_BYTES = 256 << 10
PACK_BELOW_BYTES = 64 << 10  # smaller CPU blobs are packed into shared segments (the writer slices them apart)
PACK_RUN_BYTES = 1 << 20  # a packed segment is handed over once it holds this much


class _HashingSink:
    """Writes a file's bytes and hashes them; large pieces are hashed on another thread while written."""

    def __init__(self, writer: StorageWriter) -> None:
        self.writer, self.hasher, self.size = writer, new_hasher(), 0

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if len(view) < _OVERLAP_MIN_BYTES:
            self.hasher.update(view)
            self.writer.write(view)
        else:  # the piece stays valid until both are done: its slab is released only after we return
            hashed = hash_pool().submit(self.hasher.update, view)
            try:
                self.writer.write(view)
            finally:
                hashed.result()
        self.size += len(view)


def _done_future(value: Any) -> cf.Future[Any]:
    future: cf.Future[Any] = cf.Future()
    future.set_result(value)
    return future


@gc_paused()
def plan_state(state: Mapping[str, Any]) -> tuple[list[FilePlan], dict[str, str]]:
    """One file per top-level key: flat tensor dicts as safetensors, anything else as torch zip."""
    files: list[FilePlan] = []
    keys: dict[str, str] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"state key {key!r} must match {_KEY_RE.pattern} (it becomes a file name)")
        if is_flat_tensor_dict(value):
            keys[key] = f"{key}.safetensors"
            files.append(plan_safetensors(keys[key], value, drop_shared=False))
        else:
            keys[key] = f"{key}.pt"
            files.append(plan_torch_file(keys[key], value))
    return files, keys


class CheckpointEngine:
    """Concurrent checkpoints of a training state under one storage root.

    Parameters: ``root`` (path or URL, e.g. ``file:///ckpt``), ``host_cache_size`` (GB
    of host staging memory, allocated lazily up to this bound), ``parser_threads``
    (writer threads), ``pin_host_cache`` (pinned buffers when CUDA is present),
    ``keep_last`` (retention; 0 keeps all), ``max_in_flight`` (checkpoints persisting at
    once), ``on_error`` (``"continue"``: log a failed checkpoint and train on;
    ``"raise"``: the next ``save``/``wait`` raises PersistError), ``mirror_url`` (copy each
    committed checkpoint there in the background, see :mod:`ckpt_engine.mirror`; rank 0
    only). ``on_commit`` callbacks get each CommitRecord on the commit thread. With a
    ``coordinator`` (:mod:`ckpt_engine.multirank`) several ranks write each checkpoint:
    this rank's part goes into a shared temp dir and only the committing rank promotes it.
    """

    def __init__(self, root: str | Storage, *, host_cache_size: float = 1.0, parser_threads: int = 1,
                 pin_host_cache: bool = True, keep_last: int = 3, max_in_flight: int = 1,
                 on_error: str = "continue", slab_bytes: int = DEFAULT_SLAB_BYTES, rank: int = 0,
                 clean_stale: bool = True, mirror_url: str | Storage | None = None) -> None:
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
        if parser_threads < 1 or max_in_flight < 1 or keep_last < 0 or host_cache_size <= 0:
            raise ValueError("parser_threads and max_in_flight must be >= 1, keep_last >= 0, host_cache_size > 0")
        self.storage = open_storage(root)
        self.keep_last, self.max_in_flight, self.on_error, self.rank = keep_last, max_in_flight, on_error, rank
        self.pool = HostBufferPool(int(host_cache_size * _GIB), slab_bytes=slab_bytes, pin=pin_host_cache)
        if pin_host_cache and not torch.cuda.is_available():
            log.info("[Concurrent Checkpoint] pin_host_cache ignored: no CUDA device")
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self._writers = cf.ThreadPoolExecutor(parser_threads, thread_name_prefix="ckpt-writer")
        self._stager = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-stage")
        self._committer = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-commit")
        self._janitor = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-janitor")
        self._lock = threading.Lock()
        self._in_flight: list[SaveHandle] = []
        self.last_error: BaseException | None = None
        self.records: list[CommitRecord] = []
        self.progress = ProgressRecord(committed_steps=self._committed_steps())
        self._progress_written_at = 0.0
        self._progress_mirrored_at = 0.0
        self.progress.last_committed_step = self.progress.committed_steps[0] if self.progress.committed_steps else None
        self._progress_lock = threading.Lock()
        self.on_commit: list[Callable[[CommitRecord], None]] = []
        self.mirror: CheckpointMirror | None = None
        self.coordinator: RankCoordinator | None = None  # set when several ranks write each checkpoint
        self.protected_steps: set[int] = set()  # never deleted by retention (the Trainer's best checkpoint)
        if mirror_url is not None and rank <= 0:
            from ckpt_engine.mirror import CheckpointMirror

            mirror = CheckpointMirror(self.storage, mirror_url, keep_last=keep_last,
                                      on_mirrored=lambda step: self._write_progress(last_mirrored_step=step))
            self.on_commit.append(lambda record: mirror.submit(record.step))
            self.mirror = mirror
        self.metrics = metrics_recorder() if rank <= 0 else None  # SAT's per-job series (ckpt_engine.metrics)
        if self.metrics is not None:
            recorder = self.metrics
            self.on_commit.append(lambda record: recorder.note_save(record.step, self.progress.timings))
        if clean_stale and rank <= 0:
            for name in self.storage.list_dir(""):
                if name.startswith((TMP_PREFIX, TRASH_PREFIX, f"{PROGRESS_NAME}.tmp-")):
                    log.warning("[Concurrent Checkpoint] removing incomplete %s left by an earlier run", name)
                    self.storage.delete_tree(name)

    # ---- save -------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any], *, lazy: bool = False,
             metadata: Mapping[str, Any] | None = None) -> SaveHandle:
        """Checkpoint ``state`` (a mapping of names to tensors, state dicts or picklable values)."""
        files, keys = plan_state(state)
        return self.save_files(step, files, layout="state", metadata={**(metadata or {}), "keys": keys}, lazy=lazy)

    def save_files(self, step: int, files: Sequence[FilePlan], *, layout: str = "files",
                   metadata: Mapping[str, Any] | None = None, lazy: bool = False) -> SaveHandle:
        """Checkpoint planned files as ``checkpoint-<step>``; the lower-level entry the adapters use."""
        started = time.perf_counter()
        self.raise_if_failed()
        waited = self._wait_for_slot(step)
        if self.records and self.records[-1].step == step:
            # the same step twice in this run (a SIGTERM's final save right after a periodic one). A
            # checkpoint-<step> left by an earlier run is replaced: the run that resumed behind it
            # (it was corrupt, or CKPT_LAST_STEP named an older step) has its own state at that step
            log.info("[Concurrent Checkpoint] checkpoint-%d already committed; not saving it again", step)
            handle = SaveHandle(step, _done_future(0.0), _done_future(None))
            return handle
        tmp = self.coordinator.temp_dir(step) if self.coordinator else f"{TMP_PREFIX}{step}-{uuid.uuid4().hex[:8]}"
        queues: list[queue.SimpleQueue[Segment | _Abort]] = [queue.SimpleQueue() for _ in files]
        file_futures = [self._writers.submit(self._write_file, tmp, plan, q) for plan, q in zip(files, queues)]
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
        if lazy:
            staged = self._stager.submit(self._stage, files, queues)
        else:
            staged = cf.Future()
            try:
                staged.set_result(self._stage(files, queues))
            except BaseException as exc:
                staged.set_exception(exc)
        blocking = time.perf_counter() - started
        persisted = self._committer.submit(self._commit, step, tmp, files, file_futures, staged, layout,
                                           dict(metadata or {}), started, waited, blocking)
        handle = SaveHandle(step, staged, persisted)
        handle.blocking_s = blocking
        with self._lock:
            self._in_flight.append(handle)
        if not lazy and staged.exception() is not None:
            raise staged.exception()  # type: ignore[misc]
        return handle

    def _wait_for_slot(self, step: int) -> float:
        with self._lock:
            pending = [h for h in self._in_flight if not h.done()]
        waited = 0.0
        while len(pending) >= self.max_in_flight:
            oldest = pending[0]
            start = time.perf_counter()
            try:
                oldest.persisted.exception()
            finally:
                waited += time.perf_counter() - start
            pending = pending[1:]
        if waited > 0.001:
            log.info("[Concurrent Checkpoint] checkpoint-%d waited %.3fs for the previous checkpoint to commit",
                     step, waited)
        return waited

    def _stage(self, files: Sequence[FilePlan], queues: Sequence[queue.SimpleQueue[Segment | _Abort]]) -> float:
        started = time.perf_counter()
        slab: Slab | None = None
        stream = self._stream
        staged = 0
        run: list[Any] = []  # [queue, start offset] of small blobs packed back to back in ``slab``

        def hand_over(out: queue.SimpleQueue[Segment | _Abort], offset: int, count: int, event: Any = None) -> None:
            assert slab is not None
            self.pool.ref(slab)
            out.put(Segment(slab, offset, count, event))
            slab.fill = min(slab.capacity, offset + count + (-(offset + count) % SEGMENT_ALIGNMENT))

        def close_run() -> None:
            if run:
                out, offset = run
                run.clear()
                hand_over(out, offset, slab.fill - offset)  # type: ignore[union-attr]

        try:
            for plan, out in zip(files, queues):
                for blob in plan.blobs:
                    tensor = blob.tensor
                    on_gpu = stream is not None and tensor.is_cuda
                    # CPU bytes are copied by address with one plain memmove (no tensor slices; not
                    # torch's copy_, which splits large copies over its intra-op threads and takes the
                    # writers' cores); large copies release the GIL, small ones keep it
                    by_address = not on_gpu and tensor.device.type == "cpu" and tensor.is_contiguous()
                    packed = by_address and blob.nbytes < PACK_BELOW_BYTES
                    if not packed:
                        close_run()
                    address = tensor.data_ptr() if by_address else 0
                    flat = None
                    if on_gpu:  # a non-contiguous tensor is made contiguous on the side stream, before its copies
                        with torch.cuda.stream(stream):
                            flat = blob.source
                    elif not by_address:
                        flat = blob.source
                    position = 0
                    while position < blob.nbytes:
                        if slab is None or slab.fill >= slab.capacity:
                            close_run()
                            if slab is not None:
                                self.pool.seal(slab)
                            slab = self.pool.acquire()
                        # short segments through the first slab: the disk starts ~1 ms after save()
                        # and never waits for a whole slab's copy
                        limit = FIRST_SEGMENT_BYTES if staged < self.pool.slab_bytes else slab.capacity
                        count = min(slab.capacity - slab.fill, blob.nbytes - position, limit)
                        offset = slab.fill
                        event = None
                        if by_address:
                            copy = ctypes.memmove if count > _RELEASE_GIL_ABOVE_BYTES else _memmove_holding_gil
                            copy(slab.address + offset, address + position, count)
                        elif on_gpu:
                            with torch.cuda.stream(stream):
                                slab.tensor[offset:offset + count].copy_(flat[position:position + count],
                                                                          non_blocking=True)
                                event = torch.cuda.Event()
                                event.record(stream)
                        else:
                            slab.tensor[offset:offset + count].copy_(flat[position:position + count])
                        if packed:  # small blobs: one segment for many, cut at PACK_RUN_BYTES
                            if not run:
                                run.extend((out, offset))
                            slab.fill = offset + count
                            if slab.fill - run[1] >= PACK_RUN_BYTES:
                                close_run()
                        else:
                            hand_over(out, offset, count, event)
                        position += count
                        staged += count
                close_run()  # a run never spans two files: each file has its own queue
            if stream is not None:
                stream.synchronize()
        except BaseException as exc:
            for out in queues:
                out.put(_Abort(exc))
            raise
        finally:
            if slab is not None:
                self.pool.seal(slab)
        return time.perf_counter() - started

    def _write_file(self, tmp: str, plan: FilePlan, segments_queue: queue.SimpleQueue[Segment | _Abort]) -> FileEntry:
        consumed = 0  # bytes of segments written (or dropped) and released
        current: Segment | None = None  # a packed segment may hold several blobs: handed out piece by piece
        used = 0  # bytes of ``current`` already handed out
        aborted = False  # the stager's _Abort was received: nothing more will come

        def release_current() -> None:
            nonlocal current, consumed
            if current is not None:
                self.pool.unref(current.slab)
                consumed += current.nbytes
                current = None

        def segments(index: int) -> Iterator[memoryview]:
            nonlocal current, used, aborted
            remaining = plan.blobs[index].nbytes
            while remaining > 0:
                if current is None:
                    item = segments_queue.get()
                    if isinstance(item, _Abort):
                        aborted = True
                        raise PersistError("staging failed") from item.error
                    current, used = item, 0  # first: a failing event below is released like any segment
                    if item.event is not None:
                        item.event.synchronize()  # raises on a device fault (e.g. after an Xid)
                take = min(remaining, current.nbytes - used)
                start = current.offset + used
                yield memoryview(current.slab.array[start:start + take])
                used += take  # written: the slab is released only once all of the segment is
                remaining -= take
                if used == current.nbytes:
                    release_current()

        writer = None
        try:
            writer = self.storage.open_writer(f"{tmp}/{plan.name}")
            sink = _HashingSink(writer)
            plan.render(sink, segments)
            writer.close()
            return FileEntry(size=sink.size, checksum=format_checksum(sink.hasher))
        except BaseException:
            if writer is not None:
                writer.abort()
            release_current()
            while not aborted and consumed < plan.payload_bytes:  # free the slabs still queued for this file
                item = segments_queue.get()
                if isinstance(item, _Abort):
                    break
                self.pool.unref(item.slab)
                consumed += item.nbytes
            raise

    def _commit(self, step: int, tmp: str, files: Sequence[FilePlan], file_futures: list[cf.Future[FileEntry]],
                staged: cf.Future[float], layout: str, metadata: dict[str, Any], started: float,
                waited: float, blocking: float) -> CommitRecord | None:
        self._write_progress(step=step, in_flight_step=step)
        try:
            cf.wait(file_futures)
            stage_s = staged.result()
            entries = {plan.name: future.result() for plan, future in zip(files, file_futures)}
            persisted_at = time.perf_counter()
            if self.coordinator is not None:  # ckpt_engine.multirank: other ranks announce, rank 0 merges
                entries = self.coordinator.finish(self.storage, step, tmp, entries, metadata)
                if entries is None:
                    return None
            manifest = Manifest(step=step, files=entries, layout=layout, metadata=metadata)
            self.storage.write_atomic(f"{tmp}/{MANIFEST_NAME}", manifest.to_json())
            final = checkpoint_dir(step)
            if self.storage.exists(final):
                trash = self._move_to_trash(final)
                self.storage.promote(tmp, final)
                self._discard(trash)
            else:
                self.storage.promote(tmp, final)
        except BaseException as exc:
            if self.coordinator is not None:
                self.coordinator.failed(self.storage, step, tmp, exc)
            if self.coordinator is None or self.coordinator.is_committer:
                self.storage.delete_tree(tmp)
            self.last_error = exc
            self._write_progress(in_flight_step=None, last_error=f"checkpoint-{step}: {exc!r}")
            log.error("[Concurrent Checkpoint] checkpoint-%d failed and was discarded (previous checkpoint %s is "
                      "intact): %r", step, self.progress.last_committed_step, exc)
            raise PersistError(f"checkpoint-{step} failed: {exc!r}") from exc
        done = time.perf_counter()
        record = CommitRecord(step=step, directory=final, total_bytes=sum(e.size for e in entries.values()),
                              blocking_s=blocking, stage_s=stage_s, persist_s=persisted_at - started,
                              commit_s=done - persisted_at, waited_for_previous_s=waited)
        self.records.append(record)
        committed = self._apply_retention(step)
        self._write_progress(last_committed_step=step, committed_steps=committed, in_flight_step=None,
                             timings={k: v for k, v in asdict(record).items() if k.endswith("_s")} |
                             {"total_s": done - started, "bytes": float(record.total_bytes)})
        log.info("[Concurrent Checkpoint] committed checkpoint-%d (%.1f MB, persist %.2fs)", step,
                 record.total_bytes / 1e6, record.persist_s)
        for callback in self.on_commit:
            try:
                callback(record)
            except Exception:
                log.exception("[Concurrent Checkpoint] on_commit callback failed for checkpoint-%d", step)
        return record

    def _move_to_trash(self, directory: str) -> str:
        """Rename first (atomic), delete after: a crash never leaves a partly deleted checkpoint visible.

        The rename is not fsynced: journaling filesystems keep metadata operations in order,
        so a power loss can undo it only together with the deletes behind it, and any
        checkpoint with a missing file fails verification anyway.
        """
        trash = f"{TRASH_PREFIX}{directory}-{uuid.uuid4().hex[:8]}"
        self.storage.promote(directory, trash, durable=False)  # a crash that undoes it leaves a whole checkpoint
        return trash

    def _discard(self, trash: str) -> None:
        """Delete a renamed-away checkpoint in the background: freeing a large file's blocks takes
        a while, and nothing waits for it (an interrupted delete leaves a trash directory that the
        next start removes)."""
        self._janitor.submit(self.storage.delete_tree, trash)

    def _committed_steps(self) -> list[int]:
        return [s for s in list_checkpoint_steps(self.storage) if self.storage.exists(f"{checkpoint_dir(s)}/{MANIFEST_NAME}")]

    def _apply_retention(self, newest: int) -> list[int]:
        """Keep the ``keep_last`` highest steps, the one just committed and ``protected_steps``; delete the rest."""
        committed = self._committed_steps()
        if not self.keep_last:
            return committed
        kept = set(committed[: self.keep_last]) | {newest} | (self.protected_steps & set(committed))
        for step in committed:
            if step not in kept:
                self._discard(self._move_to_trash(checkpoint_dir(step)))
        committed = list(kept)
        return sorted(set(committed), reverse=True)

    def _write_progress(self, *, publish: bool | None = None, **changes: Any) -> None:
        """Update progress.json (rank 0); also queue it for the mirror unless only the step moved lately.

        ``publish`` forces (True) or skips (False) the mirror copy.
        """
        with self._progress_lock:  # the commit and mirror threads both write: an older snapshot never lands last
            with self._lock:
                for key, value in changes.items():
                    setattr(self.progress, key, value)
                self.progress.updated_at = utc_now()
                raw = self.progress.to_json()
            if self.rank > 0:  # progress.json is rank 0's
                return
            if self.metrics is not None and set(changes) & {"last_committed_step", "last_mirrored_step"}:
                self.metrics.note_checkpoint_state(last_committed_step=self.progress.last_committed_step,
                                                   last_mirrored_step=self.progress.last_mirrored_step)
            try:
                self.storage.write_atomic(PROGRESS_NAME, raw, durable=False)  # advisory: atomic, no fsync
            except OSError as exc:
                log.warning("[Concurrent Checkpoint] could not write %s: %r", PROGRESS_NAME, exc)
            if self.mirror is None:
                return
            now = time.monotonic()
            if publish is None:
                publish = set(changes) - {"step"} or now - self._progress_mirrored_at >= PROGRESS_MIRROR_EVERY_S
            if publish:
                self._progress_mirrored_at = now
                self.mirror.publish_progress(raw)

    def record_resume(self, step: int) -> None:
        """Note in progress.json (and its mirror, at once) that this process resumes from ``checkpoint-<step>``."""
        self._write_progress(resumed_from_step=step)

    def record_step(self, step: int) -> None:
        """Note the training step; ``progress.json`` gets it at most every PROGRESS_EVERY_S seconds.

        The orchestrator's heartbeat and step-triggered fault injection read it, so it must
        move while training runs, but one small atomic write per quarter second is the cap.
        """
        self.progress.step = step
        now = time.monotonic()
        if now - self._progress_written_at >= PROGRESS_EVERY_S:
            self._progress_written_at = now
            self._write_progress(step=step)

    # ---- wait / errors ------------------------------------------------------------------------

    def wait(self, timeout: float | None = None, *, mirror_deadline: float | None = None) -> list[CommitRecord]:
        """Wait for every in-flight checkpoint and queued retention delete, then for the mirror upload (until ``mirror_deadline``,
        a ``time.monotonic()`` value, default 600 s); raises PersistError only with ``on_error='raise'``."""
        with self._lock:
            handles, self._in_flight = list(self._in_flight), []
        records: list[CommitRecord] = []
        for handle in handles:
            try:
                record = handle.wait(timeout)
            except PersistError:
                continue
            if record is not None:
                records.append(record)
        self._janitor.submit(lambda: None).result()  # retention deletes queued so far are done
        if self.mirror is not None:
            self._write_progress(publish=True)  # the newest step reaches the mirror with the last upload
            if mirror_deadline is None:
                self.mirror.wait()
            else:
                self.mirror.wait(max(0.0, mirror_deadline - time.monotonic()))
        self.raise_if_failed()
        return records

    def raise_if_failed(self) -> None:
        """With ``on_error='raise'``, re-raise the last persist failure (once)."""
        if self.on_error == "raise" and self.last_error is not None:
            error, self.last_error = self.last_error, None
            raise PersistError(f"an earlier checkpoint failed: {error!r}") from error

    def wait_staged(self) -> None:
        """Block until every in-flight checkpoint has finished staging (call before the optimizer steps)."""
        with self._lock:
            handles = list(self._in_flight)
        for handle in handles:
            if not handle.staged.done():
                handle.staged.exception()

    def close(self) -> None:
        """Wait for in-flight checkpoints, then stop the threads and free the buffers."""
        try:
            self.wait()
        finally:
            self._writers.shutdown(wait=True)
            self._stager.shutdown(wait=True)
            self._committer.shutdown(wait=True)
            self._janitor.shutdown(wait=True)
            if self.mirror is not None:
                self.mirror.close(timeout=0)  # wait() above already waited for the upload (bounded)
            self.pool.close()

    # ---- resume / load ----------------------------------------------------------------------

    def find_checkpoint(self, step: int | None = None, *, deep: bool = True) -> Manifest:
        """Manifest of checkpoint ``step`` (or the newest verified one), skipping corrupt ones."""
        for candidate in list_checkpoint_steps(self.storage):
            if step is not None and step >= 0 and candidate != step:
                continue
            report = verify_checkpoint(self.storage, checkpoint_dir(candidate), deep=deep)
            if report.ok and report.manifest is not None:
                return report.manifest
            log.warning("[Concurrent Checkpoint] skipping corrupt checkpoint-%d: %s", candidate,
                        "; ".join(report.problems))
        raise CheckpointNotFoundError(f"no complete, verified checkpoint (step {step}) in {self.storage.url}")

    def load(self, step: int | None = None, *, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        """The saved state of ``step`` (default: newest verified); checksums are checked while reading."""
        problems: list[str] = []
        for candidate in list_checkpoint_steps(self.storage):
            if step is not None and step >= 0 and candidate != step:
                continue
            report = verify_checkpoint(self.storage, checkpoint_dir(candidate), deep=False)
            if not report.ok or report.manifest is None:
                problems.append(f"checkpoint-{candidate}: {'; '.join(report.problems)}")
                log.warning("[Concurrent Checkpoint] skipping corrupt %s", problems[-1])
                continue
            try:
                state = self._read_state(report.manifest, map_location, weights_only)
            except (CorruptCheckpointError, OSError) as exc:  # OSError: EIO while reading, as on a failing disk
                problems.append(f"checkpoint-{candidate}: {exc}")
                log.warning("[Concurrent Checkpoint] skipping corrupt %s", problems[-1])
                continue
            self.record_resume(candidate)
            return state
        raise CheckpointNotFoundError(f"no complete, verified checkpoint (step {step}) in {self.storage.url}: "
                                      f"{problems}")

    @gc_paused()  # unpickling an optimizer state allocates per tensor too: ~18% of a 20,000-tensor load
    def _read_state(self, manifest: Manifest, map_location: Any, weights_only: bool) -> dict[str, Any]:
        directory = checkpoint_dir(manifest.step)
        names = manifest.metadata.get("keys") or {name: name for name in manifest.files}
        state: dict[str, Any] = {}
        for key, name in names.items():
            buffer = read_verified(self.storage, f"{directory}/{name}", manifest.files[name])
            state[key] = decode_file(name, buffer, map_location=map_location, weights_only=weights_only)
        return state


def read_verified(storage: Storage, key: str, entry: FileEntry) -> np.ndarray:
    """A file's bytes (memory-mapped when local), with size and checksum checked in the same pass."""
    path = storage.local_path(key)
    if path is not None:
        actual = os.path.getsize(path)
        if actual != entry.size:
            raise CorruptCheckpointError(f"{key}: size {actual} differs from the manifest's {entry.size} (truncated?)")
        buffer = np.memmap(path, dtype=np.uint8, mode="c") if entry.size else np.empty(0, dtype=np.uint8)
        checksum = checksum_buffer(buffer, entry.checksum)  # chunks hashed on all cores
    else:
        buffer = np.empty(entry.size, dtype=np.uint8)
        view = memoryview(buffer)
        hasher, offset = new_hasher(entry.checksum), 0
        with storage.open_reader(key) as fh:
            while offset < entry.size:
                count = fh.readinto(view[offset:offset + (64 << 20)])
                if not count:
                    break
                hasher.update(view[offset:offset + count])
                offset += count
            extra = fh.read(1)
        if offset != entry.size or extra:
            raise CorruptCheckpointError(f"{key}: size differs from the manifest (truncated?)")
        checksum = format_checksum(hasher)
    if checksum != entry.checksum:
        raise CorruptCheckpointError(f"{key}: checksum mismatch")
    return buffer


def decode_file(name: str, buffer: np.ndarray, *, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """Turn a file's verified bytes back into Python objects according to its extension."""
    if name.endswith(".safetensors"):
        tensors = parse_safetensors(buffer)
        if map_location not in (None, "cpu"):
            tensors = {k: v.to(map_location) for k, v in tensors.items()}
        return tensors
    if name.endswith((".pt", ".pth", ".bin")):
        return load_torch_file(buffer.data, name=name, map_location=map_location, weights_only=weights_only)
    if name.endswith(".json"):
        return json.loads(buffer.tobytes())
    return buffer.tobytes()
