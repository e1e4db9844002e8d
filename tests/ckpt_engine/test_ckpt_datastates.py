"""The DataStates-LLM API behind the vendored ``datastates`` alias, in the style of upstream's own tests.

Each upstream entry point (``CheckpointEngine``, ``BaseCheckpointEngine``,
``llm.Checkpointing``, ``ckpt.CkptEngine``) saves a state of tensors, nested dicts and
Python objects, waits, commits, loads it back and shuts down; the config shapes upstream
accepts are read, and unknown keys or values are refused by name.
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ckpt_engine.config import DataStatesConfig
from ckpt_engine.contract import WEIGHTS_ONLY_ENV
from ckpt_engine.errors import ConfigError, PersistError, UnreadableCheckpointError
from ckpt_engine.integrations import datastates
from ckpt_engine.integrations.deepspeed import DataStatesEngine


class Foo:
    """A custom Python object, as upstream's base-engine test pickles one."""

    def __init__(self, x: int = -1) -> None:
        self.state = x
        self.state_list = [x * i for i in range(1000)]


def deepspeed_config(**config: Any) -> SimpleNamespace:
    """A DeepSpeedConfig-like object, as upstream's test builds one."""
    return SimpleNamespace(datastates_config=SimpleNamespace(enabled=True, config=config))


def sample_state() -> dict[str, Any]:
    return {
        "tensor1": torch.randn(256, 256, dtype=torch.bfloat16),
        "tensor2": torch.randn(256, 256),
        "nested": {"layer": {"w": torch.arange(10), "b": [torch.ones(3), 7]}, "lr": 0.1},
        "custom_py_obj": Foo(-5),
        "random_np_obj": np.random.randn(512).astype(np.float32),
        "test_string": "this is a random test string" * 100,
        "dtype": torch.float32,
        "shape": torch.Size([256, 256]),
    }


def assert_same(restored: dict[str, Any], expected: dict[str, Any]) -> None:
    assert torch.equal(restored["tensor1"], expected["tensor1"]) and restored["tensor1"].dtype == torch.bfloat16
    assert torch.equal(restored["tensor2"], expected["tensor2"])
    assert torch.equal(restored["nested"]["layer"]["w"], expected["nested"]["layer"]["w"])
    assert torch.equal(restored["nested"]["layer"]["b"][0], expected["nested"]["layer"]["b"][0])
    assert restored["nested"]["layer"]["b"][1] == 7 and restored["nested"]["lr"] == 0.1
    assert restored["custom_py_obj"].state == -5
    assert restored["custom_py_obj"].state_list == expected["custom_py_obj"].state_list
    assert np.array_equal(restored["random_np_obj"], expected["random_np_obj"])
    assert restored["test_string"] == expected["test_string"]
    assert restored["dtype"] is torch.float32 and restored["shape"] == torch.Size([256, 256])


@pytest.mark.parametrize("make", [
    pytest.param(lambda: datastates.BaseCheckpointEngine({"host_cache_size": 0.01, "parser_threads": 1}, rank=0),
                 id="BaseCheckpointEngine"),
    pytest.param(lambda: DataStatesEngine(runtime_config={"host_cache_size": 0.01, "parser_threads": 2}, rank=0),
                 id="CheckpointEngine"),
    pytest.param(lambda: datastates.Checkpointing(runtime_config=deepspeed_config(host_cache_size=1,
                                                                                 parser_threads=2), rank=0),
                 id="llm.Checkpointing"),
])
def test_save_wait_commit_load_shutdown_round_trip(tmp_path: Path, make: Any, monkeypatch) -> None:
    monkeypatch.delenv(WEIGHTS_ONLY_ENV, raising=False)  # Foo loads: this process saved the file (ADR 0038)
    engine = make()
    state = sample_state()
    expected = {**state, "tensor2": state["tensor2"].clone()}
    path = tmp_path / "global_step1" / "datastates-ckpt.pt"
    assert engine.save(state, str(path)) is True  # upstream returns True
    state["tensor2"].add_(1.0)  # the staged copy is what gets written
    if isinstance(engine, datastates.Checkpointing):
        engine.wait()
    else:
        engine.wait(True)
    written = sorted(p.name for p in path.parent.iterdir())  # no temporary left behind
    if isinstance(engine, DataStatesEngine):  # a directory is a DeepSpeed tag: manifest, then latest
        assert written == [path.name, "manifest.json"] and (tmp_path / "latest").read_text() == "global_step1"
    else:
        assert written == [path.name]
    assert engine.commit("tag1") is True
    assert_same(engine.load(str(path)), expected)
    engine.shutdown()
    engine.shutdown()  # idempotent


def test_save_refuses_a_non_dict_and_load_waits_for_a_pending_write(tmp_path: Path) -> None:
    engine = datastates.BaseCheckpointEngine({}, rank=0)
    with pytest.raises(TypeError, match="must be a dict"):
        engine.save([torch.ones(2)], str(tmp_path / "x.pt"))  # type: ignore[arg-type]
    big = {"w": torch.randn(1 << 20)}
    engine.save(OrderedDict(big), str(tmp_path / "big.pt"))
    assert torch.equal(engine.load(str(tmp_path / "big.pt"))["w"], big["w"])  # no wait() in between
    engine.shutdown()


def test_ckpt_engine_writes_tensors_at_offsets_and_loads_them_in_place(tmp_path: Path) -> None:
    engine = datastates.CkptEngine(host_cache_size=2 << 20, gpu_device_id=0, rank=0)
    tensor1, tensor2 = torch.randn(256, 256, dtype=torch.bfloat16), torch.randn(64, 64)
    nbytes = tensor1.numel() * tensor1.element_size()
    path = str(tmp_path / "datastates-ckpt.pt")
    engine.async_save([(1, tensor1, 0, path), (1, tensor2, nbytes, path)])
    expected1 = tensor1.clone()
    tensor1.zero_()  # bytes were copied when async_save returned
    engine.wait()
    assert engine.commit("v1") is True
    restored1, restored2 = torch.zeros_like(tensor1), torch.zeros_like(tensor2)
    engine.load([(1, restored1, 0, path), (1, restored2, nbytes, path)])
    assert torch.equal(restored1, expected1) and torch.equal(restored2, tensor2)
    with pytest.raises(ValueError, match="overflows"):
        engine.load([(1, torch.zeros(10**6), 0, path)])
    engine.shutdown()


@pytest.mark.parametrize("config", [
    pytest.param({"host_cache_size": 0.5, "parser_threads": 3}, id="flat"),
    pytest.param(OrderedDict(host_cache_size=0.5, parser_threads=3), id="ordered"),
    pytest.param({"datastates_ckpt": {"host_cache_size": 0.5, "parser_threads": 3}, "zero_optimization": {}},
                 id="deepspeed-dict"),
    pytest.param(deepspeed_config(host_cache_size=0.5, parser_threads=3), id="deepspeed-object"),
])
def test_every_config_shape_reaches_the_engine(config: Any) -> None:
    engine = DataStatesEngine(runtime_config=config, rank=0)
    assert engine._engine.pool.capacity_bytes == int(0.5 * (1 << 30))
    assert engine._engine._writers._max_workers == 3
    assert datastates.parse_config(config)["host_cache_size"] == 0.5
    engine.shutdown()


@pytest.mark.parametrize("config, named", [
    pytest.param({"engine_type": "no_such_engine"}, "engine_type", id="bad-engine-type"),
    pytest.param({"host_cache_siz": 1}, "host_cache_siz", id="typo"),
    pytest.param({"datastates_ckpt": {"parser_threads": 0}}, "parser_threads", id="zero-threads"),
    pytest.param({"datastates_ckpt": {"wat": 1}}, "datastates_ckpt.wat", id="nested-unknown"),
    pytest.param({"pin_host_cache": "yes"}, "pin_host_cache", id="not-bool"),
    pytest.param({"datastates_ckpt": False}, "datastates_ckpt", id="disabled"),
    pytest.param(SimpleNamespace(datastates_config=SimpleNamespace(enabled=False, config={})), "enabled",
                 id="object-disabled"),
    pytest.param(42, "int", id="not-a-config"),
])
def test_unknown_keys_and_values_are_errors_that_name_them(config: Any, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        datastates.CheckpointEngine(runtime_config=config, rank=0)


def test_every_engine_type_is_accepted_and_defaults_match_upstream() -> None:
    for kind in ("state_engine", "simple_engine", "state_aggregated_engine"):
        assert DataStatesConfig.from_any({"engine_type": kind}).engine_type == kind
    defaults = datastates.parse_config({})
    assert defaults["parser_threads"] == 4 and defaults["engine_type"] == "state_engine"
    assert datastates.get_ds_checkpoint_version("/ckpt/global_step12/mp_rank_00_model_states.pt") == 12
    assert datastates.get_checkpoint_version("/ckpt/x.pt", last_version=3) == 4
    assert datastates.get_config_type({}) == "dict"
    assert datastates.get_config_type(deepspeed_config()) == "DeepSpeedConfig"


def test_failed_write_raises_on_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = datastates.BaseCheckpointEngine(None, rank=0)

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr("ckpt_engine.integrations.state_files.os.replace", failing_replace)
    engine.save({"w": torch.ones(4)}, str(tmp_path / "x.pt"))
    with pytest.raises(PersistError):
        engine.wait(persist=True)
    monkeypatch.undo()
    assert not list(tmp_path.iterdir())
    engine.shutdown()


def write_datastates_format(path: Path) -> None:
    """A file laid out as DataStates-LLM writes one: 8-byte header length, JSON header, tensor bytes, pickle."""
    import json
    import pickle

    tensor = torch.arange(4, dtype=torch.float32)
    lean = pickle.dumps({"w": "TENSOR|w"})
    header = json.dumps({"w": {"dtype": "torch.float32", "shape": [4], "data_offsets": [0, 16]},
                         "datastates_metadata": {"data_offsets": [16, 16 + len(lean)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + tensor.numpy().tobytes() + lean)


def test_unreadable_files_name_the_file_what_it_looks_like_and_what_to_do(tmp_path: Path) -> None:
    engine = datastates.BaseCheckpointEngine({}, rank=0)
    foreign = tmp_path / "mp_rank_00_model_states.pt"
    write_datastates_format(foreign)
    with pytest.raises(UnreadableCheckpointError) as found:
        engine.load(str(foreign))
    message = str(found.value)
    assert str(foreign) in message and "DataStates-LLM's own checkpoint format" in message
    assert "What to do" in message and "stack underflow" not in message.split("it looks like")[1]
    truncated = tmp_path / "optim.pt"
    torch.save({"w": torch.randn(1000)}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:1500])
    with pytest.raises(UnreadableCheckpointError, match=r"optim\.pt.*truncated"):
        engine.load(str(truncated))
    engine.shutdown()


def test_a_manifest_from_a_newer_sat_says_so() -> None:
    from ckpt_engine.contract import Manifest

    with pytest.raises(UnreadableCheckpointError, match="newer SAT.*ckpt_engine/2"):
        Manifest.from_json(b'{"format": "ckpt_engine/2", "step": 1, "files": {}}')


def test_vendored_alias_has_every_upstream_module(vendor_dir: Path, tmp_path: Path) -> None:
    script = (
        "import datastates, datastates.llm, datastates.ckpt, datastates.utils, datastates.llm.helper\n"
        "import datastates.llm.deepspeed.helper, datastates.engines, datastates.deepspeed.helper\n"
        "from datastates import CheckpointEngine, BaseCheckpointEngine\n"
        "from datastates.llm import Checkpointing, DecoratedCheckpointing\n"
        "from datastates.ckpt import CkptEngine\n"
        "import torch\n"
        f"e = CheckpointEngine(runtime_config={{'host_cache_size': 0.01}}, rank=0)\n"
        f"assert e.save({{'a': torch.ones(3)}}, {str(tmp_path / 'a.pt')!r}) is True\n"
        "e.wait(persist=True); e.shutdown(); print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(vendor_dir)}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_another_process_sees_a_committed_tag_or_a_clear_not_committed_error(tmp_path: Path) -> None:
    from ckpt_engine.errors import NotCommittedError

    writer = DataStatesEngine({"host_cache_size": 0.01}, rank=0)
    path = tmp_path / "global_step3" / "mp_rank_00_model_states.pt"
    writer.save({"module": {"w": torch.ones(8)}}, str(path))  # not sealed: no optimizer file, no wait yet
    reader = DataStatesEngine({"host_cache_size": 0.01}, rank=0)  # stands for another process
    with pytest.raises(NotCommittedError, match="global_step3 is not committed yet"):
        reader.load(str(path))
    assert not (tmp_path / "latest").exists()
    writer.wait(persist=True)  # commits: manifest, then latest
    assert (tmp_path / "latest").read_text() == "global_step3"
    assert torch.equal(reader.load(str(path))["module"]["w"], torch.ones(8))
    writer.shutdown()
    reader.shutdown()
