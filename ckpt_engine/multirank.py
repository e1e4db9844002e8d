"""Multi-rank commit: several ranks write one checkpoint directory, rank 0 commits it.

Used when the HF Trainer runs with world size > 1 (DeepSpeed ZeRO-1/2/3 or DDP): every rank
owns files of the checkpoint (its ``rng_state_<r>.pth``; under DeepSpeed its
``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``, under ZeRO-3 also its
``zero_pp_rank_<r>_mp_rank_00_model_states.pt``; rank 0 also the model, trainer state
and global files).

Protocol (no torch.distributed call ever happens off the training thread):

1. **One shared temporary directory.** At start-up, on the training thread, rank 0
   draws a run token and broadcasts it (:func:`agree_run_token`; this is also where a
   root that is not shared between ranks is detected). Every rank then numbers its saves
   the same way (the Trainer calls ``_save_checkpoint`` on every rank in the same order),
   so the temp name ``.tmp-checkpoint-<step>-<token>-<seq>`` is agreed without talking.
2. **Per-rank marker.** When a rank's files are written and fsynced (the engine's writers
   fsync each file; :meth:`RankCoordinator.finish` fsyncs their directories), it writes
   ``.ranks/rank-<r>.json`` inside the temp directory atomically (temp, fsync, rename)
   with its file entries (sizes, xxh3 checksums) and a digest of its own content. A rank
   whose part failed writes a marker with ``ok: false`` so rank 0 stops waiting early.
3. **Rank 0 commits.** Its commit thread polls the shared filesystem until all
   ``world_size`` markers are present (or ``timeout_s`` passes), checks them (digest,
   run token, step, rank, sizes of the listed files), merges the entries into the single
   manifest (written last by the engine), and the engine fsyncs and renames the
   directory into place. A missing, failed, corrupt or inconsistent marker raises
   PersistError: the engine discards the temp directory and the previous checkpoint
   stays the newest usable one.
4. Only rank 0 deletes (failed temp dirs, older temp dirs of this run, retention) and
   writes ``progress.json``; other ranks never delete or promote anything.

The temp directory must be on storage all ranks see (a shared filesystem for several nodes).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import xxhash

from ckpt_engine.contract import TMP_PREFIX, FileEntry
from ckpt_engine.errors import CorruptCheckpointError, PersistError
from ckpt_engine.storage.base import Storage
from ckpt_engine.storage.file import fsync_dir

log = logging.getLogger("ckpt_engine")

MARKER_DIR = ".ranks"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_POLL_S = 0.1
PROBE_PREFIX = f"{TMP_PREFIX}probe-"  # under TMP_PREFIX: an engine start-up removes a left-over probe


def marker_key(tmp: str, rank: int) -> str:
    """Key of rank ``rank``'s marker inside the temp directory ``tmp``."""
    return f"{tmp}/{MARKER_DIR}/rank-{rank}.json"


@dataclass
class RankMarker:
    """What one rank announces about its part of a checkpoint (``ok`` False: it failed, with ``error``)."""

    rank: int
    world_size: int
    step: int
    token: str
    ok: bool
    files: dict[str, FileEntry] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> bytes:
        """Serialized form, with a digest over the rest so a torn or edited marker is detected."""
        body = asdict(self)
        digest = xxhash.xxh3_64(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return json.dumps({**body, "digest": f"xxh3_64:{digest}"}, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RankMarker:
        """Parse and check the digest; CorruptCheckpointError on anything unexpected."""
        try:
            data = json.loads(raw)
            digest = data.pop("digest")
            expected = xxhash.xxh3_64(json.dumps(data, sort_keys=True).encode()).hexdigest()
            if digest != f"xxh3_64:{expected}":
                raise ValueError("digest mismatch")
            files = {name: FileEntry(size=int(e["size"]), checksum=str(e["checksum"]))
                     for name, e in data["files"].items()}
            return cls(rank=int(data["rank"]), world_size=int(data["world_size"]), step=int(data["step"]),
                       token=str(data["token"]), ok=bool(data["ok"]), files=files, error=data.get("error"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable rank marker: {exc}") from exc


class RankCoordinator:
    """One rank's side of the multi-rank commit (see the module docstring).

    Call order on the training thread: :meth:`next_save` once per Trainer save on every
    rank, then ``engine.save_files`` (which asks :meth:`temp_dir` for the shared name); the
    engine's commit thread calls :meth:`finish` once this rank's files are written, or
    :meth:`failed` when they are not.
    """

    def __init__(self, rank: int, world_size: int, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 poll_s: float = DEFAULT_POLL_S) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        if not re.fullmatch(r"[0-9a-f]{4,32}", token):
            raise ValueError(f"run token {token!r} must be 4-32 lowercase hex digits")
        self.rank, self.world_size, self.token = rank, world_size, token
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.seq = 0
        self._tmp_re = re.compile(rf"^{re.escape(TMP_PREFIX)}\d+-{token}-(\d+)$")

    @property
    def is_committer(self) -> bool:
        """Whether this rank merges, promotes and deletes (rank 0)."""
        return self.rank == 0

    def next_save(self) -> int:
        """Count one save; every rank calls this for every Trainer save, in the same order."""
        self.seq += 1
        return self.seq

    def temp_dir(self, step: int) -> str:
        """The temp directory all ranks write the current save into."""
        return f"{TMP_PREFIX}{step}-{self.token}-{self.seq}"

    # ---- commit thread ------------------------------------------------------------------------

    def finish(self, storage: Storage, step: int, tmp: str, entries: Mapping[str, FileEntry],
               metadata: dict[str, Any]) -> dict[str, FileEntry] | None:
        """Announce this rank's durable files; on rank 0 also wait for every rank and merge.

        Returns the merged entries on rank 0 (``metadata['ranks']`` gets each rank's file
        names) and None on other ranks. Raises PersistError when the checkpoint cannot be
        committed (a rank failed, a marker is corrupt or inconsistent, or ``timeout_s`` passed).
        """
        _fsync_parents(storage, tmp, entries)
        marker = RankMarker(self.rank, self.world_size, step, self.token, True, dict(entries))
        storage.write_atomic(marker_key(tmp, self.rank), marker.to_json())
        if not self.is_committer:
            log.info("[Concurrent Checkpoint] rank %d: its part of checkpoint-%d is durable (%d files)",
                     self.rank, step, len(entries))
            return None
        markers = self._wait_for_markers(storage, step, tmp)
        merged: dict[str, FileEntry] = {}
        owners: dict[str, list[str]] = {}
        for rank, other in sorted(markers.items()):
            for name, entry in other.files.items():
                if name in merged:
                    raise PersistError(f"checkpoint-{step}: {name} written by more than one rank")
                key = f"{tmp}/{name}"
                if not storage.exists(key) or storage.size(key) != entry.size:
                    raise PersistError(f"checkpoint-{step}: rank {rank}'s {name} is missing or not "
                                       f"{entry.size} bytes")
                merged[name] = entry
            owners[str(rank)] = sorted(other.files)
        storage.delete_tree(f"{tmp}/{MARKER_DIR}")  # not part of the checkpoint
        metadata["world_size"] = self.world_size
        metadata["ranks"] = owners
        self._sweep_older(storage, tmp)
        return merged

    def failed(self, storage: Storage, step: int, tmp: str, error: BaseException) -> None:
        """This rank's part failed: tell rank 0 (best effort) so it stops waiting. Deletes nothing."""
        if self.is_committer:
            return
        marker = RankMarker(self.rank, self.world_size, step, self.token, False, error=repr(error))
        try:
            storage.write_atomic(marker_key(tmp, self.rank), marker.to_json())
        except Exception as exc:  # noqa: BLE001 - rank 0 will time out instead
            log.warning("[Concurrent Checkpoint] rank %d could not report its failure of checkpoint-%d: %r",
                        self.rank, step, exc)

    def _wait_for_markers(self, storage: Storage, step: int, tmp: str) -> dict[int, RankMarker]:
        deadline = time.monotonic() + self.timeout_s
        found: dict[int, RankMarker] = {}
        while True:
            for rank in range(self.world_size):
                if rank in found:
                    continue
                try:
                    raw = storage.read_bytes(marker_key(tmp, rank))
                except FileNotFoundError:
                    continue
                try:
                    marker = RankMarker.from_json(raw)
                except CorruptCheckpointError as exc:
                    raise PersistError(f"checkpoint-{step}: rank {rank}'s marker is corrupt: {exc}") from exc
                problem = self._check(marker, rank, step)
                if problem:
                    raise PersistError(f"checkpoint-{step}: rank {rank}'s marker {problem}")
                if not marker.ok:
                    raise PersistError(f"checkpoint-{step}: rank {rank} failed to write its part: {marker.error}")
                found[rank] = marker
            if len(found) == self.world_size:
                return found
            if time.monotonic() >= deadline:
                missing = sorted(set(range(self.world_size)) - set(found))
                raise PersistError(f"checkpoint-{step}: no marker from rank(s) {missing} within "
                                   f"{self.timeout_s:g}s (rank died, hung, or the directory is not shared)")
            time.sleep(self.poll_s)

    def _check(self, marker: RankMarker, rank: int, step: int) -> str | None:
        if marker.rank != rank:
            return f"names rank {marker.rank}"
        if marker.step != step or marker.token != self.token or marker.world_size != self.world_size:
            return (f"is for step {marker.step}, run {marker.token}, world size {marker.world_size} "
                    f"(expected {step}, {self.token}, {self.world_size})")
        return None

    def _sweep_older(self, storage: Storage, tmp: str) -> None:
        """Remove temp dirs of this run's earlier saves (abandoned by a timed-out or skipped save).

        Safe: each rank persists its saves in order, one at a time, so once every rank's
        marker for this save is in, no rank still writes an earlier one.
        """
        current = self._tmp_re.match(tmp)
        if current is None:
            return
        for name in storage.list_dir(""):
            match = self._tmp_re.match(name)
            if match and int(match.group(1)) < int(current.group(1)):
                log.warning("[Concurrent Checkpoint] removing abandoned %s", name)
                storage.delete_tree(name)


def _fsync_parents(storage: Storage, tmp: str, entries: Mapping[str, FileEntry]) -> None:
    """fsync the directories holding this rank's files (their data is already fsynced by the writers)."""
    folders = {os.path.dirname(f"{tmp}/{name}") for name in entries}
    for folder in sorted(folders, key=len, reverse=True):
        path = storage.local_path(folder)
        if path is not None and os.path.isdir(path):
            fsync_dir(path)


def agree_run_token(storage: Storage, rank: int, world_size: int) -> str | None:
    """On the training thread of every rank: a token from rank 0, or None when the root is not shared.

    Rank 0 writes a probe file under the checkpoint root; every rank reports whether it
    sees it (an all-gather). Two collectives, once, at start-up.
    """
    import torch.distributed as dist

    token = [uuid.uuid4().hex[:12] if rank == 0 else None]
    probe = f"{PROBE_PREFIX}{token[0]}" if rank == 0 else ""
    if rank == 0:
        storage.write_atomic(f"{probe}/probe", b"ckpt_engine shared-storage probe\n")
    dist.broadcast_object_list(token, src=0)
    agreed = str(token[0])
    sees = storage.exists(f"{PROBE_PREFIX}{agreed}/probe")
    seen: list[Any] = [None] * world_size
    dist.all_gather_object(seen, sees)
    if rank == 0:
        storage.delete_tree(probe)
    if not all(seen):
        blind = [r for r, ok in enumerate(seen) if not ok]
        log.warning("[Concurrent Checkpoint] rank(s) %s do not see %s (not shared storage)", blind, storage.url)
        return None
    return agreed
