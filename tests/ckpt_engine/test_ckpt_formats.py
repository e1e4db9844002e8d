"""File formats written from staged bytes load with the standard readers."""

from __future__ import annotations

import gc
import io
import json
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import safetensors.torch
import torch

from ckpt_engine.engine import plan_state
from ckpt_engine.formats import (
    DATA_ALIGNMENT,
    FilePlan,
    plan_safetensors,
    plan_torch_file,
)


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


def test_zip_records_use_isal_crc_and_the_standard_librarys_without_it(tmp_path: Path) -> None:
    """The CRC comes from ISA-L where it is installed (the lock pins it) and from zlib in an image without it."""
    import subprocess
    import sys
    import zlib

    import isal.isal_zlib

    from ckpt_engine import formats

    assert formats.crc32 is isal.isal_zlib.crc32
    data = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8).numpy().tobytes()
    chunked = 0
    for start in range(0, len(data), 1 << 20):  # as the writer feeds it: 1 MiB pieces, the CRC carried over
        chunked = formats.crc32(memoryview(data)[start:start + (1 << 20)], chunked)
    assert chunked == zlib.crc32(data)
    # an image without isal: the import fails, the standard library's CRC is used, the file tests clean
    script = (
        "import io, sys, zipfile, zlib\n"
        "sys.modules['isal.isal_zlib'] = None\n"
        "import torch\n"
        "import ckpt_engine.formats as formats\n"
        "assert formats.crc32 is zlib.crc32, formats.crc32\n"
        "plan = formats.plan_torch_file('obj.pt', {'t': torch.arange(100_000, dtype=torch.float32)})\n"
        "out = io.BytesIO()\n"
        "plan.render(out, lambda i: iter([memoryview(plan.blobs[i].source.numpy())]))\n"
        "assert zipfile.ZipFile(io.BytesIO(out.getvalue())).testzip() is None\n"
        "assert torch.equal(torch.load(io.BytesIO(out.getvalue()), weights_only=True)['t'], "
        "torch.arange(100_000, dtype=torch.float32))\n"
        "print('fallback ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "fallback ok" in done.stdout, done.stderr[-2000:]


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


def test_safetensors_layout_puts_whole_block_tensors_first_and_keeps_element_alignment() -> None:
    """Tensors of whole 4 KiB blocks come first (O_DIRECT writes them from staged memory), then widest dtype first."""
    tensors = {"odd_f32": torch.randn(3), "block_f32": torch.randn(4096), "odd_bf16": torch.randn(5).bfloat16(),
               "odd_bf16_2k": torch.randn(1024).bfloat16(), "block_bf16": torch.randn(2048).bfloat16(),
               "odd_i8": torch.ones(3, dtype=torch.int8), "odd_f64": torch.randn(1, dtype=torch.float64)}
    plan = plan_safetensors("model.safetensors", tensors)
    header = json.loads(plan.header)
    header.pop("__metadata__")
    order = [key for key, _ in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])]
    assert order[:2] in (["block_f32", "block_bf16"], ["block_bf16", "block_f32"])
    assert order[2:] == ["odd_f64", "odd_f32", "odd_bf16", "odd_bf16_2k", "odd_i8"]
    data_start = 8 + len(plan.header)
    assert data_start % DATA_ALIGNMENT == 0
    for key, info in header.items():
        begin = info["data_offsets"][0]
        assert begin % tensors[key].element_size() == 0, key
        if key.startswith("block"):
            assert begin % DATA_ALIGNMENT == 0, key
    (length,) = struct.unpack("<Q", render(plan)[:8])
    assert length == len(plan.header)


def test_planning_pauses_the_garbage_collector_and_restores_it() -> None:
    """gc is off while a state is planned (pickling included), back on afterwards, also after an error."""
    seen: list[bool] = []

    class Probe:
        def __reduce__(self) -> tuple[object, tuple[()]]:
            seen.append(gc.isenabled())
            return (dict, ())

    assert gc.isenabled()
    plan_state({"extra": {"probe": Probe(), "t": torch.ones(2)}, "model": {"w": torch.ones(3)}})
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError, match="must match"):
        plan_state({"bad key!": {"w": torch.ones(1)}})
    assert gc.isenabled()
    gc.disable()
    try:
        plan_state({"model": {"w": torch.ones(3)}})
        assert not gc.isenabled()  # a caller's own choice is left alone
    finally:
        gc.enable()


def test_torch_file_tensor_records_match_torch_save() -> None:
    """Our fast tensor records and torch's own path (Parameters, conj bit, attributes) load as torch.save's do."""
    base = torch.randn(6, 4)
    tagged = torch.ones(3)
    tagged.note = "kept"  # Python state: torch's path, which keeps it
    obj = {
        "view": base[1:4], "base": base, "transposed": base.t(), "scalar": torch.tensor(2.5),
        "grad": torch.randn(3, requires_grad=True), "bf16": torch.randn(5).bfloat16(), "bool": torch.tensor([True]),
        "param": torch.nn.Parameter(torch.randn(2)), "conj": torch.randn(3, dtype=torch.complex64).conj(),
        "tagged": tagged, "empty": torch.zeros(0, 3), "state": {0: {"step": torch.tensor(1.0)}},
    }
    ours = torch.load(io.BytesIO(render(plan_torch_file("obj.pt", obj))), weights_only=False)
    reference = io.BytesIO()
    torch.save(obj, reference)
    reference.seek(0)
    theirs = torch.load(reference, weights_only=False)
    for key in obj:
        if key == "state":
            assert torch.equal(ours[key][0]["step"], theirs[key][0]["step"])
            continue
        assert type(ours[key]) is type(theirs[key]), key
        assert torch.equal(ours[key].resolve_conj(), theirs[key].resolve_conj()), key
        assert (ours[key].dtype, ours[key].stride(), ours[key].storage_offset(), ours[key].requires_grad,
                ours[key].is_conj()) == (theirs[key].dtype, theirs[key].stride(), theirs[key].storage_offset(),
                                         theirs[key].requires_grad, theirs[key].is_conj()), key
    assert ours["view"].untyped_storage().data_ptr() == ours["base"].untyped_storage().data_ptr()
    assert ours["tagged"].note == "kept"
    assert torch.equal(torch.load(io.BytesIO(render(plan_torch_file("w.pt", {"w": base}))), weights_only=True)["w"],
                       base)


def test_plain_tensors_skip_torchs_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain dense tensors are recorded without Tensor.__reduce_ex__ (~30 us each); others still use it."""
    calls: list[type] = []
    real = torch.Tensor._reduce_ex_internal

    def counting(self: torch.Tensor, proto: int) -> object:
        calls.append(type(self))
        return real(self, proto)

    monkeypatch.setattr(torch.Tensor, "_reduce_ex_internal", counting)
    tagged = torch.ones(1)
    tagged.note = "kept"
    plan = plan_torch_file("o.pt", {"a": torch.ones(2), "b": torch.zeros(3, 3).t(), "c": torch.tensor(1),
                                    "p": torch.nn.Parameter(torch.ones(1)),  # its .data is a plain tensor
                                    "conj": torch.ones(2, dtype=torch.complex64).conj(), "tagged": tagged})
    assert len(calls) == 2  # the conj bit and the Python attribute: torch's own path
    assert len(plan.blobs) == 6


_GC_ON_UNPICKLE: list[bool] = []


def _unpickle_probe() -> _GcProbe:
    _GC_ON_UNPICKLE.append(gc.isenabled())
    return _GcProbe()


class _GcProbe:
    """Records, when it is unpickled, whether the cyclic gc is on."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_unpickle_probe, ())


def test_loading_pauses_the_garbage_collector_and_restores_it(tmp_path: Path) -> None:
    from ckpt_engine import CheckpointEngine

    engine = CheckpointEngine(tmp_path)
    engine.save(1, {"extra": {"probe": _GcProbe(), "t": torch.ones(2)}}).wait()
    _GC_ON_UNPICKLE.clear()
    loaded = engine.load(weights_only=False)
    engine.close()
    assert isinstance(loaded["extra"]["probe"], _GcProbe)
    assert _GC_ON_UNPICKLE == [False] and gc.isenabled()
