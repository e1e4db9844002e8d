"""Restore a safetensors checkpoint file straight into existing tensors, verified in the same pass.

``CheckpointEngine.load()`` reads and verifies a file, then returns tensors that the
caller copies into its model (``load_state_dict``): two passes over the bytes. When the
destination tensors are known (``CheckpointEngine.load_into``), this module does one:
every 16 MiB checksum chunk of the file is handled by one hash-pool thread, which copies
the chunk's tensor bytes 256 KiB at a time into their destination and hashes the copied
piece while it is still in the CPU cache (header and padding bytes are hashed from the
file). The combined digest is compared with the manifest's afterwards; on a mismatch
the destination holds a mix of old and new values and the caller must load another
checkpoint (``load_into`` falls back to the next older verified one by itself).
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from ckpt_engine.errors import CorruptCheckpointError
from ckpt_engine.formats import DTYPES_BY_NAME
from ckpt_engine.manifest import CHECKSUM_PREFIX, CHUNK_BYTES, FileEntry, hash_pool, prefault

_PIECE = 256 << 10  # copy, then hash, this much at a time: it is still in L2 when hashed


@dataclass(frozen=True)
class _Region:
    """Bytes ``[start, end)`` of the file; ``target`` is the address they are copied to (0: hash only)."""

    start: int
    end: int
    target: int


def fused_plan(path: str, size: int, targets: Mapping[str, torch.Tensor]) -> list[_Region] | None:
    """Regions covering the whole file, or None when the file does not match ``targets`` exactly.

    A match: the same tensor names, dtypes and shapes, every target a contiguous CPU tensor
    that shares memory with no other target.
    """
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return None
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8:
            return None
        try:
            header = json.loads(handle.read(header_len))
        except ValueError:
            return None
    header.pop("__metadata__", None)
    if set(header) != set(targets):
        return None
    base = 8 + header_len
    regions: list[_Region] = []
    seen: set[int] = set()
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        tensor = targets[name]
        dtype = DTYPES_BY_NAME.get(info.get("dtype"))
        if dtype is None or tensor.dtype != dtype or list(tensor.shape) != list(info["shape"]):
            return None
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            return None
        begin, end = (base + offset for offset in info["data_offsets"])
        if end - begin != tensor.numel() * tensor.element_size():
            return None
        if end > begin:
            pointer = tensor.data_ptr()
            if pointer in seen:
                return None
            seen.add(pointer)
            regions.append(_Region(begin, end, pointer))
    # fill the gaps (header, padding) with hash-only regions so the regions tile the file
    tiled: list[_Region] = []
    position = 0
    for region in regions:
        if region.start < position:
            return None  # overlapping tensors: not a file we wrote
        if region.start > position:
            tiled.append(_Region(position, region.start, 0))
        tiled.append(region)
        position = region.end
    if position > size:
        return None
    if position < size:
        tiled.append(_Region(position, size, 0))
    return tiled


def _bytes_at(address: int, count: int) -> memoryview:
    return memoryview((ctypes.c_char * count).from_address(address)).cast("B")


def copy_verified(path: str, entry: FileEntry, regions: list[_Region]) -> None:
    """Copy the tensor bytes of ``path`` to the regions' targets; raise if the checksum differs."""
    if not entry.checksum.startswith(CHECKSUM_PREFIX):
        raise ValueError("fused restore needs a chunked checksum")
    source = np.memmap(path, dtype=np.uint8, mode="r") if entry.size else np.empty(0, dtype=np.uint8)
    source_view = memoryview(source)
    source_address = source.ctypes.data if entry.size else 0

    def chunk_digest(chunk_start: int) -> bytes:
        chunk_end = min(chunk_start + CHUNK_BYTES, entry.size)
        hasher = xxhash.xxh3_64()
        prefault(source_view[chunk_start:chunk_end])
        for region in regions:
            start, end = max(region.start, chunk_start), min(region.end, chunk_end)
            if start >= end:
                continue
            if not region.target:
                hasher.update(source_view[start:end])
                continue
            for piece in range(start, end, _PIECE):
                count = min(_PIECE, end - piece)
                destination = region.target + (piece - region.start)
                ctypes.memmove(destination, source_address + piece, count)
                hasher.update(_bytes_at(destination, count))
        return hasher.digest()

    digests = list(hash_pool().map(chunk_digest, range(0, max(entry.size, 1), CHUNK_BYTES)))
    del source_view
    checksum = f"{CHECKSUM_PREFIX}{xxhash.xxh3_64(b''.join(digests)).hexdigest()}"
    if checksum != entry.checksum:
        raise CorruptCheckpointError(f"{os.path.basename(path)}: checksum mismatch")
