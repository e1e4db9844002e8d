"""The engine's CUDA staging branch, run on the CPU with stand-ins for streams, events and device tensors.

No session of this project has had a GPU, so the branch that every GPU job takes (side
stream, per-segment events, pinned slabs) would otherwise never execute here: a typo or
a wrong call order in it would first show on a customer's H100. The stand-ins record
what the branch asks CUDA to do, from which thread and on which stream; the checks are
the ordering rules the real path relies on. What they cannot show is CUDA's own
behaviour (asynchronous copies, pinned memory); that is the ``gpu``-marked test in
test_ckpt_engine.py and ``tests/benchmarks/ckpt_overhead_gpu.py``.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckpt_engine.engine as engine_module
import ckpt_engine.pool as pool_module
import ckpt_engine.stager as stager_module
from ckpt_engine import CheckpointEngine
from ckpt_engine.errors import PersistError


class FakeCuda:
    """``torch.cuda`` as the engine and pool use it; every call lands in ``log`` as (what, stream, thread)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []
        self.default = FakeStream(self, "default")
        self.local = threading.local()
        self.events: list[FakeEvent] = []
        self.pinned_allocations = 0
        self.failing_event: int | None = None  # the index of an event whose synchronize() raises a CUDA error

    def current(self) -> FakeStream:
        return getattr(self.local, "stream", self.default)

    def note(self, what: str, stream: FakeStream | None = None) -> None:
        self.log.append((what, (stream or self.current()).name, threading.current_thread().name))

    # the torch.cuda API surface the engine and the pool touch
    def is_available(self) -> bool:
        return True

    def Stream(self) -> FakeStream:  # mirrors torch.cuda.Stream
        return FakeStream(self, "side")

    def Event(self) -> FakeEvent:  # mirrors torch.cuda.Event
        event = FakeEvent(self)
        self.events.append(event)
        return event

    def current_stream(self) -> FakeStream:
        return self.current()

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        previous = self.current()
        self.local.stream = stream
        try:
            yield
        finally:
            self.local.stream = previous


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_stream(self, other: FakeStream) -> None:
        self.cuda.note(f"wait_stream:{other.name}", self)

    def synchronize(self) -> None:
        self.cuda.note("stream.synchronize", self)


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.recorded_on: str | None = None
        self.synchronized_by: list[str] = []

    def record(self, stream: FakeStream | None = None) -> None:
        self.recorded_on = (stream or self.cuda.current()).name
        self.cuda.note("event.record", stream)

    def synchronize(self) -> None:
        assert self.recorded_on is not None, "waited on an event never recorded"
        self.synchronized_by.append(threading.current_thread().name)
        if self.cuda.failing_event is not None and self.cuda.events.index(self) == self.cuda.failing_event:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")  # e.g. after an Xid 79


class DeviceTensor(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0; copies and layout changes of it are logged."""

    cuda: FakeCuda | None = None

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if cls.cuda is not None:
            if func is torch.Tensor.copy_:
                cls.cuda.note(f"copy_:non_blocking={kwargs.get('non_blocking', False)}")
            elif func is torch.Tensor.contiguous:
                cls.cuda.note("contiguous")
        return super().__torch_function__(func, types, args, kwargs)


def module_with(module: types.ModuleType, **overrides: Any) -> types.ModuleType:
    """A stand-in for ``module`` (here: torch) with some attributes replaced, everything else delegated."""
    proxy = types.ModuleType(module.__name__)
    proxy.__getattr__ = lambda name: getattr(module, name)  # type: ignore[method-assign]
    for name, value in overrides.items():
        setattr(proxy, name, value)
    return proxy


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    cuda = FakeCuda()

    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        cuda.pinned_allocations += pin_memory  # the real call needs a CUDA driver
        return torch.empty(*args, **kwargs)

    monkeypatch.setattr(engine_module, "torch", module_with(torch, cuda=cuda))
    monkeypatch.setattr(stager_module, "torch", module_with(torch, cuda=cuda))
    monkeypatch.setattr(pool_module, "torch", module_with(torch, cuda=cuda, empty=empty))
    monkeypatch.setattr(DeviceTensor, "cuda", cuda)
    yield cuda


def on_device(tensor: torch.Tensor) -> DeviceTensor:
    return tensor.as_subclass(DeviceTensor)  # type: ignore[return-value]


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_cuda_branch_orders_streams_events_and_pinned_slabs(tmp_path: Path, fake_cuda: FakeCuda, lazy: bool) -> None:
    engine = CheckpointEngine(tmp_path, host_cache_size=0.01, slab_bytes=1 << 20, pin_host_cache=True)
    assert engine.pool.pin and isinstance(engine._stream, FakeStream)
    plain = {"w": torch.randn(1 << 21), "transposed": torch.randn(64, 32).t(), "bias": torch.randn(3)}
    state = {key: on_device(value) for key, value in plain.items()} | {"host": torch.randn(5)}
    expected = {key: value.contiguous().clone() for key, value in plain.items()} | {"host": state["host"].clone()}
    fake_cuda.note("save() called")
    handle = engine.save(1, {"model": state}, lazy=lazy)
    handle.wait_staged()
    fake_cuda.note("staged")
    handle.wait()
    loaded = engine.load()["model"]
    engine.close()

    assert set(loaded) == set(expected)
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key  # 8 MiB through a 10 MiB pool of 1 MiB pinned slabs
    log = fake_cuda.log
    whats = [what for what, _, _ in log]
    start, staged = whats.index("save() called"), whats.index("staged")
    # the side stream waits for the training stream's pending work before it reads any parameter
    assert ("wait_stream:default", "side", "MainThread") in log
    first_copy = next(i for i, what in enumerate(whats) if what.startswith("copy_"))
    assert start < whats.index("wait_stream:default") < first_copy < staged
    copies = [entry for entry in log if entry[0].startswith("copy_")]
    assert len(copies) >= 8  # the 8 MiB tensor alone spans eight 1 MiB slabs
    assert all(what == "copy_:non_blocking=True" and stream == "side" for what, stream, _ in copies), copies
    stager = "ckpt-stage_0" if lazy else "MainThread"  # lazy: the stager thread, while training goes on
    assert {thread for _, _, thread in copies} == {stager}
    # the transposed tensor is made contiguous on the side stream, ordered before its copies
    assert [stream for what, stream, _ in log if what == "contiguous"] == ["side"]
    # each device segment: an event recorded on the side stream, waited for by its writer before writing
    assert len(fake_cuda.events) == len(copies)
    for event in fake_cuda.events:
        assert event.recorded_on == "side"
        assert event.synchronized_by and all(name.startswith("ckpt-writer") for name in event.synchronized_by)
    # staging is complete (the optimizer may step) only once the side stream has finished
    assert ("stream.synchronize", "side", stager) in log
    assert whats.index("stream.synchronize") < staged
    assert fake_cuda.pinned_allocations == engine.pool.peak_bytes // engine.pool.slab_bytes >= 1  # every slab pinned


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_cuda_error_while_writing_fails_the_checkpoint_and_frees_every_slab(tmp_path: Path, fake_cuda: FakeCuda,
                                                                             lazy: bool) -> None:
    """A device fault surfaces in the writer as an event that raises; the save must fail, not hang.

    A hung writer would block every later save, and its threads would keep the process
    from exiting, so a hardware fault would look like a stuck job instead of a failed one.
    """
    engine = CheckpointEngine(tmp_path, host_cache_size=0.01, slab_bytes=1 << 20, pin_host_cache=True)
    engine.save(1, {"model": {"w": on_device(torch.ones(1 << 18))}}).wait()
    fake_cuda.failing_event = len(fake_cuda.events) + 2  # the third segment of the next save
    handle = engine.save(2, {"model": {"w": on_device(torch.randn(1 << 21))}}, lazy=lazy)
    with pytest.raises(PersistError, match="illegal memory access"):
        handle.wait(timeout=60)
    assert engine.pool.allocated_bytes == sum(slab.capacity for slab in engine.pool._free)  # every slab came back
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-1"]
    fake_cuda.failing_event = None
    engine.save(3, {"model": {"w": on_device(torch.full((1 << 20,), 3.0))}}).wait(timeout=60)
    assert torch.equal(engine.load()["model"]["w"], torch.full((1 << 20,), 3.0))
    engine.close()
