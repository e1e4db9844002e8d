"""The peers ``ckpt_overhead.py --peers`` runs beside ours, or why one cannot run here (issue 47 item 2).

Each peer is one way of checkpointing the same model and optimizer, with the same hooks as
the built-in ways: ``checkpoint(step)`` holds the training thread for what it costs,
``finalize()`` waits until the last checkpoint is durable, and ``durable_s`` gets the
seconds from each save call to its being durable where the peer says when that is.

* ``dcp-process``: ``torch.distributed.checkpoint.async_save`` with its process-based
  checkpointer (``AsyncCheckpointerType.PROCESS``) and, where CUDA is present, pinned-memory
  staging: the fastest form torch 2.13 offers;
* ``torchsnapshot``: ``Snapshot.async_take`` (torchsnapshot 0.1.0, the newest release);
* ``deepspeed-torch``: DeepSpeed's ``TorchCheckpointEngine`` (``torch.save``, then DeepSpeed's
  commit; DeepSpeed does not fsync, so its files are not durable when it returns);
* ``deepspeed-fast`` / ``deepspeed-decoupled`` and ``bytecheckpoint`` run where they can;
  here they say why not.

Peers are not in the project's install (requirements.lock has none of them but DeepSpeed's
extra): install one by hand into a directory on PYTHONPATH to run it.
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEERS = ("dcp-process", "torchsnapshot", "deepspeed-torch", "deepspeed-fast", "deepspeed-decoupled", "bytecheckpoint")


@dataclass
class Peer:
    """One runnable peer: its row name, its short name on the last line, and its hooks."""

    name: str
    short: str
    checkpoint: Callable[[int], None]
    finalize: Callable[[], None] | None = None


def _dcp_process(base: Path, state: Callable[[], dict[str, Any]], app: dict[str, Any], every: int,
                 durable_s: dict[str, list[float]]) -> Peer:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    name = "dcp.async_save (process)"
    kwargs: dict[str, Any] = {"async_checkpointer_type": AsyncCheckpointerType.PROCESS}
    if torch.cuda.is_available():  # pinned host staging needs CUDA; on the CPU DCP stages by plain copies
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        kwargs["async_stager"] = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=True,
                                                              use_async_staging=True))
        name += " pinned"
    futures: list[Any] = []

    def wait() -> None:
        while futures:
            future = futures.pop(0)
            (getattr(future, "upload_completion", None) or future).result()

    def save(step: int) -> None:
        wait()  # one in flight, like ours
        shutil.rmtree(base / f"dcpp-{step - 2 * every}", ignore_errors=True)
        started = time.perf_counter()
        future = dcp.async_save(state(), checkpoint_id=str(base / f"dcpp-{step}"), **kwargs)
        done = getattr(future, "upload_completion", None) or future
        done.add_done_callback(lambda _: durable_s.setdefault(name, []).append(time.perf_counter() - started))
        staging = getattr(future, "staging_completion", None)
        if staging is not None:
            staging.result()
        futures.append(future)

    return Peer(name, "dcp_process", save, wait)


def _torchsnapshot(base: Path, state: Callable[[], dict[str, Any]], app: dict[str, Any], every: int,
                   durable_s: dict[str, list[float]]) -> Peer:
    from torchsnapshot import Snapshot

    name = "torchsnapshot.async_take"
    waiters: list[threading.Thread] = []

    def wait() -> None:
        while waiters:
            waiters.pop(0).join()

    def save(step: int) -> None:
        wait()
        shutil.rmtree(base / f"snap-{step - 2 * every}", ignore_errors=True)
        started = time.perf_counter()
        pending = Snapshot.async_take(path=str(base / f"snap-{step}"), app_state=app)

        def durable() -> None:
            pending.wait()
            durable_s.setdefault(name, []).append(time.perf_counter() - started)

        waiter = threading.Thread(target=durable, name="snapshot-wait", daemon=True)
        waiter.start()
        waiters.append(waiter)

    return Peer(name, "torchsnapshot", save, wait)


def _deepspeed_torch(base: Path, state: Callable[[], dict[str, Any]], app: dict[str, Any], every: int,
                     durable_s: dict[str, list[float]]) -> Peer:
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine,
    )

    engine = TorchCheckpointEngine()

    def save(step: int) -> None:
        path = base / f"ds-{step}" / "mp_rank_00_model_states.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        engine.save(state(), str(path))
        engine.commit(f"global_step{step}")
        shutil.rmtree(base / f"ds-{step - 2 * every}", ignore_errors=True)

    return Peer("deepspeed TorchCheckpointEngine", "deepspeed_torch", save)


def _deepspeed_aio_reason() -> str:
    if importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed (the project's deepspeed extra)"
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if not AsyncIOBuilder().is_compatible(verbose=False):
        import deepspeed

        return (f"DeepSpeed {deepspeed.__version__} writes through its async_io op, which is not compatible here "
                "(it needs libaio, apt's libaio-dev, and a C++ toolchain to build the op on first use)")
    return ("needs a DeepSpeedConfig and a DeepSpeed engine to drive it (not a standalone save): "
            "not wired into this loop yet")


def _bytecheckpoint_reason() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, requires
        pins = [r for r in requires("bytecheckpoint") or [] if r.startswith(("torch", "grpcio", "protobuf"))]
        return f"bytecheckpoint requires {', '.join(pins)}: not runnable with torch 2.13.0"
    except PackageNotFoundError:
        return ("not installed; bytecheckpoint 0.0.2 (the newest on PyPI) requires torch<=2.5.0,>=2.1.0, "
                "grpcio==1.69.0 and protobuf==3.20.3, so it cannot install beside torch 2.13.0")


_MAKERS: dict[str, Callable[..., Peer]] = {
    "dcp-process": _dcp_process,
    "torchsnapshot": _torchsnapshot,
    "deepspeed-torch": _deepspeed_torch,
}
_REASONS: dict[str, Callable[[], str]] = {
    "deepspeed-fast": _deepspeed_aio_reason,
    "deepspeed-decoupled": _deepspeed_aio_reason,
    "bytecheckpoint": _bytecheckpoint_reason,
}


def make_peers(which: list[str], base: Path, state: Callable[[], dict[str, Any]], app: dict[str, Any], every: int,
               durable_s: dict[str, list[float]]) -> tuple[list[Peer], dict[str, str]]:
    """The peers of ``which`` that run here, and for each other one the reason it does not."""
    runnable: list[Peer] = []
    reasons: dict[str, str] = {}
    for key in which:
        if key in _REASONS:
            reasons[key] = _REASONS[key]()
            continue
        if key not in _MAKERS:
            reasons[key] = f"unknown peer (known: {', '.join(PEERS)})"
            continue
        try:
            runnable.append(_MAKERS[key](base, state, app, every, durable_s))
        except ImportError as exc:
            reasons[key] = f"not installed here ({exc})"
        except Exception as exc:  # noqa: BLE001 - a peer that fails to set up is reported, not fatal
            reasons[key] = f"fails to set up: {type(exc).__name__}: {exc}"
    return runnable, reasons
