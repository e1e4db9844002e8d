"""File formats written from staged bytes load with the standard readers."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import safetensors.torch
import torch

from ckpt_engine.formats import FilePlan, plan_safetensors, plan_torch_file


def render(plan: FilePlan) -> bytes:
    out = io.BytesIO()

    def segments(index: int) -> Iterator[memoryview]:
        data = plan.blobs[index].source.numpy()
        for start in range(0, data.shape[0], 7):  # odd chunking exercises streaming
            yield memoryview(data[start:start + 7])

    plan.render(out, segments)
    return out.getvalue()


@pytest.mark.parametrize("zip64", [pytest.param(False, id="zip"), pytest.param(True, id="zip64")])
def test_torch_file_loads_with_torch_load(tmp_path: Path, zip64: bool) -> None:
    base = torch.arange(10, dtype=torch.float32)
    obj = {"a": base, "view": base[2:5], "nested": [torch.ones(2, 2, dtype=torch.bfloat16), {"k": 3}], "s": "text"}
    raw = render(plan_torch_file("obj.pt", obj, force_zip64=zip64))
    assert zipfile.ZipFile(io.BytesIO(raw)).testzip() is None
    loaded = torch.load(io.BytesIO(raw), weights_only=True)
    assert torch.equal(loaded["a"], base) and torch.equal(loaded["view"], base[2:5])
    assert torch.equal(loaded["nested"][0], obj["nested"][0]) and loaded["nested"][1] == {"k": 3}
    path = tmp_path / "obj.pt"
    path.write_bytes(raw)
    assert torch.equal(torch.load(path, mmap=True, weights_only=True)["a"], base)  # records are aligned


def test_safetensors_file_loads_with_safetensors(tmp_path: Path) -> None:
    tensors = {"w": torch.randn(3, 4), "i": torch.arange(5, dtype=torch.int16), "b": torch.tensor([True, False]),
               "tied": torch.zeros(1)}
    tensors["alias"] = tensors["w"]
    path = tmp_path / "model.safetensors"
    path.write_bytes(render(plan_safetensors("model.safetensors", tensors)))
    loaded = safetensors.torch.load_file(path)
    assert "alias" not in loaded  # shared storage keeps its first name, like tied weights
    for key in ("w", "i", "b", "tied"):
        assert torch.equal(loaded[key], tensors[key])
