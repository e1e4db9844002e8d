"""Lay out a CHECKPOINT_VENDOR directory: the engine plus a ``datastates`` alias, usable with PYTHONPATH alone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_SURFACE = "ckpt_engine.integrations.datastates"


def _alias(doc: str, names: str, *, lazy: str = "") -> str:
    """Source of one alias module: ``names`` from the DataStates surface, ``lazy`` ones on first use."""
    text = f'''"""{doc}"""\n\nfrom {_SURFACE} import {names}\n'''
    if lazy:
        text += (f"\n\ndef __getattr__(name):\n    if name in {lazy.split()!r}:\n"
                 f"        import {_SURFACE} as surface\n\n        return getattr(surface, name)\n"
                 f"    raise AttributeError(f\"module {{__name__!r}} has no attribute {{name!r}}\")\n")
    return text


# Every module path DataStates-LLM has shipped (ADR 0013), each re-exporting SAT's implementation.
_DATASTATES_MODULES = {
    "__init__.py": _alias("Alias of ckpt_engine for scripts and DeepSpeed configs written for DataStates-LLM.",
                          "BaseCheckpointEngine, CheckpointEngine"),
    "llm/__init__.py": _alias("datastates.llm: Checkpointing, and SAT's DecoratedCheckpointing for the Trainer.",
                              "Checkpointing", lazy="DecoratedCheckpointing"),
    "llm/helper.py": _alias("datastates.llm.helper: config parsing.",
                            "CKPT_PARSER_THREADS, FAST_CACHE_INIT, HOST_CACHE_SIZE, PIN_HOST_CACHE, "
                            "SUPPORTED_CONFIG_CLASSES, get_checkpoint_version, get_config_type, parse_config"),
    "llm/deepspeed/__init__.py": _alias("datastates.llm.deepspeed: DeepSpeed config helpers.",
                                        "get_ds_checkpoint_version, parse_ds_config"),
    "llm/deepspeed/helper.py": _alias("datastates.llm.deepspeed.helper: DeepSpeed config helpers.",
                                      "get_ds_checkpoint_version, parse_ds_config"),
    "deepspeed/__init__.py": _alias("datastates.deepspeed: DeepSpeed config helpers.",
                                    "get_ds_checkpoint_version, parse_ds_config"),
    "deepspeed/helper.py": _alias("datastates.deepspeed.helper: DeepSpeed config helpers.",
                                  "get_ds_checkpoint_version, parse_ds_config"),
    "ckpt/__init__.py": _alias("datastates.ckpt: CkptEngine (tensors at file offsets) and BaseCheckpointEngine.",
                               "BaseCheckpointEngine, CkptEngine"),
    "engines/__init__.py": _alias("datastates.engines: CheckpointEngine and config parsing.",
                                  "BaseCheckpointEngine, CheckpointEngine, parse_config"),
    "engines/helper.py": _alias("datastates.engines.helper: config parsing.",
                                "ENGINE_TYPE, HOST_CACHE_SIZE, PROFILE_ENGINE, get_checkpoint_version, "
                                "get_config_type, parse_config"),
    "helper.py": _alias("datastates.helper: config parsing.",
                        "CKPT_PARSER_THREADS, HOST_CACHE_SIZE, get_checkpoint_version, get_config_type, parse_config"),
    "utils/__init__.py": _alias("datastates.utils: get_logger.", "get_logger"),
}


def write_vendor_dir(dest: str | os.PathLike[str]) -> Path:
    """Create or refresh ``dest`` with ``ckpt_engine/`` and ``datastates/``; idempotent; returns ``dest``."""
    dest_path = Path(dest).resolve()
    dest_path.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve().parent
    staging = Path(tempfile.mkdtemp(prefix=".vendor-", dir=dest_path))
    try:
        shutil.copytree(source, staging / "ckpt_engine", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        alias = staging / "datastates"
        for relative, source in _DATASTATES_MODULES.items():
            target = alias / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
        for name in ("ckpt_engine", "datastates"):
            target = dest_path / name
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest_path
