"""Lay out a CHECKPOINT_VENDOR directory: the engine plus a ``datastates`` alias, usable with PYTHONPATH alone."""

from __future__ import annotations

import hashlib
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


STAMP = ".sat-engine"  # the engine's content hash, written last: a directory with it is complete
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def engine_hash() -> str:
    """A hash of what a vendor directory holds (the engine's sources and the alias modules)."""
    source = Path(__file__).resolve().parent
    digest = hashlib.sha256(repr(sorted(_DATASTATES_MODULES.items())).encode())
    for path in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix != ".pyc"):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def vendor_hash(dest: str | os.PathLike[str]) -> str | None:
    """The engine hash a vendor directory was laid out with (None: none, or not complete)."""
    try:
        return (Path(dest) / STAMP).read_text().strip() or None
    except OSError:
        return None


def lay_out_vendor_dir(dest: str | os.PathLike[str], *, reuse_from: str | os.PathLike[str] | None = None) -> str:
    """``dest`` holds this engine afterwards; how: ``present`` (it did), ``linked`` (hard links to
    ``reuse_from``'s files, which hold the same engine: a warm run's) or ``written`` (copied)."""
    dest_path = Path(dest).resolve()
    current = engine_hash()
    if vendor_hash(dest_path) == current:
        return "present"
    dest_path.mkdir(parents=True, exist_ok=True)
    (dest_path / STAMP).unlink(missing_ok=True)
    reuse = Path(reuse_from).resolve() if reuse_from is not None and vendor_hash(reuse_from) == current else None
    source = Path(__file__).resolve().parent
    staging = Path(tempfile.mkdtemp(prefix=".vendor-", dir=dest_path))
    try:
        if reuse is not None:
            try:
                for name in ("ckpt_engine", "datastates"):
                    shutil.copytree(reuse / name, staging / name, ignore=_IGNORED, copy_function=os.link)
            except OSError:  # another file system: copy instead
                reuse = None
                for name in ("ckpt_engine", "datastates"):
                    shutil.rmtree(staging / name, ignore_errors=True)
        if reuse is None:
            shutil.copytree(source, staging / "ckpt_engine", ignore=_IGNORED)
            alias = staging / "datastates"
            for relative, text in _DATASTATES_MODULES.items():
                target = alias / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        for name in ("ckpt_engine", "datastates"):
            target = dest_path / name
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging / name, target)
        (dest_path / STAMP).write_text(current + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return "linked" if reuse is not None else "written"


def write_vendor_dir(dest: str | os.PathLike[str]) -> Path:
    """Create or refresh ``dest`` with ``ckpt_engine/`` and ``datastates/``; idempotent; returns ``dest``."""
    lay_out_vendor_dir(dest)
    return Path(dest).resolve()
