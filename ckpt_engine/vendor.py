"""Lay out a CHECKPOINT_VENDOR directory: the engine plus a ``datastates`` alias, usable with PYTHONPATH alone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_DATASTATES_INIT = '''"""Alias of ckpt_engine for scripts and DeepSpeed configs written for DataStates."""

from ckpt_engine.integrations.deepspeed import DataStatesEngine as CheckpointEngine

__all__ = ["CheckpointEngine"]
'''

_DATASTATES_LLM = '''"""Alias of ckpt_engine's Hugging Face Trainer integration (``from datastates.llm import DecoratedCheckpointing``)."""

from ckpt_engine.integrations.hf import DecoratedCheckpointing

__all__ = ["DecoratedCheckpointing"]
'''


def write_vendor_dir(dest: str | os.PathLike[str]) -> Path:
    """Create or refresh ``dest`` with ``ckpt_engine/`` and ``datastates/``; idempotent; returns ``dest``."""
    dest_path = Path(dest).resolve()
    dest_path.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve().parent
    staging = Path(tempfile.mkdtemp(prefix=".vendor-", dir=dest_path))
    try:
        shutil.copytree(source, staging / "ckpt_engine", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        alias = staging / "datastates"
        alias.mkdir()
        (alias / "__init__.py").write_text(_DATASTATES_INIT)
        (alias / "llm.py").write_text(_DATASTATES_LLM)
        for name in ("ckpt_engine", "datastates"):
            target = dest_path / name
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest_path
