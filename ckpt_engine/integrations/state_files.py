"""One file per ``save(state_dict, path)`` through SAT's engine: the DataStates-LLM engine surface.

:class:`BaseCheckpointEngine` is ``datastates.BaseCheckpointEngine`` (and the base of
``datastates.CheckpointEngine``, which adds DeepSpeed's tag commit): ``save`` stages the
state into the engine's host buffers and returns True (the caller may change the state
at once); writer threads persist it to a temporary name, fsync and rename it;
``wait(persist=True)`` blocks until every file is durable; ``load`` waits for a pending
write of the same path first. Files are ``torch.save``-compatible. ``load`` is the user
loading their own file: it unpickles what was saved when the file is in the run's own
prefix (ADR 0038); the engine's automatic resume never comes through here.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ckpt_engine.config import DataStatesConfig
from ckpt_engine.contract import FileEntry
from ckpt_engine.engine import CheckpointEngine as _Engine
from ckpt_engine.errors import PersistError
from ckpt_engine.formats import plan_torch_file
from ckpt_engine.sniff import load_user_run_file, note_saved_here
from ckpt_engine.storage.file import FileStorage, fsync_dir

log = logging.getLogger("ckpt_engine")

ALIGNMENT = 4096


class BaseCheckpointEngine:
    """``BaseCheckpointEngine(runtime_config={}, rank=0)``: save / load / wait / commit / shutdown.

    Call order: ``save(state_dict, path)`` (any number, returns True once staged) ->
    ``wait(persist=True)`` or ``commit(tag)`` (durable) -> ``load(path)`` -> ``shutdown()``.
    ``runtime_config`` in any shape :class:`~ckpt_engine.config.DataStatesConfig` accepts.
    """

    # False: each file is written to a temporary name and renamed when durable. The DeepSpeed
    # engine writes in place (DeepSpeed globs for its files before loading them); its manifest
    # and ``.ranks/`` tell a committed tag from one in flight.
    write_in_place = False

    def __init__(self, runtime_config: Any = None, rank: int = 0) -> None:
        self.config = DataStatesConfig.from_any(runtime_config)
        self.rank = int(rank)
        self.last_ckpt_version = -1
        self._engine = _Engine(FileStorage("/"), host_cache_size=self.config.cache_gb,
                               parser_threads=self.config.parser_threads,
                               pin_host_cache=self.config.pin_host_cache, clean_stale=False)
        self._pending: dict[str, cf.Future[FileEntry]] = {}
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []
        self._shut = False

    @staticmethod
    def get_aligned_offset(offset: int) -> int:
        """``offset`` rounded up to the 4 KiB alignment the engine's direct writes use."""
        return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    def save(self, state_dict: Mapping[str, Any], path: str) -> bool:
        """Stage ``state_dict`` now, persist it to ``path`` in the background; True (as upstream)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict given to checkpoint must be a dict, got {type(state_dict).__name__} "
                            f"for {path}")
        self._save_file(state_dict, os.path.abspath(path))
        return True

    def _save_file(self, state_dict: Any, path: str) -> cf.Future[FileEntry]:
        self._wait_path(path)
        note_saved_here(path)  # the user's own file: an explicit load() may unpickle it (ADR 0038)
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        temp_name = name if self.write_in_place else f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        if self.write_in_place:
            open(path, "wb").close()  # the name exists when save() returns, as with torch.save
        started = time.perf_counter()
        plan = plan_torch_file(temp_name, state_dict)
        segments: queue.SimpleQueue[Any] = queue.SimpleQueue()
        written = self._engine._writers.submit(self._engine._write_file, directory.lstrip("/"), plan, segments)
        self._engine._stage([plan], [segments])
        future = self._engine._committer.submit(self._finish, written, os.path.join(directory, temp_name), path,
                                                started)
        with self._lock:
            self._pending[path] = future
        return future

    def _finish(self, written: cf.Future[FileEntry], temp_path: str, path: str, started: float) -> FileEntry:
        try:
            entry = written.result()
            if temp_path != path:
                os.replace(temp_path, path)
            fsync_dir(os.path.dirname(path))
        except BaseException as exc:
            if temp_path != path and os.path.exists(temp_path):
                os.remove(temp_path)
            log.error("[Concurrent Checkpoint] writing %s failed: %r", path, exc)
            with self._lock:
                self._errors.append(exc)
            raise
        if self.config.profile_engine:
            log.info("[Concurrent Checkpoint] %s: %d bytes durable %.3fs after save()", path, entry.size,
                     time.perf_counter() - started)
        return entry

    def _wait_path(self, path: str) -> None:
        with self._lock:
            future = self._pending.pop(path, None)
        if future is not None:
            future.exception()

    def load(self, path: str, map_location: Any = None) -> Any:
        """The object saved at ``path`` (after any pending write of it); unreadable files say why.

        Tensors and allow-listed types load ``weights_only``; other Python objects load as upstream
        only from the user's own run prefix (``sniff.trusted_run_path``, ADR 0038)."""
        self._wait_path(os.path.abspath(path))
        return load_user_run_file(path, map_location=map_location)

    def wait(self, persist: bool = False) -> None:
        """Staging is complete when ``save`` returns; with ``persist`` also block until every file is durable.

        Raises PersistError if a file could not be written (upstream exits the process).
        """
        if persist:
            self._wait_durable()

    def _wait_durable(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        cf.wait(pending)
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise PersistError(f"{len(errors)} checkpoint file(s) failed: {errors[0]!r}") from errors[0]

    def commit(self, tag: Any) -> bool:
        """Every file saved so far is durable; True (as upstream)."""
        self._wait_durable()
        self.last_ckpt_version += 1
        log.info("[Concurrent Checkpoint] checkpoint %s is durable", tag)
        return True

    def shutdown(self) -> None:
        """Wait for every file, then stop the engine's threads and free its buffers; idempotent."""
        if self._shut:
            return
        self._shut = True
        try:
            self._wait_durable()
        finally:
            self._engine.close()
