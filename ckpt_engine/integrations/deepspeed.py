"""DeepSpeed integration: the engine as DeepSpeed's checkpoint engine (also behind the ``datastates`` alias).

Two entry points:

* :func:`plan_deepspeed_files` runs ``DeepSpeedEngine.save_checkpoint`` with a
  collecting checkpoint engine, so ZeRO files become part of one concurrent checkpoint
  (used by DecoratedCheckpointing under the HF Trainer).
* :class:`DataStatesEngine` is what DeepSpeed's ``datastates_ckpt`` config loads as
  ``datastates.CheckpointEngine(runtime_config, rank)``: ``save(state_dict, path)``
  stages and returns True, files are written in the background (temp name, fsync,
  rename), and each DeepSpeed tag (``<save_dir>/<tag>/``) is committed as one checkpoint:
  every rank announces its durable files (a marker under ``<tag>/.ranks/``), rank 0
  writes ``<tag>/manifest.json`` and then ``<save_dir>/latest`` (both atomically), so
  ``load_checkpoint(save_dir)`` without a tag resumes from the newest committed one.
  DeepSpeed 0.19.8's decoupled path never commits (nor writes ``latest``) by itself.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckpt_engine.contract import MANIFEST_NAME, TMP_PREFIX, FileEntry, Manifest
from ckpt_engine.errors import CorruptCheckpointError, NotCommittedError, PersistError
from ckpt_engine.formats import BytesFile, FilePlan, plan_torch_file
from ckpt_engine.integrations.state_files import BaseCheckpointEngine
from ckpt_engine.multirank import (
    DEFAULT_POLL_S,
    DEFAULT_TIMEOUT_S,
    MARKER_DIR,
    RankMarker,
)
from ckpt_engine.sniff import load_torch_file, load_user_run_file
from ckpt_engine.storage.file import FileStorage, fsync_dir

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
            return load_torch_file(path, map_location=map_location)  # weights_only unless the job opted out

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


_TAG_STEP = re.compile(r"(\d+)$")
DATASTATES_TOKEN = "da7a57a7"  # the marker's run token: one DeepSpeed tag directory is one save


@dataclass
class _TagSave:
    """This rank's part of one DeepSpeed tag directory: its files, then its commit."""

    files: dict[str, cf.Future[FileEntry]] = field(default_factory=dict)
    committed: cf.Future[None] | None = None


class DataStatesEngine(BaseCheckpointEngine):
    """``datastates.CheckpointEngine(runtime_config={}, rank=0)``: DeepSpeed's ``datastates_ckpt`` engine.

    DeepSpeed calls ``save(state_dict, <save_dir>/<tag>/<file>)`` for this rank's files of a
    tag, ``load(path)`` for each file it resumes from and ``wait(persist=True)`` when it
    commits or is destroyed. This rank's part of a tag is *sealed* by its ZeRO optimizer
    file (the last one DeepSpeed saves per rank), by a save into another tag, or by
    ``wait``/``commit``/``load``/``shutdown``; sealing writes its marker, and rank 0, once
    every writing rank's marker is in, writes ``manifest.json`` and then ``latest``. A
    ``load`` of a tag this process is still saving waits for its commit; a tag another
    process is writing (``.ranks/`` present, no manifest) raises NotCommittedError.
    """

    write_in_place = True

    def __init__(self, runtime_config: Any = None, rank: int = 0) -> None:
        super().__init__(runtime_config, rank)
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        self.global_rank = dist.get_rank() if distributed else self.rank
        self.world_size = dist.get_world_size() if distributed else 1
        # ZeRO-0 (no ZeRO): only rank 0 writes files (the model states); ZeRO 1-3: every rank
        self.writing_ranks = [0] if self.config.zero_stage == 0 else list(range(self.world_size))
        self.timeout_s, self.poll_s = DEFAULT_TIMEOUT_S, DEFAULT_POLL_S
        self._tags: dict[str, _TagSave] = {}
        self._open_tag: str | None = None
        self._tag_lock = threading.Lock()

    # ---- save / seal --------------------------------------------------------------------------

    def save(self, state_dict: Mapping[str, Any], path: str) -> bool:
        """Stage ``state_dict`` for ``<save_dir>/<tag>/<file>``; True (as upstream)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict given to checkpoint must be a dict, got {type(state_dict).__name__} "
                            f"for {path}")
        path = os.path.abspath(path)
        tag_dir = os.path.dirname(path)
        with self._tag_lock:
            if self._open_tag is not None and self._open_tag != tag_dir:
                self._seal(self._open_tag)
            if tag_dir not in self._tags or self._tags[tag_dir].committed is not None:
                self._start_tag(tag_dir)
            self._open_tag = tag_dir
            self._tags[tag_dir].files[os.path.basename(path)] = self._save_file(state_dict, path)
            if path.endswith("optim_states.pt"):
                self._seal(tag_dir)
        return True

    def _start_tag(self, tag_dir: str) -> None:
        """A new save of ``tag_dir``: mark it in flight (``.ranks/``); a re-save drops its old manifest."""
        os.makedirs(os.path.join(tag_dir, MARKER_DIR), exist_ok=True)
        if self.global_rank == 0:
            manifest = os.path.join(tag_dir, MANIFEST_NAME)
            if os.path.exists(manifest):
                os.remove(manifest)
        self._tags[tag_dir] = _TagSave()

    def _seal(self, tag_dir: str) -> None:
        """This rank's files of ``tag_dir`` are all saved: commit them on the commit thread (caller holds the lock)."""
        tag = self._tags[tag_dir]
        if tag.committed is None:
            tag.committed = self._engine._committer.submit(self._commit_tag, tag_dir, dict(tag.files))
        if self._open_tag == tag_dir:
            self._open_tag = None

    def _seal_open(self) -> None:
        with self._tag_lock:
            if self._open_tag is not None:
                self._seal(self._open_tag)

    def _commit_tag(self, tag_dir: str, files: dict[str, cf.Future[FileEntry]]) -> None:
        """Marker for this rank's part; on rank 0 wait for every writing rank, then manifest, then ``latest``."""
        tag = os.path.basename(tag_dir)
        match = _TAG_STEP.search(tag)
        step = int(match.group(1)) if match else -1
        storage = FileStorage(tag_dir)
        try:
            entries = {name: future.result() for name, future in files.items()}
            marker = RankMarker(self.global_rank, self.world_size, step, DATASTATES_TOKEN, True, entries)
        except BaseException as exc:
            marker = RankMarker(self.global_rank, self.world_size, step, DATASTATES_TOKEN, False, error=repr(exc))
            storage.write_atomic(f"{MARKER_DIR}/rank-{self.global_rank}.json", marker.to_json())
            raise
        storage.write_atomic(f"{MARKER_DIR}/rank-{self.global_rank}.json", marker.to_json())
        if self.global_rank != 0:
            return
        merged: dict[str, FileEntry] = {}
        owners: dict[str, list[str]] = {}
        for rank, other in sorted(self._wait_for_markers(storage, tag).items()):
            for name, entry in other.files.items():
                if not storage.exists(name) or storage.size(name) != entry.size:
                    raise PersistError(f"{tag_dir}: rank {rank}'s {name} is missing or not {entry.size} bytes")
                merged[name] = entry
            owners[str(rank)] = sorted(other.files)
        manifest = Manifest(step=step, files=merged, layout="deepspeed",
                            metadata={"tag": tag, "world_size": self.world_size, "ranks": owners})
        storage.write_atomic(MANIFEST_NAME, manifest.to_json())
        storage.delete_tree(MARKER_DIR)
        fsync_dir(tag_dir)
        FileStorage(os.path.dirname(tag_dir)).write_atomic("latest", tag.encode())
        log.info("[Concurrent Checkpoint] committed DeepSpeed checkpoint %s (%d files); latest -> %s", tag_dir,
                 len(merged), tag)

    def _wait_for_markers(self, storage: FileStorage, tag: str) -> dict[int, RankMarker]:
        deadline = time.monotonic() + self.timeout_s
        found: dict[int, RankMarker] = {}
        while True:
            for rank in self.writing_ranks:
                if rank in found:
                    continue
                try:
                    marker = RankMarker.from_json(storage.read_bytes(f"{MARKER_DIR}/rank-{rank}.json"))
                except FileNotFoundError:
                    continue
                except CorruptCheckpointError as exc:
                    raise PersistError(f"{tag}: rank {rank}'s marker is corrupt: {exc}") from exc
                if not marker.ok:
                    raise PersistError(f"{tag}: rank {rank} failed to write its part: {marker.error}")
                found[rank] = marker
            if len(found) == len(self.writing_ranks):
                return found
            if time.monotonic() >= deadline:
                missing = sorted(set(self.writing_ranks) - set(found))
                raise PersistError(f"{tag}: no marker from rank(s) {missing} within {self.timeout_s:g}s")
            time.sleep(self.poll_s)

    # ---- load / wait --------------------------------------------------------------------------

    def load(self, path: str, map_location: Any = None) -> Any:
        """``torch.load`` of a committed file; waits for a save of its tag in this process first.

        Python objects beyond tensors and allow-listed types load only from the run's own prefix (ADR 0038)."""
        path = os.path.abspath(path)
        tag_dir = os.path.dirname(path)
        with self._tag_lock:
            tag = self._tags.get(tag_dir)
            if tag is not None:
                self._seal(tag_dir)
        if tag is not None and tag.committed is not None:
            tag.committed.result()  # this rank's part (rank 0: the whole commit) or its error
            self._wait_for_manifest(tag_dir)
        self._check_committed(path)
        return load_user_run_file(path, map_location=map_location)  # the user's own run prefix: ADR 0038

    def _wait_for_manifest(self, tag_dir: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(os.path.join(tag_dir, MANIFEST_NAME)):
            if time.monotonic() >= deadline:
                raise NotCommittedError(f"{tag_dir}: rank 0 did not commit it within {self.timeout_s:g}s")
            time.sleep(self.poll_s)

    @staticmethod
    def _check_committed(path: str) -> None:
        """A file of a tag being written elsewhere is refused; a committed one must have its manifest size."""
        tag_dir, name = os.path.split(path)
        manifest_path = os.path.join(tag_dir, MANIFEST_NAME)
        if not os.path.exists(manifest_path):
            if os.path.isdir(os.path.join(tag_dir, MARKER_DIR)):
                raise NotCommittedError(
                    f"{path}: checkpoint {os.path.basename(tag_dir)} is not committed yet (no {MANIFEST_NAME}; "
                    f"its save is still in flight in another process, or failed). Load the tag named in "
                    f"{os.path.join(os.path.dirname(tag_dir), 'latest')}, or wait for the save to finish.")
            return  # a tag written without this engine (DeepSpeed's default engine): load it as it is
        with open(manifest_path, "rb") as handle:
            manifest = Manifest.from_json(handle.read())
        entry = manifest.files.get(name)
        if entry is not None and os.path.exists(path) and os.path.getsize(path) != entry.size:
            raise CorruptCheckpointError(f"{path}: {os.path.getsize(path)} bytes, the manifest says {entry.size} "
                                         "(truncated or replaced); resume from another tag")

    def _wait_durable(self) -> None:
        """Every file durable and every tag committed (rank 0: manifest and ``latest``; others: their marker)."""
        self._seal_open()
        with self._tag_lock:
            commits = [tag.committed for tag in self._tags.values() if tag.committed is not None]
        super()._wait_durable()
        errors = [future.exception() for future in commits]
        with self._tag_lock:
            self._tags = {k: v for k, v in self._tags.items() if v.committed is None or not v.committed.done()}
        failed = [error for error in errors if error is not None]
        if failed:
            raise PersistError(f"{len(failed)} DeepSpeed checkpoint commit(s) failed: {failed[0]!r}") from failed[0]
