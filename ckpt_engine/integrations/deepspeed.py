"""DeepSpeed integration: the engine as DeepSpeed's checkpoint engine (also behind the ``datastates`` alias).

Two entry points:

* :func:`plan_deepspeed_files` runs ``DeepSpeedEngine.save_checkpoint`` with a
  collecting checkpoint engine, so ZeRO files become part of one concurrent checkpoint
  (used by DecoratedCheckpointing under the HF Trainer).
* :class:`DataStatesEngine` is what DeepSpeed's ``datastates_ckpt`` config loads as
  ``datastates.CheckpointEngine(deepspeed_config, rank)``: ``save(state_dict, path)``
  stages and returns, files are written in the background (temp name, fsync, rename),
  ``wait(persist=True)`` blocks until they are durable.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import queue
import shutil
import threading
import uuid
from typing import Any

import torch

from ckpt_engine.engine import CheckpointEngine
from ckpt_engine.errors import PersistError
from ckpt_engine.formats import BytesFile, FilePlan, plan_torch_file
from ckpt_engine.layout import TMP_PREFIX
from ckpt_engine.storage.file import FileStorage

log = logging.getLogger("ckpt_engine")


def _collecting_engine_class() -> type:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
        CheckpointEngine as DeepSpeedCheckpointEngine,
    )

    class CollectingCheckpointEngine(DeepSpeedCheckpointEngine):
        """Records every ``save`` as a planned file instead of writing it."""

        def __init__(self, scratch: str) -> None:
            super().__init__(None)
            self.name = "ckpt_engine-collector"
            self.scratch = scratch
            self.files: list[FilePlan] = []

        def create(self, info: Any) -> None:
            return None

        def save(self, state_dict: Any, path: str) -> None:
            name = os.path.relpath(path, self.scratch)
            if name.startswith(".."):
                raise PersistError(f"DeepSpeed saved {path} outside the checkpoint directory")
            self.files.append(plan_torch_file(name, state_dict))

        def load(self, path: str, map_location: Any = None) -> Any:
            return torch.load(path, map_location=map_location, weights_only=False)

        def commit(self, info: Any) -> bool:
            return True

        def preserves_storage_sharing(self) -> bool:
            return False

    return CollectingCheckpointEngine


def plan_deepspeed_files(ds_engine: Any, step: int, root: str, *, write_latest: bool = True) -> list[FilePlan]:
    """Files DeepSpeed would write for ``global_step<step>`` on this rank (ZeRO partitions, model states, ``latest``).

    Every rank must call this (DeepSpeed's ``save_checkpoint`` is collective). Each rank
    gets its own files: rank 0 ``mp_rank_00_model_states.pt`` (and ``zero_to_fp32.py``),
    every rank its ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` (under ZeRO-3 also its
    ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``, rank 0 no ``mp_rank_00``). ``write_latest``
    adds the ``latest`` file DeepSpeed resumes through (rank 0's job in a multi-rank run).
    """
    tag = f"global_step{step}"
    scratch = os.path.join(root, f"{TMP_PREFIX}ds-{step}-{uuid.uuid4().hex[:8]}")
    os.makedirs(scratch, exist_ok=True)
    collector = _collecting_engine_class()(scratch)
    original = ds_engine.checkpoint_engine
    ds_engine.checkpoint_engine = collector
    try:
        ds_engine.save_checkpoint(scratch, tag=tag, save_latest=False)
        files = list(collector.files)
        planned = {plan.name for plan in files}
        for folder, _, names in os.walk(scratch):  # helper scripts DeepSpeed copies in directly
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, scratch)
                if relative not in planned:
                    with open(path, "rb") as fh:
                        files.append(BytesFile(name=relative, data=fh.read()))
    finally:
        ds_engine.checkpoint_engine = original
        shutil.rmtree(scratch, ignore_errors=True)
    if write_latest:
        files.append(BytesFile(name="latest", data=tag.encode()))
    return files


class DataStatesEngine:
    """``datastates.CheckpointEngine(deepspeed_config, rank)``: save / load / wait for DeepSpeed.

    ``save`` returns once the state is staged in host buffers (DeepSpeed may then step
    the optimizer); each file is written to a temporary name, fsynced and renamed, so a
    crash never leaves a torn file under the final name.
    """

    def __init__(self, deepspeed_config: Any = None, rank: int = 0) -> None:
        settings = _datastates_settings(deepspeed_config)
        self.rank = rank
        self._engine = CheckpointEngine(FileStorage("/"), host_cache_size=settings.get("host_cache_size", 16),
                                        parser_threads=int(settings.get("parser_threads", 1)),
                                        pin_host_cache=bool(settings.get("pin_host_cache", True)),
                                        clean_stale=False)
        self._pending: dict[str, cf.Future[Any]] = {}
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def save(self, state_dict: Any, path: str) -> None:
        """Stage ``state_dict`` now and persist it to ``path`` in the background."""
        path = os.path.abspath(path)
        self._wait_path(path)
        directory, name = os.path.split(path)
        temp_name = f".{name}.tmp-{uuid.uuid4().hex[:8]}"
        plan = plan_torch_file(temp_name, state_dict)
        segments: queue.SimpleQueue[Any] = queue.SimpleQueue()
        key = directory.lstrip("/")
        written = self._engine._writers.submit(self._engine._write_file, key, plan, segments)
        self._engine._stage([plan], [segments])
        future = self._engine._committer.submit(self._finish, written, os.path.join(directory, temp_name), path)
        with self._lock:
            self._pending[path] = future

    def _finish(self, written: cf.Future[Any], temp_path: str, path: str) -> None:
        try:
            written.result()
            os.replace(temp_path, path)
            fd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as exc:
            if os.path.exists(temp_path):
                os.remove(temp_path)
            log.error("[Concurrent Checkpoint] writing %s failed: %r", path, exc)
            with self._lock:
                self._errors.append(exc)
            raise

    def _wait_path(self, path: str) -> None:
        with self._lock:
            future = self._pending.pop(path, None)
        if future is not None:
            future.exception()

    def load(self, path: str, map_location: Any = None) -> Any:
        """``torch.load`` of ``path`` once any pending write of it is durable."""
        self._wait_path(os.path.abspath(path))
        return torch.load(path, map_location=map_location, weights_only=False)

    def wait(self, persist: bool = True) -> bool:
        """Block until staged (always, on return of save) and, with ``persist``, until durable."""
        if persist:
            with self._lock:
                pending, self._pending = list(self._pending.values()), {}
            cf.wait(pending)
            with self._lock:
                errors, self._errors = self._errors, []
            if errors:
                raise PersistError(f"{len(errors)} checkpoint file(s) failed: {errors[0]!r}") from errors[0]
        return True


def _datastates_settings(deepspeed_config: Any) -> dict[str, Any]:
    if deepspeed_config is None:
        return {}
    config = getattr(deepspeed_config, "datastates_config", None)
    raw = getattr(config, "config", None) if config is not None else None
    if raw is None and isinstance(deepspeed_config, dict):
        raw = deepspeed_config.get("datastates_ckpt", {})
    return dict(raw) if isinstance(raw, dict) else {}
