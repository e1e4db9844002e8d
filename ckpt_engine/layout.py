"""The on-disk layout of a checkpoint root: every name and prefix the engine, the mirror, storage and readers share.

    <output_dir>/concurrent_checkpoint/       CONCURRENT_DIR (the HF integration's root)
        checkpoint-<step>/                    checkpoint_dir(step): one committed checkpoint
            <files>..., manifest.json         MANIFEST_NAME, written last: no manifest = no checkpoint
        .tmp-checkpoint-<step>-<id>/          TMP_PREFIX: a checkpoint being written
        .trash-<name>-<id>/                   TRASH_PREFIX: one being deleted
        progress.json                         PROGRESS_NAME: what the orchestrator reads

A mirror (Object Storage) keeps the same names under its URL. Nothing here imports
anything but `re`, so every module can use it without import circles.
"""

from __future__ import annotations

import re

CONCURRENT_DIR = "concurrent_checkpoint"
MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = "progress.json"
CHECKPOINT_PREFIX = "checkpoint-"
TMP_PREFIX = ".tmp-checkpoint-"
TRASH_PREFIX = ".trash-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(step: int) -> str:
    """Directory name of the checkpoint for ``step``."""
    return f"{CHECKPOINT_PREFIX}{step}"


def parse_step(name: str) -> int | None:
    """The step of a ``checkpoint-<step>`` name, else None."""
    match = _CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None
