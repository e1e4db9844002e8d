"""ckpt_engine: concurrent (asynchronous) checkpointing for PyTorch, the HF Trainer and DeepSpeed.

Layout: `contract` (the names, environment and records SAT and the engine share, ADR
0018), `storage` (where files go, by URL scheme), `manifest` (checksums, verification), `formats` and `pool` (planning and staging
tensors), `engine` (stage, persist, commit), `multirank`, `mirror`, `signals`,
`integrations` (HF Trainer, DeepSpeed, the DataStates surface), `cli`, `vendor`, `launch`.

Every name below is imported on first access (PEP 562), so `import ckpt_engine.cli` (the
`sat ckpt` command) does not import torch; `CheckpointEngine` does.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointEngine": "ckpt_engine.engine", "CommitRecord": "ckpt_engine.engine",
    "ProgressRecord": "ckpt_engine.contract", "SaveHandle": "ckpt_engine.engine",
    "CheckpointError": "ckpt_engine.errors", "CheckpointNotFoundError": "ckpt_engine.errors",
    "ConfigError": "ckpt_engine.errors", "CorruptCheckpointError": "ckpt_engine.errors",
    "PersistError": "ckpt_engine.errors", "StorageError": "ckpt_engine.errors",
    "UnsupportedSchemeError": "ckpt_engine.errors",
    "Manifest": "ckpt_engine.contract", "VerifyReport": "ckpt_engine.manifest",
    "verify_checkpoint": "ckpt_engine.manifest",
    "Storage": "ckpt_engine.storage", "FileStorage": "ckpt_engine.storage", "MemoryStorage": "ckpt_engine.storage",
    "FaultyStorage": "ckpt_engine.storage", "open_storage": "ckpt_engine.storage",
    "register_scheme": "ckpt_engine.storage",
    "DecoratedCheckpointing": "ckpt_engine.integrations.hf",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - a list, computed from the lazy exports above


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ckpt_engine' has no attribute {name!r}")
