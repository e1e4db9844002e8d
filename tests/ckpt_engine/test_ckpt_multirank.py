"""Multi-rank commit: fake ranks (engines in one process) for the protocol."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch

from ckpt_engine import CheckpointEngine, FaultyStorage
from ckpt_engine.formats import BytesFile, plan_torch_file
from ckpt_engine.multirank import MARKER_DIR, RankCoordinator, RankMarker, marker_key
from ckpt_helpers import read_progress

TOKEN = "0123abcd"


class DataFault(FaultyStorage):
    """Fails only the data files: the small failure marker still gets through."""

    def write_atomic(self, key: str, data: bytes) -> None:
        self.inner.write_atomic(key, data)


def fake_ranks(root: Path, world_size: int = 2, timeout_s: float = 1.0) -> list[CheckpointEngine]:
    """One engine per rank over a shared root, as DecoratedCheckpointing sets them up."""
    engines = []
    for rank in range(world_size):
        engine = CheckpointEngine(str(root), rank=rank, clean_stale=rank == 0, keep_last=2, host_cache_size=0.01)
        engine.coordinator = RankCoordinator(rank, world_size, TOKEN, timeout_s=timeout_s, poll_s=0.02)
        engines.append(engine)
    return engines


def rank_files(rank: int, step: int) -> list:
    return [plan_torch_file(f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                            {"shard": torch.full((1000,), float(rank + step))}),
            BytesFile(name=f"rng_state_{rank}.pth", data=f"rng {rank}".encode())]


def save_all(engines: list[CheckpointEngine], step: int, ranks: list[int] | None = None) -> list:
    handles = []
    for rank, engine in enumerate(engines):
        engine.coordinator.next_save()  # every rank counts every save, as the Trainer hook does
        if ranks is None or rank in ranks:
            handles.append(engine.save_files(step, rank_files(rank, step), layout="hf"))
    return handles


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_all_ranks_commit_one_checkpoint(tmp_path: Path) -> None:
    engines = fake_ranks(tmp_path)
    for step in (2, 4, 6):
        save_all(engines, step)
        for engine in reversed(engines):  # rank 1 first: rank 0's commit thread waits for its marker
            engine.wait()
    assert names(tmp_path) == ["checkpoint-4", "checkpoint-6", "progress.json"]  # retention: rank 0, keep 2
    manifest = json.loads((tmp_path / "checkpoint-6" / "manifest.json").read_text())
    assert set(manifest["files"]) == {f"global_step6/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} \
        | {"rng_state_0.pth", "rng_state_1.pth"}
    assert manifest["metadata"]["world_size"] == 2
    assert manifest["metadata"]["ranks"]["1"] == ["global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                                 "rng_state_1.pth"]
    assert not (tmp_path / "checkpoint-6" / MARKER_DIR).exists()
    loaded = engines[0].find_checkpoint()  # verifies every file's checksum
    assert loaded.step == 6
    assert read_progress(tmp_path)["last_committed_step"] == 6
    for engine in engines:
        engine.close()


@pytest.mark.parametrize("fault", ["missing", "corrupt", "foreign-run", "rank-failed"])
def test_incomplete_rank_set_is_never_promoted(tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture) -> None:
    engines = fake_ranks(tmp_path, timeout_s=1.0 if fault == "missing" else 30.0)
    save_all(engines, 2)
    for engine in reversed(engines):
        engine.wait()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        if fault == "missing":  # rank 1 died before its marker
            save_all(engines, 4, ranks=[0])
        elif fault == "rank-failed":  # rank 1's disk fills up: it reports the failure, rank 0 stops waiting
            engines[1].storage = DataFault(engines[1].storage)
            engines[1].storage.arm()
            save_all(engines, 4)
            engines[1].wait()
        else:
            engines[1].coordinator.next_save()
            engines[1].save_files(4, rank_files(1, 4), layout="hf").wait()
            key = tmp_path / marker_key(engines[1].coordinator.temp_dir(4), 1)
            if fault == "corrupt":
                key.write_bytes(key.read_bytes().replace(b'"size": ', b'"size": 1'))
            else:  # a marker left by another run with the same step
                marker = RankMarker.from_json(key.read_bytes())
                marker.token = "ffff0000"
                key.write_bytes(marker.to_json())
            engines[0].coordinator.next_save()
            engines[0].save_files(4, rank_files(0, 4), layout="hf")
        engines[0].wait()
    elapsed = time.monotonic() - started
    assert names(tmp_path) == ["checkpoint-2", "progress.json"]  # not promoted; the temp dir discarded
    assert engines[0].find_checkpoint().step == 2  # the previous one stays usable
    assert read_progress(tmp_path)["last_committed_step"] == 2
    expected = {"missing": "no marker from rank(s) [1] within 1s", "corrupt": "marker is corrupt",
                "foreign-run": "run ffff0000", "rank-failed": "rank 1 failed to write its part"}[fault]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("checkpoint-4 failed and was discarded" in m and expected in m for m in errors), errors
    if fault != "missing":
        assert elapsed < 10  # no waiting for the timeout
    # the next checkpoint of the same run commits again
    if fault == "rank-failed":
        engines[1].storage.disarm()
    save_all(engines, 6)
    for engine in reversed(engines):
        engine.wait()
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-6", "progress.json"]
    for engine in engines:
        engine.close()


def test_non_zero_rank_deletes_promotes_and_reports_nothing(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-1").mkdir()  # retention and stale cleanup are rank 0's
    (tmp_path / ".tmp-checkpoint-0-old").mkdir()
    engine = CheckpointEngine(str(tmp_path), rank=1, clean_stale=False, keep_last=1, host_cache_size=0.01)
    engine.coordinator = RankCoordinator(1, 2, TOKEN)
    engine.coordinator.next_save()
    assert engine.save_files(3, rank_files(1, 3)).wait() is None
    engine.record_step(3)
    tmp = engine.coordinator.temp_dir(3)
    assert names(tmp_path) == [".tmp-checkpoint-0-old", tmp, "checkpoint-1"]
    assert (tmp_path / marker_key(tmp, 1)).exists()
    engine.close()
