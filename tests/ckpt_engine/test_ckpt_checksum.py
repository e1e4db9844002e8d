"""Per-file checksums: streaming and parallel computation agree; legacy whole-file checksums still verify."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import xxhash
from ckpt_helpers import flip_byte

from ckpt_engine import CheckpointEngine, verify_checkpoint
from ckpt_engine.errors import CheckpointNotFoundError
from ckpt_engine.manifest import (
    CHECKSUM_PREFIX,
    CHUNK_BYTES,
    LEGACY_CHECKSUM_PREFIX,
    MANIFEST_NAME,
    checksum_buffer,
    format_checksum,
    hash_file,
    new_hasher,
    split_for_ranks,
)
from ckpt_engine.storage import FileStorage, MemoryStorage

SIZES = [0, 1, 4097, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 2 * CHUNK_BYTES + 12345]


@pytest.mark.parametrize("size", SIZES)
def test_streaming_and_parallel_checksums_agree(size: int) -> None:
    data = os.urandom(size)
    expected = checksum_buffer(data)
    assert expected.startswith(CHECKSUM_PREFIX)
    for piece in (1 << 20, 3_000_001, CHUNK_BYTES + 7):  # pieces that straddle chunk boundaries
        hasher = new_hasher()
        for offset in range(0, size, piece):
            hasher.update(data[offset:offset + piece])
        assert format_checksum(hasher) == expected


def test_checksum_changes_with_one_flipped_byte_in_any_chunk() -> None:
    data = bytearray(os.urandom(2 * CHUNK_BYTES + 10))
    original = checksum_buffer(data)
    for position in (0, CHUNK_BYTES - 1, CHUNK_BYTES, len(data) - 1):
        data[position] ^= 0x01
        assert checksum_buffer(data) != original
        data[position] ^= 0x01
    assert checksum_buffer(data) == original
    # chunking is part of the value: moving bytes across a boundary changes it
    assert checksum_buffer(data[:-1]) != original


def test_hash_file_local_and_streamed_backends_agree(tmp_path: Path) -> None:
    data = os.urandom(CHUNK_BYTES + 99)
    local = FileStorage(tmp_path)
    writer = local.open_writer("f.bin")
    writer.write(data)
    writer.close()
    memory = MemoryStorage()
    memory.write_atomic("f.bin", data)
    assert hash_file(local, "f.bin") == hash_file(memory, "f.bin") == (len(data), checksum_buffer(data))
    legacy = f"{LEGACY_CHECKSUM_PREFIX}{xxhash.xxh3_64(data).hexdigest()}"
    assert hash_file(local, "f.bin", legacy) == hash_file(memory, "f.bin", legacy) == (len(data), legacy)


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_checkpoints_with_legacy_whole_file_checksums_still_load_and_verify(tmp_path: Path, backend: str) -> None:
    """A manifest written by the first release (one xxh3-64 per file) keeps working."""
    storage = FileStorage(tmp_path) if backend == "file" else MemoryStorage()
    engine = CheckpointEngine(storage, host_cache_size=0.01, keep_last=0)
    state = {"model": {"w": torch.arange(50_000, dtype=torch.float32)}}
    engine.save(3, state).wait()
    manifest = json.loads(storage.read_bytes(f"checkpoint-3/{MANIFEST_NAME}"))
    for name, entry in manifest["files"].items():
        entry["checksum"] = f"{LEGACY_CHECKSUM_PREFIX}{xxhash.xxh3_64(storage.read_bytes(f'checkpoint-3/{name}')).hexdigest()}"
    storage.write_atomic(f"checkpoint-3/{MANIFEST_NAME}", json.dumps(manifest).encode())
    assert verify_checkpoint(storage, "checkpoint-3").ok
    assert torch.equal(engine.load()["model"]["w"], state["model"]["w"])
    # and a wrong legacy value is still caught
    entry = next(iter(manifest["files"].values()))
    entry["checksum"] = f"{LEGACY_CHECKSUM_PREFIX}{'0' * 16}"
    storage.write_atomic(f"checkpoint-3/{MANIFEST_NAME}", json.dumps(manifest).encode())
    assert not verify_checkpoint(storage, "checkpoint-3").ok
    with pytest.raises(CheckpointNotFoundError, match="checksum"):
        engine.load()
    engine.close()


def test_retention_deletes_in_the_background_and_close_waits_for_it(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=0.01, keep_last=1)
    for step in (1, 2, 3):
        engine.save(step, {"model": {"w": torch.full((1000,), float(step))}}).wait()
    engine.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "progress.json"]


def test_ranks_verify_disjoint_shares_that_cover_every_file(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=0.05)
    state = {f"part{i}": {"w": torch.randn(1000 * (i + 1))} for i in range(7)} | {"meta": {"epoch": 3}}
    engine.save(5, state).wait()
    engine.close()
    files = verify_checkpoint(engine.storage, "checkpoint-5").manifest.files  # type: ignore[union-attr]
    world = 3
    reports = [verify_checkpoint(engine.storage, "checkpoint-5", share=(rank, world)) for rank in range(world)]
    assert all(report.ok for report in reports)
    hashed = [set(report.hashed) for report in reports]
    assert set().union(*hashed) == set(files) and sum(len(h) for h in hashed) == len(files)  # each file once
    loads = [sum(files[name].size for name in h) for h in hashed]
    assert all(hashed) and max(loads) - min(loads) <= max(entry.size for entry in files.values())
    assert split_for_ranks(files, world) == split_for_ranks(dict(reversed(files.items())), world)  # order-free

    victim = split_for_ranks(files, world)[1][0]  # a file rank 1 hashes
    path = tmp_path / "checkpoint-5" / victim
    flip_byte(path)
    verdicts = [verify_checkpoint(engine.storage, "checkpoint-5", share=(rank, world)) for rank in range(world)]
    assert [report.ok for report in verdicts] == [True, False, True]  # only its hasher sees a flipped byte...
    assert victim in verdicts[1].problems[0] and "checksum" in verdicts[1].problems[0]
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 1)
    assert not any(verify_checkpoint(engine.storage, "checkpoint-5", share=(rank, world)).ok
                   for rank in range(world))  # ...while every rank checks sizes
