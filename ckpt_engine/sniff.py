"""Say what an unreadable checkpoint file is and what to do, instead of a bare unpickling error.

:func:`load_torch_file` is the one place the engine's readers (``decode_file``, the
DeepSpeed and DataStates adapters) turn a ``torch.save`` file into objects; when that
fails, :func:`explain_unreadable` looks at the file's first bytes and names what it
looks like: DataStates-LLM's own format (an 8-byte little-endian header length, then a
JSON header with ``datastates_metadata``), safetensors, a truncated zip, a bare pickle,
an empty file. (A ``manifest.json`` from a newer SAT: ``ckpt_engine.contract.check_manifest_format``.)
"""

from __future__ import annotations

import io
import json
import os
import struct
from typing import Any

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


def load_torch_file(source: str | bytes | memoryview, *, name: str | None = None, map_location: Any = None,
                    weights_only: bool = False) -> Any:
    """``torch.load`` of a path or of bytes; an unreadable file raises UnreadableCheckpointError saying why."""
    import pickle
    import zipfile

    import torch

    label = name or (source if isinstance(source, str) else "<bytes>")
    try:
        if isinstance(source, str):
            return torch.load(source, map_location=map_location, weights_only=weights_only)
        return torch.load(io.BytesIO(source), map_location=map_location, weights_only=weights_only)
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, RuntimeError, ValueError, struct.error) as exc:
        if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc):
            raise  # a readable file refused by weights_only: torch's own message says what to do
        if isinstance(source, str):
            raise explain_unreadable(source, exc) from exc
        data = bytes(source[:_HEAD_BYTES])
        raise explain_bytes(str(label), data, len(source), exc) from exc
