"""The checkpoint engine: stage -> persist -> commit, each separately awaitable.

Call order: ``save(step, state)`` (returns a :class:`SaveHandle` once the state is
planned; with ``lazy=False`` also once it is staged) -> keep training, but call
``handle.wait_staged()`` before the optimizer next mutates parameters when ``lazy`` ->
``wait()`` before exit -> ``load(step=None)`` on restart.

The engine coordinates; the work is done by :mod:`ckpt_engine.planner` (what to save),
:mod:`ckpt_engine.stager` (device -> host buffers) and :mod:`ckpt_engine.writer`
(persist and commit through the storage interface).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ckpt_engine.contract import (
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
from ckpt_engine.formats import FilePlan, gc_paused, parse_safetensors
from ckpt_engine.manifest import (
    checksum_buffer,
    format_checksum,
    list_checkpoint_steps,
    new_hasher,
    verify_checkpoint,
)
from ckpt_engine.metrics import recorder as metrics_recorder
from ckpt_engine.planner import (
    SavePlan,
    check_options,
    host_buffer_bytes,
    plan_save,
    plan_state,
    temp_dir_name,
)
from ckpt_engine.pool import DEFAULT_SLAB_BYTES, HostBufferPool
from ckpt_engine.sniff import load_torch_file
from ckpt_engine.stager import SegmentQueue, Stager
from ckpt_engine.storage.base import Storage, open_storage
from ckpt_engine.writer import CheckpointWriter, background_thread

if TYPE_CHECKING:
    from ckpt_engine.mirror import CheckpointMirror
    from ckpt_engine.multirank import RankCoordinator

log = logging.getLogger("ckpt_engine")

PROGRESS_EVERY_S = 0.25
# A step-only progress update reaches the mirror (Object Storage) at most this often; commits,
# resumes and errors go at once. The orchestrator reads the mirrored file on Kubernetes.
PROGRESS_MIRROR_EVERY_S = 30.0


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


@dataclass(frozen=True)
class _SaveTiming:
    """When ``save`` started, how long it waited for a slot and how long it held the caller."""

    started: float
    waited: float
    blocking: float


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


def _done_future(value: Any) -> cf.Future[Any]:
    future: cf.Future[Any] = cf.Future()
    future.set_result(value)
    return future


def _call_now(function: Callable[..., float], *args: Any) -> cf.Future[float]:
    """``function(*args)`` on this thread, its result or exception as a finished future."""
    future: cf.Future[float] = cf.Future()
    try:
        future.set_result(function(*args))
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's future, which raises it there
        future.set_exception(exc)
    return future


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
    ``background_priority`` (``"normal"``, ``"nice"`` or ``"idle"``) is the CPU priority of
    the writer, commit and retention threads (:func:`ckpt_engine.writer.background_thread`;
    ADR 0030: lowered, they made the next save wait longer on a busy 2-core machine, so
    ``normal`` is the default); staging, which the training thread may wait for, keeps the caller's.
    """

    def __init__(self, root: str | Storage, *, host_cache_size: float = 1.0, parser_threads: int = 1,
                 pin_host_cache: bool = True, keep_last: int = 3, max_in_flight: int = 1,
                 on_error: str = "continue", slab_bytes: int = DEFAULT_SLAB_BYTES, rank: int = 0,
                 clean_stale: bool = True, mirror_url: str | Storage | None = None,
                 background_priority: str = "normal") -> None:
        check_options(on_error=on_error, parser_threads=parser_threads, max_in_flight=max_in_flight,
                      keep_last=keep_last, host_cache_size=host_cache_size)
        lower = background_thread(background_priority)  # raises ValueError for an unknown priority
        storage = open_storage(root)
        self.keep_last, self.max_in_flight, self.on_error, self.rank = keep_last, max_in_flight, on_error, rank
        self.pool = HostBufferPool(host_buffer_bytes(host_cache_size), slab_bytes=slab_bytes, pin=pin_host_cache)
        if pin_host_cache and not torch.cuda.is_available():
            log.info("[Concurrent Checkpoint] pin_host_cache ignored: no CUDA device")
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self._writers = cf.ThreadPoolExecutor(parser_threads, thread_name_prefix="ckpt-writer", initializer=lower)
        self._stager = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-stage")
        self._committer = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-commit", initializer=lower)
        self._janitor = cf.ThreadPoolExecutor(1, thread_name_prefix="ckpt-janitor", initializer=lower)
        self.host_stager = Stager(self.pool, self._stream)
        self.storage_writer = CheckpointWriter(storage, self.pool, self._janitor)  # holds ``storage``
        self._lock = threading.Lock()
        self._in_flight: list[SaveHandle] = []
        self.last_error: BaseException | None = None
        self.records: list[CommitRecord] = []
        self.progress = ProgressRecord(committed_steps=self.storage_writer.committed_steps())
        self._progress_written_at = 0.0
        self._progress_mirrored_at = 0.0
        self.progress.last_committed_step = self.progress.committed_steps[0] if self.progress.committed_steps else None
        self._progress_lock = threading.Lock()
        self.on_commit: list[Callable[[CommitRecord], None]] = []
        self.mirror: CheckpointMirror | None = None
        self.coordinator: RankCoordinator | None = None  # set when several ranks write each checkpoint
        self.protected_steps: set[int] = set()  # never deleted by retention (the Trainer's best checkpoint)
        if mirror_url is not None and rank <= 0:
            self._attach_mirror(mirror_url)
        self.metrics = metrics_recorder() if rank <= 0 else None  # SAT's per-job series (ckpt_engine.metrics)
        if self.metrics is not None:
            recorder = self.metrics
            self.on_commit.append(lambda record: recorder.note_save(record.step, self.progress.timings))
        if clean_stale and rank <= 0:
            self._remove_incomplete()

    @property
    def storage(self) -> Storage:
        """The storage root checkpoints are written to and read from (the writer's)."""
        return self.storage_writer.storage

    @storage.setter
    def storage(self, storage: Storage) -> None:  # a test wraps it to inject faults after start-up
        self.storage_writer.storage = storage

    def _attach_mirror(self, mirror_url: str | Storage) -> None:
        from ckpt_engine.mirror import CheckpointMirror

        mirror = CheckpointMirror(self.storage, mirror_url, keep_last=self.keep_last,
                                  on_mirrored=lambda step: self._write_progress(last_mirrored_step=step))
        self.on_commit.append(lambda record: mirror.submit(record.step))
        self.mirror = mirror

    def _remove_incomplete(self) -> None:
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
            return SaveHandle(step, _done_future(0.0), _done_future(None))
        temp_dir = self.coordinator.temp_dir(step) if self.coordinator else temp_dir_name(step, uuid.uuid4().hex[:8])
        plan = plan_save(step, files, temp_dir=temp_dir, layout=layout, metadata=metadata)
        queues: list[SegmentQueue] = [queue.SimpleQueue() for _ in plan.files]
        file_futures = [self._writers.submit(self._write_file, temp_dir, file, out)
                        for file, out in zip(plan.files, queues)]
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
        if lazy:
            staged = self._stager.submit(self._stage, plan.files, queues)
        else:
            staged = _call_now(self._stage, plan.files, queues)
        timing = _SaveTiming(started, waited, time.perf_counter() - started)
        persisted = self._committer.submit(self._commit, plan, file_futures, staged, timing)
        handle = SaveHandle(step, staged, persisted)
        handle.blocking_s = timing.blocking
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

    def _stage(self, files: Sequence[FilePlan], queues: Sequence[SegmentQueue]) -> float:
        """Stage ``files`` into host buffers on this thread (:class:`ckpt_engine.stager.Stager`)."""
        return self.host_stager.stage(files, queues)

    def _write_file(self, tmp: str, plan: FilePlan, segments_queue: SegmentQueue) -> FileEntry:
        """Write one planned file from its segments (a writer thread's work; :mod:`ckpt_engine.writer`)."""
        return self.storage_writer.write_file(tmp, plan, segments_queue)

    def _commit(self, plan: SavePlan, file_futures: list[cf.Future[FileEntry]], staged: cf.Future[float],
                timing: _SaveTiming) -> CommitRecord | None:
        step = plan.step
        self._write_progress(step=step, in_flight_step=step)
        try:
            cf.wait(file_futures)
            stage_s = staged.result()
            entries = {file.name: future.result() for file, future in zip(plan.files, file_futures)}
            persisted_at = time.perf_counter()
            committed = self.storage_writer.commit(plan, entries, self.coordinator)
            if committed is None:
                return None
        except BaseException as exc:
            self.storage_writer.abandon(plan, exc, self.coordinator)
            self.last_error = exc
            self._write_progress(in_flight_step=None, last_error=f"checkpoint-{step}: {exc!r}")
            log.error("[Concurrent Checkpoint] checkpoint-%d failed and was discarded (previous checkpoint %s is "
                      "intact): %r", step, self.progress.last_committed_step, exc)
            raise PersistError(f"checkpoint-{step} failed: {exc!r}") from exc
        done = time.perf_counter()
        record = CommitRecord(step=step, directory=checkpoint_dir(step),
                              total_bytes=sum(e.size for e in committed.values()), blocking_s=timing.blocking,
                              stage_s=stage_s, persist_s=persisted_at - timing.started,
                              commit_s=done - persisted_at, waited_for_previous_s=timing.waited)
        self._announce(record, total_s=done - timing.started)
        return record

    def _announce(self, record: CommitRecord, *, total_s: float) -> None:
        """A committed checkpoint: record it, apply retention, update progress.json, call ``on_commit``."""
        self.records.append(record)
        committed = self.storage_writer.apply_retention(record.step, keep_last=self.keep_last,
                                                        protected=self.protected_steps)
        self._write_progress(last_committed_step=record.step, committed_steps=committed, in_flight_step=None,
                             timings={k: v for k, v in asdict(record).items() if k.endswith("_s")} |
                             {"total_s": total_s, "bytes": float(record.total_bytes)})
        log.info("[Concurrent Checkpoint] committed checkpoint-%d (%.1f MB, persist %.2fs)", record.step,
                 record.total_bytes / 1e6, record.persist_s)
        for callback in self.on_commit:
            try:
                callback(record)
            except Exception:
                log.exception("[Concurrent Checkpoint] on_commit callback failed for checkpoint-%d", record.step)

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

    def load(self, step: int | None = None, *, map_location: Any = "cpu",
             weights_only: bool | None = None) -> dict[str, Any]:
        """The saved state of ``step`` (default: newest verified); checksums are checked while reading.

        ``weights_only`` None: True unless the job's env sets ``CKPT_WEIGHTS_ONLY=0`` (``sniff``).
        """
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
    def _read_state(self, manifest: Manifest, map_location: Any, weights_only: bool | None) -> dict[str, Any]:
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


def decode_file(name: str, buffer: np.ndarray, *, map_location: Any = "cpu", weights_only: bool | None = None) -> Any:
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
