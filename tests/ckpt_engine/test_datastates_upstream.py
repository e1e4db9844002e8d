"""Issue 47.1: DataStates-LLM's own test cases, re-typed, run as scripts against ``sat vendor``'s alias.

Upstream's ``tests/python`` (github.com/DataStates/datastates-llm) has five cases for the
API surface SAT re-implements (ADR 0013): the base engine and the state engine each
saving a class the script defines, the DeepSpeed-config engine and ``llm.Checkpointing``
each saving a numpy array, a ``torch.dtype`` and a ``torch.Size``, and the offset engine.
Each runs here as upstream runs it: a script (its classes live in ``__main__``) with only
``PYTHONPATH=<the vendor directory>``, no SAT environment, no ``CKPT_WEIGHTS_ONLY``.
Sizes are smaller than upstream's (256x256 tensors, a small host cache) for a 2-core CI box.

Then what the regression taught (ADR 0038): a numpy RNG state and a dataclass from the
script load again in a later process of the same run, and the same dataclass is refused
outside the run's prefix or with ``CKPT_WEIGHTS_ONLY=1``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_engine.cli import register_vendor_cli
from ckpt_engine.contract import OUTPUT_DIR_ENV, WEIGHTS_ONLY_ENV


@pytest.fixture(scope="module")
def sat_vendor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vendor directory laid out by ``sat vendor DIR`` (the CLI's own handler)."""
    dest = tmp_path_factory.mktemp("sat-vendor") / "checkpoint_vendor"
    parser = argparse.ArgumentParser(prog="sat")
    register_vendor_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["vendor", str(dest)])
    assert args.func(args) == 0
    assert (dest / "datastates" / "__init__.py").is_file() and (dest / "ckpt_engine" / "sniff.py").is_file()
    return dest


def script_env(vendor: Path, **extra: str) -> dict[str, str]:
    """The environment of a plain DataStates script: the vendor directory on PYTHONPATH, nothing of SAT's."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SAT_", "CKPT_", "AWS_")) and key != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(vendor), **extra}


def run_script(tmp_path: Path, vendor: Path, name: str, source: str, *args: str,
               **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / f"case_{name}.py"  # never a module name the script imports
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(script), *args], check=False, env=script_env(vendor, **env),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=300)


def passed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0 and "CASE OK" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]


_CUSTOM_OBJECT_CASE = """
    import sys

    import numpy as np
    import torch
    from datastates import {engine}

    class foo:  # a class of the script's own: pickled as __main__.foo
        def __init__(self, x=-1):
            self.state = x
            self.state_list = [x * i for i in range(1000)]

        def get_state(self):
            return self.state

        def get_state_list(self):
            return self.state_list

    engine = {engine}({{"host_cache_size": 0.05, "parser_threads": 1}}, rank=0)
    tensor1 = torch.randn(torch.Size([256, 256]), dtype=torch.bfloat16)
    tensor2 = torch.randn(torch.Size([256, 256]), dtype=torch.float32)
    obj = foo(-5)
    array = np.random.randn(512).astype(np.float32)
    state = {{"tensor1": tensor1, "tensor2": tensor2, "custom_py_obj": obj, "random_np_obj": array,
             "test_string": "this is a random test string" * 100}}
    path = sys.argv[1]
    engine.save(state, path)
    engine.wait(True)
    restored = engine.load(path)
    assert torch.allclose(tensor1, restored["tensor1"]) and torch.allclose(tensor2, restored["tensor2"])
    assert restored["custom_py_obj"].get_state() == obj.get_state()
    assert restored["custom_py_obj"].get_state_list() == obj.get_state_list()
    assert np.array_equal(array, restored["random_np_obj"])
    assert "this is a random test string" in restored["test_string"]
    {finish}
    print("CASE OK")
"""

_DEEPSPEED_CONFIG_CASE = """
    import os
    import sys

    import numpy as np
    import torch
    from {module} import {engine}

    class DeepSpeedConfig:  # what DeepSpeed hands the engine: an object with a datastates_config
        def __init__(self):
            self.datastates_config = self.DataStatesConfig()

        class DataStatesConfig:
            def __init__(self):
                self.enabled = True
                self.config = {{"host_cache_size": 0.05, "parser_threads": 2{extra}}}

    engine = {engine}(runtime_config=DeepSpeedConfig(), rank=0)
    shape, dtype = torch.Size([256, 256]), torch.float32
    tensor, tensor2 = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    if torch.cuda.is_available():
        tensor2 = tensor2.pin_memory()
    array = np.random.randn(512).astype(np.float32)
    state = {{"tensor1": tensor, "tensor2": tensor2, "model_name": "datastates_test_model", "rng_iterator": 12345,
             "dtype": dtype, "shape": shape, "random_np_obj": array, "test_string": "this is a random test string" * 100}}
    path = sys.argv[1]
    engine.save(state_dict=state, path=path)
    engine.wait({wait})
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    restored = engine.load(path=path)
    assert torch.equal(restored["tensor1"], tensor) and torch.equal(restored["tensor2"], tensor2)
    assert restored["dtype"] is torch.float32 and restored["shape"] == shape and restored["rng_iterator"] == 12345
    assert np.array_equal(restored["random_np_obj"], array) and restored["model_name"] == "datastates_test_model"
    engine.shutdown()
    print("CASE OK")
"""

_OFFSET_ENGINE_CASE = """
    import sys

    import torch
    from datastates.ckpt import CkptEngine

    engine = CkptEngine(8 << 20, 0, 0)
    tensor1 = torch.randn(torch.Size([256, 256]), dtype=torch.bfloat16)
    tensor2 = torch.randn(torch.Size([256, 256]), dtype=torch.bfloat16)
    nbytes = tensor1.numel() * tensor1.element_size()
    path, version = sys.argv[1], 1
    engine.async_save([(version, tensor1, 0, path), (version, tensor2, nbytes, path)])
    engine.wait()
    restored1, restored2 = tensor1.clone().zero_(), tensor2.clone().zero_()
    engine.load([(version, restored1, 0, path), (version, restored2, nbytes, path)])
    assert torch.equal(restored1, tensor1) and torch.equal(restored2, tensor2)
    engine.shutdown()
    print("CASE OK")
"""

UPSTREAM_CASES = {
    # tests/python/test_ckpt_base_engine.py
    "ckpt_base_engine": _CUSTOM_OBJECT_CASE.format(engine="BaseCheckpointEngine", finish="engine.shutdown()"),
    # tests/python/test_llm_ckpt_state_engine.py (upstream drops the engine with `del`)
    "llm_ckpt_state_engine": _CUSTOM_OBJECT_CASE.format(engine="CheckpointEngine", finish="del engine"),
    # tests/python/test_datastates_llm.py
    "datastates_llm": _DEEPSPEED_CONFIG_CASE.format(module="datastates", engine="CheckpointEngine", extra="",
                                                    wait="True"),
    # the same case against the llm layout (datastates.llm's engine, pinned host cache, wait())
    "llm_checkpointing": _DEEPSPEED_CONFIG_CASE.format(module="datastates.llm", engine="Checkpointing",
                                                       extra=', "pin_host_cache": True', wait=""),
    # tests/python/test_ckpt_engine.py (the offset engine)
    "ckpt_engine": _OFFSET_ENGINE_CASE,
}


@pytest.mark.parametrize("case", sorted(UPSTREAM_CASES))
def test_upstream_case_passes_through_sat_vendor(case: str, sat_vendor: Path, tmp_path: Path) -> None:
    target = tmp_path / "global_step1" / "datastates-ckpt.pt"
    target.parent.mkdir()
    passed(run_script(tmp_path, sat_vendor, case, UPSTREAM_CASES[case], str(target)))


_RUN_FILE_CASE = """
    import dataclasses
    import sys

    import numpy as np
    import torch
    from datastates import BaseCheckpointEngine

    @dataclasses.dataclass
    class TrainState:  # the script's own record of where it is
        step: int
        lr: float
        tags: list

    mode, path = sys.argv[1], sys.argv[2]
    engine = BaseCheckpointEngine({"host_cache_size": 0.05}, rank=0)
    legacy = np.random.RandomState(7)
    modern = np.random.default_rng(7)
    if mode == "save":
        engine.save({"w": torch.arange(6.0), "train": TrainState(12, 0.5, ["a"]),
                     "np_rng": legacy.get_state(), "np_generator": modern.bit_generator.state}, path)
        engine.wait(True)
    elif mode == "rng":
        state = engine.load(path)  # no class of the script's: tensors and allow-listed types only
        restored = np.random.RandomState()
        restored.set_state(state["np_rng"])
        assert np.array_equal(restored.randint(0, 1 << 30, 8), legacy.randint(0, 1 << 30, 8))
        generator = np.random.default_rng()
        generator.bit_generator.state = state["np_generator"]
        assert np.array_equal(generator.integers(0, 1 << 30, 8), modern.integers(0, 1 << 30, 8))
    else:
        state = engine.load(path)
        assert state["train"] == TrainState(12, 0.5, ["a"]) and torch.equal(state["w"], torch.arange(6.0))
    engine.shutdown()
    print("CASE OK")
"""

_RNG_ONLY_SAVE = """
    import sys

    import numpy as np
    import torch

    legacy, modern = np.random.RandomState(7), np.random.default_rng(7)
    torch.save({"np_rng": legacy.get_state(), "np_generator": modern.bit_generator.state}, sys.argv[1])
"""


def test_a_numpy_rng_state_loads_in_a_later_process_without_trust(sat_vendor: Path, tmp_path: Path) -> None:
    """The RNG states load through the allow-list alone: no SAT run prefix, not saved by this process."""
    path = tmp_path / "rng.pt"
    saved = subprocess.run([sys.executable, "-c", textwrap.dedent(_RNG_ONLY_SAVE), str(path)], check=False,
                           env=script_env(sat_vendor), capture_output=True, text=True, timeout=300)
    assert saved.returncode == 0, saved.stderr[-2000:]
    result = run_script(tmp_path, sat_vendor, "rng", _RUN_FILE_CASE, "rng", str(path), **{WEIGHTS_ONLY_ENV: "1"})
    passed(result)  # even with weights_only forced on


def test_a_dataclass_of_the_script_loads_again_from_its_own_run_prefix(sat_vendor: Path, tmp_path: Path) -> None:
    output = tmp_path / "run" / "output"
    path = output / "state" / "train.pt"
    passed(run_script(tmp_path, sat_vendor, "run_file", _RUN_FILE_CASE, "save", str(path),
                      **{OUTPUT_DIR_ENV: str(output)}))
    # a later attempt of the same run: the run's own prefix is trusted, with one warning naming the opt-out
    later = run_script(tmp_path, sat_vendor, "run_file", _RUN_FILE_CASE, "load", str(path),
                       **{OUTPUT_DIR_ENV: str(output)})
    passed(later)
    assert later.stderr.count("weights_only=False") == 1 and f"{WEIGHTS_ONLY_ENV}=1" in later.stderr

    # CKPT_WEIGHTS_ONLY=1: weights_only even for the run's own file; torch names the class it refused
    forced = run_script(tmp_path, sat_vendor, "run_file", _RUN_FILE_CASE, "load", str(path),
                        **{OUTPUT_DIR_ENV: str(output), WEIGHTS_ONLY_ENV: "1"})
    assert forced.returncode != 0 and "Unsupported global" in forced.stderr and "TrainState" in forced.stderr

    # the same file seen from another run (its own output elsewhere): not trusted
    other = run_script(tmp_path, sat_vendor, "run_file", _RUN_FILE_CASE, "load", str(path),
                       **{OUTPUT_DIR_ENV: str(tmp_path / "other-run" / "output")})
    assert other.returncode != 0 and "Unsupported global" in other.stderr

    # long-lived keys (scoped credentials off): the prefix is not the run's alone
    unscoped = run_script(tmp_path, sat_vendor, "run_file", _RUN_FILE_CASE, "load", str(path),
                          **{OUTPUT_DIR_ENV: str(output), "AWS_ACCESS_KEY_ID": "service-key"})
    assert unscoped.returncode != 0 and "Unsupported global" in unscoped.stderr
