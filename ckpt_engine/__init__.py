"""ckpt_engine: concurrent (asynchronous) checkpointing for PyTorch, the HF Trainer and DeepSpeed.

``CheckpointEngine`` is importable without transformers; ``DecoratedCheckpointing``
(which needs transformers) is imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckpt_engine.engine import CheckpointEngine, CommitRecord, ProgressRecord, SaveHandle
from ckpt_engine.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    PersistError,
    StorageError,
    UnsupportedSchemeError,
)
from ckpt_engine.manifest import Manifest, VerifyReport, verify_checkpoint
from ckpt_engine.storage import FaultyStorage, FileStorage, MemoryStorage, Storage, open_storage, register_scheme

if TYPE_CHECKING:
    from ckpt_engine.hf import DecoratedCheckpointing

__all__ = [
    "CheckpointEngine", "CheckpointError", "CheckpointNotFoundError", "CommitRecord", "ConfigError",
    "CorruptCheckpointError", "DecoratedCheckpointing", "FaultyStorage", "FileStorage", "Manifest",
    "MemoryStorage", "PersistError", "ProgressRecord", "SaveHandle", "Storage", "StorageError",
    "UnsupportedSchemeError", "VerifyReport", "open_storage", "register_scheme", "verify_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name == "DecoratedCheckpointing":
        from ckpt_engine.hf import DecoratedCheckpointing

        return DecoratedCheckpointing
    raise AttributeError(f"module 'ckpt_engine' has no attribute {name!r}")
