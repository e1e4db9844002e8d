"""Issue 29.2: a planted checkpoint file runs no code in the training that loads it (weights_only, ADR 0020).

The planted file's pickle would create a marker file when unpickled; every load path of the
engine (its own reader, the DataStates and DeepSpeed adapters' `load`) refuses it, unless the
job opts out with `CKPT_WEIGHTS_ONLY=0`.

Issue 47.1 (ADR 0038): an explicit DataStates `load` of a file in the run's own prefix loads it
as upstream does; the engine's automatic resume still refuses a planted `__reduce__` there,
and `CKPT_WEIGHTS_ONLY=1` makes the DataStates load refuse it too.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_engine import sniff
from ckpt_engine.contract import CONCURRENT_DIR, OUTPUT_DIR_ENV, WEIGHTS_ONLY_ENV
from ckpt_engine.engine import CheckpointEngine, decode_file
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
    monkeypatch.delenv(OUTPUT_DIR_ENV, raising=False)  # not in a run's prefix: nothing is trusted
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
    monkeypatch.delenv(OUTPUT_DIR_ENV, raising=False)
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


def test_the_automatic_resume_runs_no_planted_reduce_even_in_the_runs_own_prefix(tmp_path, monkeypatch):
    """The engine's resume (engine.load -> decode_file) never trusts a file, wherever it lies."""
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(tmp_path))  # the run's own prefix: trusted for DataStates loads
    marker = tmp_path / "code-ran"
    engine = CheckpointEngine(str(tmp_path / CONCURRENT_DIR), keep_last=0)
    try:
        engine.save(3, {"model": {"w": torch.ones(4)}, "extra": {"note": _Planted(marker)}}).wait()
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            engine.load()
    finally:
        engine.close()
    assert not marker.exists(), "the automatic resume ran the planted pickle"


def test_a_datastates_load_in_the_runs_prefix_loads_as_upstream_and_warns_once(planted, monkeypatch):
    path, marker = planted
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(path.parent))
    monkeypatch.setattr(sniff, "_warned", False)
    engine = BaseCheckpointEngine()
    try:
        with pytest.warns(UserWarning, match=f"weights_only=False.*{WEIGHTS_ONLY_ENV}=1") as caught:
            [engine.load(str(path)) for _ in range(2)]
    finally:
        engine.shutdown()
    assert len([w for w in caught if "weights_only=False" in str(w.message)]) == 1
    assert marker.exists(), "the user's own run file loads fully (ADR 0038): the trust the opt-out removes"


def test_weights_only_forced_refuses_the_runs_own_file_too(planted, monkeypatch):
    path, marker = planted
    monkeypatch.setenv(WEIGHTS_ONLY_ENV, "1")
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(path.parent))
    engine = BaseCheckpointEngine()
    try:
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            engine.load(str(path))
    finally:
        engine.shutdown()
    assert not marker.exists()


def test_a_file_outside_the_runs_prefix_is_not_trusted(planted, tmp_path, monkeypatch):
    path, marker = planted
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(tmp_path / "output"))  # the planted file is beside it, not in it
    (tmp_path / "output").mkdir()
    link = tmp_path / "output" / "link.pt"
    link.symlink_to(path)  # a link into the prefix does not make its target the run's
    for candidate in (path, link):
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            BaseCheckpointEngine().load(str(candidate))
    assert not marker.exists()


def test_allow_listed_types_load_weights_only(tmp_path, monkeypatch):
    """numpy arrays and scalars of every plain dtype, dtypes, torch.Size and the standard containers."""
    from collections import Counter, OrderedDict

    monkeypatch.setenv(WEIGHTS_ONLY_ENV, "1")
    state = {"f32": np.arange(3, dtype=np.float32), "i8": np.arange(3, dtype=np.int8), "bool": np.ones(2, bool),
             "str": np.array(["ab"]), "scalar": np.float64(2.5), "dtype": torch.bfloat16,
             "shape": torch.Size([2, 3]), "ordered": OrderedDict(a=1), "counter": Counter("aab"),
             "set": {1, 2}, "frozen": frozenset({3}), "tuple": (1, "x"), "rng": np.random.get_state()}
    torch.save(state, tmp_path / "state.pt")
    loaded = load_torch_file(str(tmp_path / "state.pt"))
    assert loaded["f32"].dtype == np.float32 and loaded["str"][0] == "ab" and loaded["scalar"] == 2.5
    assert loaded["dtype"] is torch.bfloat16 and loaded["shape"] == torch.Size([2, 3])
    assert loaded["ordered"] == OrderedDict(a=1) and loaded["counter"] == Counter("aab")
    assert loaded["frozen"] == frozenset({3}) and loaded["set"] == {1, 2} and loaded["tuple"] == (1, "x")
