"""Say what an unreadable checkpoint file is and what to do, instead of a bare unpickling error.

:func:`load_torch_file` is the one place the engine's readers (``decode_file``, the
DeepSpeed and DataStates adapters) turn a ``torch.save`` file into objects; when that
fails, :func:`explain_unreadable` looks at the file's first bytes and names what it
looks like: DataStates-LLM's own format (an 8-byte little-endian header length, then a
JSON header with ``datastates_metadata``), safetensors, a truncated zip, a bare pickle,
an empty file. (A ``manifest.json`` from a newer SAT: ``ckpt_engine.contract.check_manifest_format``.)

Files load with ``weights_only=True``: tensors, containers and the few classes
:func:`safe_globals` names, never an arbitrary pickle (a checkpoint planted in Object
Storage must not run code in the training that resumes from it). A job that trusts its
files and needs more sets ``CKPT_WEIGHTS_ONLY=0`` in its env (ADR 0020).
"""

from __future__ import annotations

import io
import json
import os
import struct
from contextlib import nullcontext
from typing import Any

from ckpt_engine.contract import WEIGHTS_ONLY_ENV
from ckpt_engine.errors import UnreadableCheckpointError

_HEAD_BYTES = 1 << 16
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"


def describe_bytes(head: bytes, size: int) -> str:
    """What a file whose first bytes are ``head`` (of ``size`` in all) looks like, in a few words."""
    if size == 0:
        return "an empty file (the write never happened or was cut off)"
    datastates = _datastates_header(head)
    if datastates is not None:
        return (f"DataStates-LLM's own checkpoint format (8-byte header length, JSON header with "
                f"'datastates_metadata', {datastates} tensor(s)), not torch.save's")
    if len(head) >= 8:
        (length,) = struct.unpack("<Q", head[:8])
        if 0 < length < size and head[8:9] == b"{":
            return "a safetensors file (8-byte header length, then a JSON header), not torch.save's"
    if head.startswith(_ZIP_LOCAL):
        return (f"a torch.save zip archive of {size} bytes with no end-of-archive record: truncated "
                "(an interrupted write or copy)")
    if head[:1] == b"\x80":
        return "a bare pickle (torch.save's legacy non-zip format or plain pickle), possibly truncated"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON document, not a torch.save file"
    return f"unknown content (first bytes {head[:8].hex()})"


def _datastates_header(head: bytes) -> int | None:
    """Number of tensors in a DataStates-LLM header at the start of ``head``, or None if it is not one."""
    if len(head) < 9:
        return None
    (length,) = struct.unpack("<Q", head[:8])
    for start in (8, 4096):  # unaligned (most versions) or the header aligned to 4 KiB
        raw = head[start:start + length]
        if length <= 0 or len(raw) < length or raw[:1] != b"{":
            continue
        try:
            header = json.loads(raw)
        except ValueError:
            continue
        if isinstance(header, dict) and "datastates_metadata" in header:
            return len(header) - 1
    return None


def explain_unreadable(path: str, error: BaseException | None = None) -> UnreadableCheckpointError:
    """An error naming ``path``, what its content looks like and what to do."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError as exc:
        return UnreadableCheckpointError(f"{path}: cannot be read ({exc})")
    return explain_bytes(path, head, size, error)


def explain_bytes(name: str, head: bytes, size: int, error: BaseException | None = None) -> UnreadableCheckpointError:
    """Like :func:`explain_unreadable` for bytes already in memory."""
    what = describe_bytes(head, size)
    if what.startswith("DataStates-LLM"):
        todo = ("SAT's engine writes torch.save and safetensors files and does not read DataStates-LLM's format: "
                "load it with DataStates-LLM itself and save it again with torch.save (or start from the previous "
                "SAT checkpoint)")
    elif "truncated" in what or "empty" in what:
        todo = "the file is incomplete: resume from an earlier checkpoint (SAT's resume skips it when it has a manifest)"
    else:
        todo = "this is not a checkpoint file SAT wrote: check the path, or convert it with the tool that wrote it"
    cause = f" ({type(error).__name__}: {error})" if error is not None else ""
    return UnreadableCheckpointError(f"{name}: cannot load this checkpoint file{cause}; it looks like {what}. "
                                     f"What to do: {todo}.")


def weights_only_default() -> bool:
    """``weights_only`` for a load that does not say: True unless the job's env sets ``CKPT_WEIGHTS_ONLY=0``."""
    return os.environ.get(WEIGHTS_ONLY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def safe_globals() -> Any:
    """The classes a ``weights_only`` load accepts beyond torch's own: numpy arrays (the RNG states
    the Trainer and DeepSpeed save) and DeepSpeed's small records in its model and optimizer
    states, when DeepSpeed is installed. None of them runs code when unpickled."""
    import numpy as np
    import torch

    allow = getattr(torch.serialization, "safe_globals", None)
    if allow is None:  # torch < 2.5: tensors and containers only
        return nullcontext()
    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), type(np.dtype(np.float64)),
                          type(np.dtype(np.int64))]
    core = getattr(np, "_core", None) or np.core
    allowed.append(core.multiarray._reconstruct)
    return allow(allowed + _deepspeed_globals())


def _deepspeed_globals() -> list[Any]:
    """DeepSpeed's records in its checkpoints (enums, the loss scaler's fields); none unless this process
    runs DeepSpeed (it is not imported for a load: that takes seconds)."""
    import importlib
    import sys

    found: list[Any] = []
    if "deepspeed" not in sys.modules:
        return found
    for module, names in _DEEPSPEED_GLOBALS:
        try:
            loaded = importlib.import_module(module)
        except Exception:  # noqa: BLE001, S112 - not installed, or its import fails: nothing of it to allow
            continue
        found += [getattr(loaded, name) for name in names if hasattr(loaded, name)]
    return found


# What DeepSpeed's model and ZeRO optimizer states hold beyond tensors and builtins: plain records
# whose unpickling sets attributes and runs nothing (checked by tests/ckpt_engine's DeepSpeed resumes).
_DEEPSPEED_GLOBALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("deepspeed.runtime.fp16.loss_scaler", ("LossScaler", "DynamicLossScaler")),
    ("deepspeed.runtime.zero.config", ("ZeroStageEnum",)),
    ("deepspeed.utils.tensor_fragment", ("fragment_address",)),
)


def load_torch_file(source: str | bytes | memoryview, *, name: str | None = None, map_location: Any = None,
                    weights_only: bool | None = None) -> Any:
    """``torch.load`` of a path or of bytes; an unreadable file raises UnreadableCheckpointError saying why.

    ``weights_only`` None: :func:`weights_only_default` (True unless the job opted out).
    """
    import pickle
    import zipfile

    import torch

    if weights_only is None:
        weights_only = weights_only_default()
    allowed = safe_globals() if weights_only else nullcontext()
    label = name or (source if isinstance(source, str) else "<bytes>")
    try:
        with allowed:
            if isinstance(source, str):
                return torch.load(source, map_location=map_location, weights_only=weights_only)
            return torch.load(io.BytesIO(source), map_location=map_location, weights_only=weights_only)
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, RuntimeError, ValueError, struct.error) as exc:
        if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in str(exc):
            raise  # a readable file whose pickle names a class weights_only refuses: torch's message says which
        if isinstance(source, str):
            raise explain_unreadable(source, exc) from exc
        data = bytes(source[:_HEAD_BYTES])
        raise explain_bytes(str(label), data, len(source), exc) from exc
