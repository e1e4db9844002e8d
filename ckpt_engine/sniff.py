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

One exception (ADR 0038): an explicit ``load(path)`` through the DataStates-LLM API, of a
file in the user's own run prefix (:func:`trusted_run_path`), loads what was saved, as
upstream does: it tries ``weights_only`` first and, when that refuses a class, loads the
file fully and warns once. ``CKPT_WEIGHTS_ONLY=1`` turns that off.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import warnings
from contextlib import nullcontext
from typing import Any

from ckpt_engine.contract import OUTPUT_DIR_ENV, WEIGHTS_ONLY_ENV
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


def weights_only_setting() -> bool | None:
    """``CKPT_WEIGHTS_ONLY`` as the job set it: True (forced on), False (opted out), None (unset)."""
    raw = os.environ.get(WEIGHTS_ONLY_ENV, "").strip().lower()
    if not raw:
        return None
    return raw not in ("0", "false", "no", "off")


def weights_only_default() -> bool:
    """``weights_only`` for a load that does not say: True unless the job's env sets ``CKPT_WEIGHTS_ONLY=0``."""
    return weights_only_setting() is not False


# NumPy's dtype classes a plain array may carry (not object or structured dtypes: those nest other objects).
_NUMPY_DTYPES = ("Bool", "Byte", "Bytes", "Complex128", "Complex64", "DateTime64", "Float16", "Float32",
                 "Float64", "Int16", "Int32", "Int64", "Int8", "Int", "Long", "LongDouble", "LongLong", "Short",
                 "Str", "TimeDelta64", "UByte", "UInt16", "UInt32", "UInt64", "UInt8", "UInt", "ULong",
                 "ULongLong", "UShort", "CLongDouble")


def safe_global_list() -> list[Any]:
    """What a ``weights_only`` load accepts beyond torch's own (which has tensors, ``torch.Size``,
    dtypes, dict, list, tuple, set, OrderedDict, Counter): numpy arrays and scalars of plain
    dtypes (RNG states, metrics), ``frozenset`` (torch's unpickler cannot rebuild a ``deque`` or
    a ``defaultdict``: such a file needs the trusted load), and DeepSpeed's small records in its model and optimizer states when DeepSpeed is
    installed. None of them runs code of the file's choosing when unpickled."""
    import numpy as np

    allowed: list[Any] = [np.ndarray, np.dtype, frozenset]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:  # numpy >= 1.25
        allowed += [getattr(dtypes, f"{name}DType") for name in _NUMPY_DTYPES if hasattr(dtypes, f"{name}DType")]
    else:  # pragma: no cover - older numpy: the dtype classes of the RNG states
        allowed += [type(np.dtype(np.uint32)), type(np.dtype(np.float64)), type(np.dtype(np.int64))]
    core = getattr(np, "_core", None) or np.core
    allowed += [core.multiarray._reconstruct, core.multiarray.scalar]
    return allowed + _deepspeed_globals()


def safe_globals() -> Any:
    """A context in which ``torch.load(weights_only=True)`` accepts :func:`safe_global_list`."""
    import torch

    allow = getattr(torch.serialization, "safe_globals", None)
    if allow is None:  # torch < 2.5: tensors and containers only
        return nullcontext()
    return allow(safe_global_list())


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
    The engine's automatic resume comes through here and only here: it never trusts a file.
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


# ---- the user's own run prefix (ADR 0038) -----------------------------------------------------------

_saved_here: set[str] = set()  # files a DataStates engine of this process wrote
_saved_lock = threading.Lock()
_warned = False


def note_saved_here(path: str) -> None:
    """Remember that this process's DataStates engine wrote ``path`` (it is the user's own)."""
    with _saved_lock:
        _saved_here.add(os.path.realpath(path))


def _scoped_or_local() -> bool:
    """False when this process holds long-lived Object Storage keys (no session token): then its run's
    prefix is not its own alone (``[sat] scoped_credentials = off`` gives every training the service keys)."""
    return not (os.environ.get("AWS_ACCESS_KEY_ID") and not os.environ.get("AWS_SESSION_TOKEN"))


def trusted_run_path(path: str) -> bool:
    """Whether ``path`` is in the user's own run prefix, so that an explicit DataStates ``load`` may
    unpickle it as upstream does (ADR 0038).

    Trusted: a file a DataStates engine of this process saved, or, in a SAT training
    (``SAT_OUTPUT_DIR`` set) whose Object Storage credentials are scoped to its run, a file
    under that run's output directory. Not trusted: ``CKPT_WEIGHTS_ONLY=1``; any other path
    (another run's, a shared directory, a download); anything when the training holds
    long-lived keys.
    """
    if weights_only_setting() is True:
        return False
    real = os.path.realpath(path)
    with _saved_lock:
        if real in _saved_here:
            return True
    output = os.environ.get(OUTPUT_DIR_ENV, "").strip()
    if not output or not _scoped_or_local():
        return False
    root = os.path.realpath(output)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def load_user_run_file(path: str, *, map_location: Any = None) -> Any:
    """An explicit ``load(path)`` under the DataStates-LLM API: ``weights_only`` first; a file in the
    user's own run prefix that holds other classes then loads fully, as upstream, with one warning."""
    import pickle

    global _warned
    setting = weights_only_setting()
    if setting is False:
        return load_torch_file(path, map_location=map_location, weights_only=False)
    try:
        return load_torch_file(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, UnreadableCheckpointError) as exc:
        refused = exc if isinstance(exc, pickle.UnpicklingError) else exc.__cause__
        if "Weights only load failed" not in str(refused) or not trusted_run_path(path):
            raise  # not a refusal of a class (or not the run's own file): as the safe load said
    if not _warned:
        _warned = True
        warnings.warn(f"{path}: loading with weights_only=False: it holds Python objects beyond tensors and "
                      f"the allow-listed types, and it is this run's own file (ADR 0038). Set "
                      f"{WEIGHTS_ONLY_ENV}=1 to load tensors and allow-listed types only.", UserWarning,
                      stacklevel=3)
    return load_torch_file(path, map_location=map_location, weights_only=False)
