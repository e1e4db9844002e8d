"""Helpers shared by the checkpoint engine tests (a uniquely named module, importable from test files)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def seed_env(vendor: Path, **extra: str) -> dict[str, str]:
    """Environment of a training container: PYTHONPATH is the vendor dir alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("CKPT_LAST_STEP", "PYTHONPATH")}
    env.update({"PYTHONPATH": str(vendor), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", "SEED_NO_SHM": "1"})
    env.update(extra)
    return env


def write_ds_config(path: Path, stage: int, zero: dict | None = None, **top: object) -> Path:
    """A DeepSpeed config for the seed script's Trainer ("auto" batch sizes) at ZeRO ``stage``."""
    config = {"zero_optimization": {"stage": stage, **(zero or {})}, "train_micro_batch_size_per_gpu": "auto",
              "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
              "zero_allow_untested_optimizer": True, **top}
    path.write_text(json.dumps(config))
    return path


def flip_byte(path: Path) -> None:
    """Corrupt a file in place: one byte in the middle inverted (the size stays)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def read_progress(root: Path) -> dict:
    """progress.json of a checkpoint root, or {} while it does not exist."""
    try:
        return json.loads((root / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
