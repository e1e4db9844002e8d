"""What a checkpoint saves, decided before a byte moves: files, sizes, the host-buffer budget, retention."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckpt_engine.contract import TMP_PREFIX, parse_step
from ckpt_engine.formats import (
    FilePlan,
    gc_paused,
    is_flat_tensor_dict,
    plan_safetensors,
    plan_torch_file,
)

ON_ERROR_CHOICES = ("continue", "raise")
KEY_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
GIB = 1 << 30


@dataclass(frozen=True)
class SavePlan:
    """One checkpoint to write: its files (in order), where they go first, the manifest's layout and metadata."""

    step: int
    temp_dir: str
    files: Sequence[FilePlan]
    layout: str = "files"
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def payload_bytes(self) -> int:
        """Bytes that pass through the host buffers (tensor data; a file's header and pickles do not)."""
        return sum(plan.payload_bytes for plan in self.files)


def check_options(*, on_error: str, parser_threads: int, max_in_flight: int, keep_last: int,
                  host_cache_size: float) -> None:
    """Raise ValueError for engine options that cannot work."""
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    if parser_threads < 1 or max_in_flight < 1 or keep_last < 0 or host_cache_size <= 0:
        raise ValueError("parser_threads and max_in_flight must be >= 1, keep_last >= 0, host_cache_size > 0")


def host_buffer_bytes(host_cache_size: float) -> int:
    """The host-buffer budget in bytes for ``host_cache_size`` GiB (the pool allocates up to it, lazily)."""
    return int(host_cache_size * GIB)


def temp_dir_name(step: int, token: str) -> str:
    """The directory a single-rank checkpoint is written into before it is promoted (``token``: unique per save)."""
    return f"{TMP_PREFIX}{step}-{token}"


@gc_paused()
def plan_state(state: Mapping[str, Any]) -> tuple[list[FilePlan], dict[str, str]]:
    """One file per top-level key: flat tensor dicts as safetensors, anything else as torch zip."""
    files: list[FilePlan] = []
    keys: dict[str, str] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise ValueError(f"state key {key!r} must match {KEY_RE.pattern} (it becomes a file name)")
        if is_flat_tensor_dict(value):
            keys[key] = f"{key}.safetensors"
            files.append(plan_safetensors(keys[key], value, drop_shared=False))
        else:
            keys[key] = f"{key}.pt"
            files.append(plan_torch_file(keys[key], value))
    return files, keys


def plan_save(step: int, files: Sequence[FilePlan], *, temp_dir: str, layout: str = "files",
              metadata: Mapping[str, Any] | None = None) -> SavePlan:
    """The plan for checkpoint ``step`` of ``files`` (the metadata is copied: the caller may change its own)."""
    return SavePlan(step=step, temp_dir=temp_dir, files=files, layout=layout, metadata=dict(metadata or {}))


def retention(committed: Sequence[int], *, keep_last: int, newest: int,
              protected: Collection[int] = ()) -> tuple[list[int], list[int]]:
    """(steps kept, highest first; steps to delete, in ``committed``'s order) after ``newest`` committed.

    Keeps the ``keep_last`` first of ``committed`` (highest first), ``newest`` and the
    protected steps; ``keep_last`` 0 keeps everything.
    """
    if not keep_last:
        return list(committed), []
    kept = set(committed[:keep_last]) | {newest} | (set(protected) & set(committed))
    return sorted(kept, reverse=True), [step for step in committed if step not in kept]


#: Under the checkpoint root: ``universal/checkpoint-<step>/``, a DeepSpeed checkpoint converted to
#: DeepSpeed's universal format for a resume on another world size
#: (:func:`ckpt_engine.integrations.elastic.universal_view`); not a checkpoint itself.
UNIVERSAL_DIR = "universal"


def universal_views_to_delete(names: Sequence[str], kept: Collection[int]) -> list[str]:
    """The entries of ``universal/`` (``checkpoint-<step>`` and its ``.tmp`` build) whose checkpoint is not kept.

    A view is derived from one committed checkpoint and useless without it: it goes when
    retention deletes the checkpoint, and one left by a checkpoint deleted otherwise goes at
    the next retention.
    """
    return [name for name in names
            if (step := parse_step(name.removesuffix(".tmp"))) is None or step not in kept]
