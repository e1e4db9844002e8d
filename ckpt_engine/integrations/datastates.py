"""The DataStates-LLM Python API, backed by SAT's engine: what the vendored ``datastates`` alias package re-exports.

Upstream (github.com/DataStates/datastates-llm) has shipped three module layouts; scripts
import from all of them, so the alias has all of them (ADR 0013 has the table):

* ``datastates``: ``CheckpointEngine(runtime_config={}, rank=0)`` (what DeepSpeed's
  ``datastates_ckpt`` config loads) and ``BaseCheckpointEngine(runtime_config={}, rank=0)``;
* ``datastates.llm``: ``Checkpointing(runtime_config={}, rank=0)`` and SAT's
  ``DecoratedCheckpointing`` (the service's Trainer scripts); ``datastates.llm.helper``
  and ``datastates.llm.deepspeed``: ``parse_config``, ``get_config_type``,
  ``get_checkpoint_version``, ``parse_ds_config``, ``get_ds_checkpoint_version``;
* ``datastates.ckpt``: ``CkptEngine(host_cache_size, gpu_device_id, rank)``, tensors written
  at byte offsets of files (``async_save`` / ``load`` / ``wait`` / ``commit``);
* ``datastates.utils``: ``get_logger(name)``.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ckpt_engine.config import DataStatesConfig
from ckpt_engine.errors import ConfigError, PersistError
from ckpt_engine.integrations.state_files import BaseCheckpointEngine

if TYPE_CHECKING:  # pragma: no cover
    from ckpt_engine.integrations.deepspeed import DataStatesEngine as CheckpointEngine
    from ckpt_engine.integrations.hf import DecoratedCheckpointing

__all__ = ["BaseCheckpointEngine", "CheckpointEngine", "Checkpointing", "CkptEngine", "DecoratedCheckpointing",
           "get_checkpoint_version", "get_config_type", "get_ds_checkpoint_version", "get_logger", "parse_config",
           "parse_ds_config"]

HOST_CACHE_SIZE = "host_cache_size"
CKPT_PARSER_THREADS = "parser_threads"
PIN_HOST_CACHE = "pin_host_cache"
FAST_CACHE_INIT = "fast_cache_init"
ENGINE_TYPE = "engine_type"
PROFILE_ENGINE = "profile_engine"
SUPPORTED_CONFIG_CLASSES = ("dict", "OrderedDict", "DeepSpeedConfig")
_GLOBAL_STEP = re.compile(r"/global_step(\d+)/")


def __getattr__(name: str) -> Any:
    # Each on first use: DeepSpeed's engine needs no transformers, the Trainer integration does.
    if name == "CheckpointEngine":
        from ckpt_engine.integrations.deepspeed import DataStatesEngine

        return DataStatesEngine
    if name == "DecoratedCheckpointing":
        from ckpt_engine.integrations.hf import DecoratedCheckpointing

        return DecoratedCheckpointing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- helpers (datastates.llm.helper, datastates.llm.deepspeed, datastates.utils) ----------------

def get_config_type(config: Any) -> str:
    """``'DeepSpeedConfig'`` for an object with a ``datastates_config``, ``'dict'`` for a mapping; else ConfigError."""
    if hasattr(config, "datastates_config"):
        return "DeepSpeedConfig"
    if isinstance(config, dict):
        return "dict"
    raise ConfigError(f"Config class ({type(config).__name__}) not supported. Please use one of "
                      f"{SUPPORTED_CONFIG_CLASSES}.")


def parse_config(config: Any) -> dict[str, Any]:
    """The validated DataStates settings of ``config`` (any accepted shape) as a dict of upstream keys."""
    return DataStatesConfig.from_any(config).as_dict()


def parse_ds_config(config: Any) -> dict[str, Any]:
    """The ``datastates_ckpt`` settings of a DeepSpeedConfig-like object (refused: disabled, offloaded params)."""
    if config is None or getattr(config, "datastates_config", None) is None:
        raise ConfigError("DeepSpeed config has no datastates_config (add a 'datastates_ckpt' section)")
    return DataStatesConfig.from_any(config).as_dict()


def get_ds_checkpoint_version(ckpt_path: str, last_version: int = -1) -> int:
    """N of a ``.../global_step<N>/<file>`` path, else ``last_version + 1``."""
    match = _GLOBAL_STEP.search(ckpt_path)
    return int(match.group(1)) if match else last_version + 1


def get_checkpoint_version(ckpt_path: str, last_version: int = -1) -> int:
    """The version a save of ``ckpt_path`` gets (the DeepSpeed global step when the path has one)."""
    return get_ds_checkpoint_version(ckpt_path, last_version)


def get_logger(logger_name: str) -> logging.Logger:
    """An INFO logger writing to stdout (once, however often it is asked for)."""
    logger = logging.getLogger(logger_name)
    logger.setLevel(logging.INFO)
    if not any(getattr(handler, "_datastates", False) for handler in logger.handlers):
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:"
                                               "%(funcName)s] %(message)s"))
        handler._datastates = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    return logger


# ---- datastates.llm.Checkpointing ------------------------------------------------------------

class Checkpointing(BaseCheckpointEngine):
    """``datastates.llm.Checkpointing(runtime_config={}, rank=0)``: the published scripts' engine.

    Same calls as BaseCheckpointEngine, with upstream's ``wait()`` (no argument; returns
    once every file is durable) and ``save_background`` (a synonym of ``save``).
    """

    def save_background(self, state_dict: Any, path: str) -> bool:
        """Same as :meth:`save` (upstream's worker entry point)."""
        return self.save(state_dict, path)

    def wait(self) -> None:  # type: ignore[override]
        """Block until every saved file is durable."""
        self._wait_durable()


# ---- datastates.ckpt.CkptEngine --------------------------------------------------------------

TensorSpec = tuple[int, torch.Tensor, int, str]


class CkptEngine:
    """``datastates.ckpt.CkptEngine(host_cache_size, gpu_device_id, rank)``: tensors at byte offsets of files.

    ``host_cache_size`` is in bytes here (as upstream), ``gpu_device_id`` is kept for the
    signature. Call order: ``async_save([(version, tensor, file_offset, path), ...])``
    (copies each tensor's bytes to host memory, then returns; writes at the offsets happen
    in the background) -> ``wait()`` (every write durable) or ``commit(tag)`` ->
    ``load([(version, tensor, file_offset, path), ...])`` (fills the tensors in place) ->
    ``shutdown()``.
    """

    def __init__(self, host_cache_size: int, gpu_device_id: int, rank: int) -> None:
        if isinstance(host_cache_size, bool) or not isinstance(host_cache_size, int) or host_cache_size < 0:
            raise ConfigError(f"host_cache_size={host_cache_size!r}: must be a number of bytes >= 0")
        self.host_cache_size, self.gpu_device_id, self.rank = host_cache_size, gpu_device_id, int(rank)
        self.last_ckpt_version = -1
        self._writer = cf.ThreadPoolExecutor(1, thread_name_prefix="datastates-ckpt")
        self._pending: list[cf.Future[None]] = []
        self._lock = threading.Lock()
        self._shut = False

    @staticmethod
    def _check(spec: Sequence[Any]) -> TensorSpec:
        version, tensor, offset, path = spec
        if not torch.is_tensor(tensor) or tensor.numel() * tensor.element_size() <= 0:
            raise ValueError(f"{path}: tensor at offset {offset} must be a non-empty tensor")
        if offset < 0:
            raise ValueError(f"{path}: file offset {offset} must be >= 0")
        return int(version), tensor, int(offset), str(path)

    def async_save(self, tensors: list[TensorSpec]) -> None:
        """Copy each tensor's bytes now; write them at ``file_offset`` of ``path`` in the background."""
        for spec in tensors:
            _, tensor, offset, path = self._check(spec)
            data = tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().clone().numpy().tobytes()
            future = self._writer.submit(_write_at, path, offset, data)
            with self._lock:
                self._pending.append(future)

    def load(self, tensors: list[TensorSpec]) -> None:
        """Fill each tensor in place from ``file_offset`` of ``path`` (after pending writes)."""
        self.wait()
        for spec in tensors:
            _, tensor, offset, path = self._check(spec)
            nbytes = tensor.numel() * tensor.element_size()
            size = os.path.getsize(path)
            if offset + nbytes > size:
                raise ValueError(f"{path}: tensor at offset {offset} ({nbytes} bytes) overflows the file ({size} "
                                 "bytes)")
            with open(path, "rb") as handle:
                handle.seek(offset)
                raw = bytearray(handle.read(nbytes))
            source = torch.frombuffer(raw, dtype=torch.uint8).view(tensor.dtype).view(tensor.shape)
            tensor.copy_(source)

    def wait(self) -> None:
        """Block until every write so far is durable; PersistError if one failed."""
        with self._lock:
            pending, self._pending = self._pending, []
        errors = [error for error in (future.exception() for future in pending) if error is not None]
        if errors:
            raise PersistError(f"{len(errors)} tensor write(s) failed: {errors[0]!r}") from errors[0]

    def commit(self, tag: Any) -> bool:
        """Every write durable; True (as upstream)."""
        self.wait()
        self.last_ckpt_version += 1
        return True

    def shutdown(self) -> None:
        """Wait for the writes, stop the writer thread; idempotent."""
        if self._shut:
            return
        self._shut = True
        try:
            self.wait()
        finally:
            self._writer.shutdown(wait=True)


def _write_at(path: str, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` of ``path`` (created if missing, never truncated) and fsync it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
        os.fsync(fd)
    finally:
        os.close(fd)
