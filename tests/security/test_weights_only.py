"""Issue 29.2: a planted checkpoint file runs no code in the training that loads it (weights_only, ADR 0020).

The planted file's pickle would create a marker file when unpickled; every load path of the
engine (its own reader, the DataStates and DeepSpeed adapters' `load`) refuses it, unless the
job opts out with `CKPT_WEIGHTS_ONLY=0`.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_engine.contract import WEIGHTS_ONLY_ENV
from ckpt_engine.engine import decode_file
from ckpt_engine.integrations.state_files import BaseCheckpointEngine
from ckpt_engine.sniff import load_torch_file


class _Planted:
    """Unpickled, it creates `marker` (any code could run in its place)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def planted(tmp_path) -> tuple[Path, Path]:
    marker = tmp_path / "code-ran"
    path = tmp_path / "optimizer.pt"
    torch.save({"state": {}, "param_groups": [], "extra": _Planted(marker)}, path)
    return path, marker


LOADERS = [
    pytest.param(lambda path: load_torch_file(str(path)), id="sniff-load_torch_file"),
    pytest.param(lambda path: decode_file(path.name, np.frombuffer(path.read_bytes(), dtype=np.uint8)),
                 id="engine-decode_file"),
    pytest.param(lambda path: BaseCheckpointEngine().load(str(path)), id="datastates-engine-load"),
]


@pytest.mark.parametrize("load", LOADERS)
def test_a_planted_pickle_is_refused_and_runs_nothing(planted, load, monkeypatch):
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    path, marker = planted
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load(path)
    assert not marker.exists(), "unpickling the planted file ran its code"


def test_the_deepspeed_adapters_load_weights_only(planted, monkeypatch):
    """DeepSpeed's resume reads its model and optimizer states through these `load`s (was weights_only=False)."""
    pytest.importorskip("deepspeed")
    from ckpt_engine.integrations.deepspeed import (
        DataStatesEngine,
        _collecting_engine_class,
    )

    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    path, marker = planted
    datastates = DataStatesEngine()
    try:
        for engine in (datastates, _collecting_engine_class()(str(path.parent))):
            with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
                engine.load(str(path))
    finally:
        datastates.shutdown()
    assert not marker.exists()


def test_a_job_that_opts_out_loads_any_pickle(planted, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ONLY_ENV, "0")
    path, marker = planted
    load_torch_file(str(path))
    assert marker.exists(), "with CKPT_WEIGHTS_ONLY=0 the file is fully unpickled (the job trusts it)"


def test_what_trainers_save_still_loads_weights_only(tmp_path, monkeypatch):
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng},
               tmp_path / "state.pt")
    loaded = load_torch_file(str(tmp_path / "state.pt"))
    assert torch.equal(loaded["model"]["weight"], model.state_dict()["weight"])
    assert loaded["optimizer"]["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert np.array_equal(loaded["rng"]["numpy"][1], np.random.get_state()[1])
