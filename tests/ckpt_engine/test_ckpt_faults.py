"""Corruption and storage faults: detected, reported, the previous checkpoint stays usable."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch
from ckpt_helpers import flip_byte

from ckpt_engine import CheckpointEngine, FaultyStorage, FileStorage, PersistError, verify_checkpoint


def corrupt_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def corrupt_missing_manifest(path: Path) -> None:
    (path.parent / "manifest.json").unlink()


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> CheckpointEngine:
    engine = CheckpointEngine(tmp_path, keep_last=0)
    for step in (1, 2):
        engine.save(step, {"model": {"w": torch.full((4096,), float(step))}, "meta": {"step": step}})
    engine.wait()
    return engine


@pytest.mark.parametrize("corrupt", [pytest.param(flip_byte, id="flipped-byte"),
                                     pytest.param(corrupt_truncate, id="truncated"),
                                     pytest.param(corrupt_missing_manifest, id="missing-manifest")])
def test_corrupt_newest_is_reported_and_skipped(tmp_path: Path, two_checkpoints: CheckpointEngine, corrupt,
                                               caplog: pytest.LogCaptureFixture) -> None:
    corrupt(tmp_path / "checkpoint-2" / "model.safetensors")
    report = verify_checkpoint(two_checkpoints.storage, "checkpoint-2")
    assert not report.ok and report.problems
    with caplog.at_level(logging.WARNING, logger="ckpt_engine"):
        state = two_checkpoints.load()
    assert state["meta"] == {"step": 1}
    assert any("checkpoint-2" in r.getMessage() for r in caplog.records)
    assert two_checkpoints.find_checkpoint().step == 1
    two_checkpoints.close()


class UnreadableStorage(FileStorage):
    """A disk whose blocks under ``bad`` fail with EIO when read (a failing drive, a broken network mount)."""

    def __init__(self, root: Path, bad: str, *, bad_manifest: bool = False) -> None:
        super().__init__(str(root))
        self.bad, self.bad_manifest = bad, bad_manifest

    def local_path(self, key: str) -> str | None:
        return None if key.startswith(self.bad) else super().local_path(key)

    def open_reader(self, key: str):  # type: ignore[no-untyped-def]
        if key.startswith(self.bad) and not key.endswith("manifest.json"):
            raise OSError(errno.EIO, "Input/output error")
        return super().open_reader(key)

    def read_bytes(self, key: str) -> bytes:
        if key.startswith(self.bad) and key.endswith("manifest.json") and self.bad_manifest:
            raise OSError(errno.EIO, "Input/output error")
        return super().read_bytes(key)


@pytest.mark.parametrize("bad_manifest", [False, True], ids=["data", "manifest"])
def test_unreadable_newest_is_reported_and_skipped(tmp_path: Path, two_checkpoints: CheckpointEngine,
                                                   caplog: pytest.LogCaptureFixture, bad_manifest: bool) -> None:
    two_checkpoints.close()
    engine = CheckpointEngine(UnreadableStorage(tmp_path, "checkpoint-2/", bad_manifest=bad_manifest), keep_last=0)
    report = verify_checkpoint(engine.storage, "checkpoint-2")
    assert not report.ok and any("could not be read" in problem and "Input/output error" in problem
                                 for problem in report.problems), report.problems
    with caplog.at_level(logging.WARNING, logger="ckpt_engine"):
        state = engine.load()  # a resume falls back to the checkpoint before, as for a corrupt one
    assert state["meta"] == {"step": 1}
    assert any("checkpoint-2" in r.getMessage() and "Input/output error" in r.getMessage() for r in caplog.records)
    assert engine.find_checkpoint().step == 1
    engine.close()


@pytest.mark.parametrize("code", [pytest.param(errno.ENOSPC, id="ENOSPC"), pytest.param(errno.EIO, id="EIO")])
def test_persist_failure_keeps_previous_and_training_goes_on(tmp_path: Path, code: int,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    storage = FaultyStorage(FileStorage(tmp_path))
    engine = CheckpointEngine(storage, on_error="continue", slab_bytes=64 << 10)
    state = {"model": {"w": torch.randn(1 << 18)}}
    engine.save(1, state).wait()
    storage.arm(error=code, after_bytes=100_000)
    with caplog.at_level(logging.ERROR, logger="ckpt_engine"):
        failed = engine.save(2, state)
        with pytest.raises(PersistError):
            failed.wait()
        engine.wait()  # on_error="continue": no exception here
    assert storage.failures >= 1
    assert any("checkpoint-2 failed" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("checkpoint", ".tmp"))) == ["checkpoint-1"]
    assert engine.progress.last_committed_step == 1 and "checkpoint-2" in (engine.progress.last_error or "")
    storage.disarm()
    engine.save(3, state).wait()  # the engine recovers once storage does
    assert engine.find_checkpoint().step == 3
    engine.close()


def test_on_error_raise_stops_training_with_clear_error(tmp_path: Path) -> None:
    storage = FaultyStorage(FileStorage(tmp_path))
    engine = CheckpointEngine(storage, on_error="raise")
    state = {"model": {"w": torch.randn(1 << 16)}}
    engine.save(1, state).wait()
    storage.arm(error=errno.ENOSPC)
    engine.save(2, state, lazy=True)
    with pytest.raises(PersistError, match="No space left"):
        engine.wait()
    assert engine.load()["model"]["w"].shape == (1 << 16,)
    engine.close()


def test_failure_in_manifest_write_discards_checkpoint(tmp_path: Path) -> None:
    storage = FaultyStorage(FileStorage(tmp_path))
    engine = CheckpointEngine(storage)
    state = {"meta": {"step": 1}}
    engine.save(1, state).wait()
    storage.arm(error=errno.EIO, after_bytes=10_000_000 - 1)  # data fits, then the manifest write fails
    storage.after_bytes = sum(p.stat().st_size for p in (tmp_path / "checkpoint-1").iterdir()
                              if p.name != "manifest.json")
    with pytest.raises(PersistError):
        engine.save(2, {"meta": {"step": 2}}).wait()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint")] == ["checkpoint-1"]
    engine.close()


@pytest.mark.parametrize("lazy", [pytest.param(False, id="eager"), pytest.param(True, id="lazy")])
def test_failure_while_staging_releases_the_writers(tmp_path: Path, lazy: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A staging error (here: the pool, mid-state) fails that checkpoint only; no writer is left waiting."""
    from ckpt_engine.pool import HostBufferPool

    engine = CheckpointEngine(tmp_path, host_cache_size=128 / (1 << 20), slab_bytes=64 << 10)
    state = {"model": {"w": torch.randn(100_000), "b": torch.randn(7)}, "optimizer": {"m": [torch.randn(50_000)]}}
    engine.save(1, state).wait(timeout=60)
    real_acquire, calls = HostBufferPool.acquire, [0]

    def failing_acquire(self: HostBufferPool) -> object:
        calls[0] += 1
        if calls[0] == 3:  # after the first file's writer has started on staged segments
            raise RuntimeError("staging broke")
        return real_acquire(self)

    monkeypatch.setattr(HostBufferPool, "acquire", failing_acquire)
    if lazy:
        handle = engine.save(2, state, lazy=True)
        with pytest.raises(RuntimeError, match="staging broke"):
            handle.wait_staged(timeout=60)
    else:
        with pytest.raises(RuntimeError, match="staging broke"):
            engine.save(2, state)
        handle = engine._in_flight[-1]
    with pytest.raises(PersistError):
        handle.wait(timeout=60)  # before the fix the writers waited forever for segments
    monkeypatch.setattr(HostBufferPool, "acquire", real_acquire)
    engine.wait(timeout=60)
    assert engine.pool.allocated_bytes == sum(slab.capacity for slab in engine.pool._free)  # every slab came back
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("checkpoint", ".tmp"))) == ["checkpoint-1"]
    engine.save(3, state).wait(timeout=60)
    assert torch.equal(engine.load()["model"]["w"], state["model"]["w"])
    engine.close()
