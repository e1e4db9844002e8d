"""Core engine: save/load round trips, streaming through a small host cache, retention, progress.json."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

import ckpt_engine.stager as stager_module
import ckpt_engine.writer as writer_module
from ckpt_engine import CheckpointEngine, MemoryStorage, verify_checkpoint
from ckpt_engine.contract import PROGRESS_NAME
from ckpt_engine.errors import CheckpointNotFoundError
from ckpt_engine.storage import FileStorage, StorageWriter


def make_training_state(seed: int = 0, width: int = 64) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model whose Adam state is populated."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def assert_state_equal(left: object, right: object) -> None:
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    elif isinstance(left, dict):
        assert set(left) == set(right)  # type: ignore[arg-type]
        for key in left:
            assert_state_equal(left[key], right[key])  # type: ignore[index]
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)  # type: ignore[arg-type]
        for a, b in zip(left, right):  # type: ignore[call-overload]
            assert_state_equal(a, b)
    else:
        assert left == right


@pytest.mark.parametrize("lazy", [pytest.param(False, id="eager"), pytest.param(True, id="lazy")])
@pytest.mark.parametrize("backend", ["file", "memory"])
def test_save_load_round_trip(tmp_path: Path, backend: str, lazy: bool) -> None:
    root = str(tmp_path) if backend == "file" else MemoryStorage(f"rt-{lazy}")
    engine = CheckpointEngine(root, host_cache_size=0.01, parser_threads=2)
    model, optimizer = make_training_state()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7,
             "extra": {"bf16": torch.randn(5, dtype=torch.bfloat16), "ints": torch.arange(3), "note": "x"}}
    handle = engine.save(7, state, lazy=lazy)
    handle.wait_staged()
    record = handle.wait()
    assert record is not None and record.step == 7 and record.total_bytes > 0
    loaded = engine.load()
    assert_state_equal(state, loaded)
    assert verify_checkpoint(engine.storage, "checkpoint-7").ok
    engine.close()


def test_state_larger_than_host_cache_is_streamed(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=1 / 1024, parser_threads=2, slab_bytes=256 << 10)
    big = {f"t{i}": torch.randn(1 << 20) for i in range(4)}  # 16 MiB against a 1 MiB cache
    engine.save(1, {"model": big}).wait()
    assert engine.pool.peak_bytes <= 1 << 20
    assert_state_equal(big, engine.load()["model"])
    engine.close()


@pytest.fixture
def segment_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every segment the stager hands to a writer, in order."""
    sizes: list[int] = []
    real_segment = stager_module.Segment

    def recording_segment(*args: object) -> stager_module.Segment:
        segment = real_segment(*args)  # type: ignore[arg-type]
        sizes.append(segment.nbytes)
        return segment

    monkeypatch.setattr(stager_module, "Segment", recording_segment)
    return sizes


def test_first_slab_is_staged_in_short_segments(tmp_path: Path, segment_sizes: list[int]) -> None:
    """The writer gets 4 MiB pieces while the first slab fills, whole slab runs after; the bytes are exact."""
    engine = CheckpointEngine(tmp_path, host_cache_size=64 / 1024, slab_bytes=16 << 20)
    state = {f"t{i}": torch.randn((5 << 18) + 31 * i) for i in range(8)}  # ~40 MiB, odd sizes
    engine.save(1, {"model": state}).wait()
    assert_state_equal(state, engine.load()["model"])
    assert sum(segment_sizes) == sum(t.numel() * t.element_size() for t in state.values())
    staged = 0
    for size in segment_sizes:
        if staged >= 16 << 20:
            break
        assert size <= stager_module.FIRST_SEGMENT_BYTES  # the writer can start after 4 MiB
        staged += size
    assert max(segment_sizes) > stager_module.FIRST_SEGMENT_BYTES  # later slabs are not cut up
    engine.close()


def test_small_tensors_are_packed_into_shared_segments(tmp_path: Path, segment_sizes: list[int]) -> None:
    """Thousands of small tensors reach the writer as a few packed segments, across slab boundaries; exact bytes."""
    # 64 KiB slabs, 4 of them: packed runs straddle slab ends and slabs are recycled mid-file
    engine = CheckpointEngine(tmp_path, host_cache_size=256 / (1 << 20), slab_bytes=64 << 10)
    torch.manual_seed(0)
    dtypes = (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16)
    state: dict[str, torch.Tensor] = {}
    for i in range(3000):
        dtype = dtypes[i % len(dtypes)]
        state[f"small{i}"] = (torch.randn(1 + i % 37) * 100).to(dtype)
        if i % 500 == 0:
            state[f"large{i}"] = torch.randn(40_000 + i)  # ~160 KiB: own segments, over several slabs
    state["transposed"] = torch.randn(7, 5).t()  # not contiguous: copied through a contiguous view
    state["empty"] = torch.zeros(0)
    # a torch zip file too: the writer slices each record's bytes back out of the packed segments
    optimizer = {"state": {i: {"step": torch.tensor(float(i)), "exp_avg": torch.randn(1 + i % 50)} for i in range(1000)},
                 "param_groups": [{"lr": 0.1, "params": list(range(1000))}]}
    handle = engine.save(1, {"model": state, "optimizer": optimizer})
    handle.wait()
    loaded = engine.load()
    assert_state_equal({k: v.contiguous() for k, v in state.items()}, loaded["model"])
    assert_state_equal(optimizer, loaded["optimizer"])
    on_disk = safetensors.torch.load_file(tmp_path / "checkpoint-1" / "model.safetensors")
    assert_state_equal({k: v.contiguous() for k, v in state.items()}, on_disk)
    assert_state_equal(optimizer, torch.load(tmp_path / "checkpoint-1" / "optimizer.pt", weights_only=True))
    tensors = list(state.values()) + [t for entry in optimizer["state"].values() for t in entry.values()]
    blobs = sum(1 for t in tensors if t.numel())
    assert sum(segment_sizes) == sum(t.numel() * t.element_size() for t in tensors)
    assert len(segment_sizes) < blobs / 10, (len(segment_sizes), blobs)  # packed: one segment per ~1 MiB run or slab end
    assert engine.pool.allocated_bytes <= 256 << 10  # the pool bound held
    engine.close()


def test_tensor_larger_than_cache_and_shared_storage(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=1 / 1024, slab_bytes=128 << 10)
    base = torch.randn(3 << 18)  # 3 MiB, one tensor bigger than the whole cache
    state = {"views": {"whole": base, "half": base[: base.numel() // 2]}}
    engine.save(2, state).wait()
    loaded = engine.load()["views"]
    assert torch.equal(loaded["whole"], base) and torch.equal(loaded["half"], state["views"]["half"])
    assert loaded["half"].untyped_storage().data_ptr() == loaded["whole"].untyped_storage().data_ptr()
    engine.close()


def test_retention_and_progress_json(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, keep_last=2)
    model, _ = make_training_state()
    for step in (10, 20, 30, 40):
        engine.record_step(step)
        engine.save(step, {"model": model.state_dict()}, lazy=True)
    engine.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-30", "checkpoint-40", PROGRESS_NAME]
    progress = json.loads((tmp_path / PROGRESS_NAME).read_text())
    assert progress["last_committed_step"] == 40 and progress["committed_steps"] == [40, 30]
    assert progress["step"] == 40 and progress["in_flight_step"] is None
    assert "T" in progress["updated_at"] and progress["updated_at"].endswith("+00:00")
    assert {"blocking_s", "stage_s", "persist_s", "commit_s"} <= set(progress["timings"])
    engine.close()


def test_second_save_waits_for_previous_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = CheckpointEngine(tmp_path, max_in_flight=1)
    state = {"model": {"w": torch.randn(1 << 20)}}
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        first = engine.save(1, state, lazy=True)
        engine.save(2, state, lazy=True)
    assert first.done()
    engine.wait()
    assert any("waited" in r.getMessage() and "checkpoint-2" in r.getMessage() for r in caplog.records) or \
        engine.records[1].waited_for_previous_s >= 0
    engine.close()


def test_load_specific_step_and_missing(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, keep_last=0)
    for step in (1, 2):
        engine.save(step, {"meta": {"step": step}})
    engine.wait()
    assert engine.load(1)["meta"] == {"step": 1}
    assert engine.load()["meta"] == {"step": 2}
    with pytest.raises(CheckpointNotFoundError):
        engine.load(5)
    engine.close()


def test_a_step_saved_twice_in_a_run_is_skipped_and_one_of_an_earlier_run_replaced(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = CheckpointEngine(tmp_path, host_cache_size=0.05)
    first.save(6, {"w": torch.zeros(4)}).wait()
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        first.save(6, {"w": torch.ones(4)}).wait()  # e.g. SIGTERM's final save right after the periodic one
    assert "checkpoint-6 already committed; not saving it again" in caplog.text
    first.close()
    assert torch.equal(CheckpointEngine(tmp_path).load()["w"], torch.zeros(4))
    # a new run that resumed behind checkpoint-6 (it was corrupt, or CKPT_LAST_STEP=3) reaches step 6 again:
    # its own state replaces the old one instead of being dropped as "already committed"
    second = CheckpointEngine(tmp_path, host_cache_size=0.05)
    second.save(6, {"w": torch.full((4,), 2.0)}).wait()
    second.close()
    assert torch.equal(CheckpointEngine(tmp_path).load(6)["w"], torch.full((4,), 2.0))
    assert verify_checkpoint(second.storage, "checkpoint-6").ok


def test_stale_temporary_directories_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-checkpoint-9-deadbeef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    CheckpointEngine(tmp_path).close()
    assert not stale.exists()


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CheckpointEngine(tmp_path, on_error="ignore")
    engine = CheckpointEngine(tmp_path)
    with pytest.raises(ValueError, match="file name"):
        engine.save(1, {"../escape": 1})
    engine.close()


@pytest.mark.gpu
def test_cuda_state_is_staged_on_a_side_stream_into_pinned_buffers(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=0.01, slab_bytes=1 << 20, pin_host_cache=True)
    weights = torch.randn(1 << 21, device="cuda")  # 8 MiB through a 10 MiB pinned pool
    state = {"w": weights, "transposed": torch.randn(64, 32, device="cuda").t(),  # made contiguous on the side stream
             "bias": torch.randn(3, device="cuda"), "host": torch.randn(5)}
    expected = {key: value.cpu().contiguous() for key, value in state.items()}
    handle = engine.save(1, {"model": state}, lazy=True)
    handle.wait_staged()
    for value in state.values():
        value.add_(1.0)  # the optimizer may step once staging is done
    handle.wait()
    assert engine.pool.pin
    assert_state_equal(expected, engine.load()["model"])
    engine.close()


def test_progress_writes_do_not_fsync_and_a_commit_fsyncs_data_manifest_and_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """progress.json is rewritten every quarter second by the training thread: atomic, never fsynced."""
    calls: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real_fsync(fd))
    engine = CheckpointEngine(tmp_path, keep_last=1)
    engine._progress_written_at = 0.0
    engine.record_step(5)
    assert json.loads((tmp_path / PROGRESS_NAME).read_text())["step"] == 5 and calls == []
    engine.save(1, {"model": {"w": torch.ones(10)}}).wait()
    first = len(calls)
    # one data file + manifest (file, directory) + the rename (source, parent)
    assert first == 5
    engine.save(2, {"model": {"w": torch.ones(10)}}).wait()
    engine.wait()
    assert len(calls) - first == 5  # retention's move-aside and delete add none
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", PROGRESS_NAME]
    engine.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("priority", ["idle", "nice", "normal"])
def test_writer_commit_and_retention_threads_run_below_the_training_threads(tmp_path: Path, priority: str) -> None:
    """ADR 0030: the background threads yield the CPU to training; staging, which training may wait for, does not."""
    engine = CheckpointEngine(tmp_path, keep_last=1, background_priority=priority)
    engine.save(1, {"model": {"w": torch.ones(10)}}, lazy=True).wait()
    engine.save(2, {"model": {"w": torch.ones(10)}}).wait()  # retention: the janitor thread runs too
    engine.wait()
    background = [thread for pool in (engine._writers, engine._committer, engine._janitor) for thread in pool._threads]
    assert len(background) == 3
    for thread in background:
        policy, nice = os.sched_getscheduler(thread.native_id), os.getpriority(os.PRIO_PROCESS, thread.native_id)
        expected = {"idle": (os.SCHED_IDLE, 0), "nice": (os.SCHED_OTHER, 19),
                    "normal": (os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, 0))}[priority]
        assert (policy, nice if priority != "idle" else 0) == expected, thread.name
    (stager,) = engine._stager._threads
    for thread in (stager,):
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == os.getpriority(os.PRIO_PROCESS, 0)
    engine.close()


def test_an_unknown_background_priority_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"background_priority must be one of \('idle', 'nice', 'normal'\)"):
        CheckpointEngine(tmp_path, background_priority="low")


class _RecordingStorage(FileStorage):
    """Records the size of every write a data file gets."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: dict[str, list[int]] = {}

    def open_writer(self, key: str) -> StorageWriter:
        inner, sizes = super().open_writer(key), self.writes.setdefault(key.rsplit("/", 1)[-1], [])

        class Recording(StorageWriter):
            def write(self, data: bytes | memoryview) -> None:
                sizes.append(memoryview(data).nbytes)
                inner.write(data)

            def close(self) -> None:
                inner.close()

            def abort(self) -> None:
                inner.abort()

        return Recording()


def test_staged_bytes_are_hashed_in_pieces_and_written_in_whole_runs(tmp_path: Path, segment_sizes: list[int],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderer and the checksum read 1 MiB pieces (cache-sized); the disk gets one write per staged segment."""
    pieces: list[int] = []
    real_stage = writer_module._HashingSink.stage
    monkeypatch.setattr(writer_module._HashingSink, "stage",
                        lambda sink, slab, offset, piece: pieces.append(len(piece)) or real_stage(sink, slab, offset, piece))
    storage = _RecordingStorage(tmp_path)
    engine = CheckpointEngine(storage, host_cache_size=64 / 1024, slab_bytes=16 << 20)
    model = {"a": torch.randn(3 << 20), "b": torch.randn(5 << 18)}  # 12 MiB + 5 MiB
    optimizer = {"state": {0: {"exp_avg": torch.randn(3 << 20)}}, "param_groups": [{"params": [0]}]}  # a zip record
    engine.save(1, {"model": model, "optimizer": optimizer}).wait()
    loaded = engine.load()  # verifies every file's checksum
    assert_state_equal(model, loaded["model"])
    assert_state_equal(optimizer, loaded["optimizer"])
    assert_state_equal(optimizer, torch.load(tmp_path / "checkpoint-1" / "optimizer.pt", weights_only=True))
    assert max(pieces) == writer_module.PIECE_BYTES and sum(pieces) == sum(segment_sizes)
    model_bytes = 17 << 20
    model_segments, staged = [], 0
    while staged < model_bytes:
        model_segments.append(segment_sizes[len(model_segments)])
        staged += model_segments[-1]
    optimizer_segments = segment_sizes[len(model_segments):]
    for name, segments in (("model.safetensors", model_segments), ("optimizer.pt", optimizer_segments)):
        sizes = storage.writes[name]
        assert sum(sizes) == (tmp_path / "checkpoint-1" / name).stat().st_size
        assert [size for size in sizes if size > 64 << 10] == segments, name  # headers and pickles are small
    engine.close()
