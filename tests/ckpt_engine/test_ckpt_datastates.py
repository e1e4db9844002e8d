"""The ``datastates.CheckpointEngine`` DeepSpeed loads: save stages and returns, wait makes files durable."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from ckpt_engine.integrations.deepspeed import DataStatesEngine
from ckpt_engine.errors import PersistError


def test_save_wait_load(tmp_path: Path) -> None:
    engine = DataStatesEngine({"datastates_ckpt": {"host_cache_size": 0.001, "parser_threads": 2}}, rank=0)
    weights = torch.randn(1 << 18)
    expected = weights.clone()
    target = tmp_path / "global_step1" / "mp_rank_00_model_states.pt"
    target.parent.mkdir()
    engine.save({"module": {"w": weights}, "step": 1}, str(target))
    weights.add_(1.0)  # DeepSpeed may step right after save() returns: the staged copy is what is written
    assert engine.wait(persist=True)
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary left behind
    loaded = engine.load(str(target), map_location="cpu")
    assert torch.equal(loaded["module"]["w"], expected) and loaded["step"] == 1


def test_failed_write_raises_on_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = DataStatesEngine(None, rank=0)
    real_replace = __import__("os").replace

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr("ckpt_engine.integrations.deepspeed.os.replace", failing_replace)
    engine.save({"w": torch.ones(4)}, str(tmp_path / "x.pt"))
    with pytest.raises(PersistError):
        engine.wait(persist=True)
    monkeypatch.setattr("ckpt_engine.integrations.deepspeed.os.replace", real_replace)
    assert not list(tmp_path.iterdir())
