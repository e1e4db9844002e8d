"""Resuming a Hugging Face Trainer on another world size (issue 32, ADR 0029): the global batch and the RNG states.

A DDP checkpoint is replicated (one model, one optimizer state, one scheduler, one
``trainer_state.json``), so it loads on any number of ranks; two things are per world size:

* the global batch: ranks x per-device batch x gradient accumulation. SAT's launcher sets
  ``SAT_GRAD_ACCUM_SCALE`` (``ACCUMULATION_SCALE_ENV``) to ``planned ranks // ranks now`` when an
  elastic failover resumed on fewer nodes; :func:`scale_accumulation` multiplies the Trainer's
  ``gradient_accumulation_steps`` by it before ``train()`` builds its loop, so the global batch,
  and with it the Trainer's step arithmetic (``global_step * accumulation`` batches skipped on
  resume, the scheduler's steps), is the planned one.
* the RNG states: each rank saved ``rng_state_<rank>.pth`` (``rng_state.pth`` at world size 1),
  and the Trainer loads only the name of its own world size: at world size 1 it looks for
  ``rng_state.pth``, at N for ``rng_state_<process_index>.pth``, and finding none it logs
  "Didn't find an RNG file ..." and goes on with fresh states. :func:`map_rng_states` wraps the
  Trainer's ``_load_rng_state`` so that rank ``r`` loads the saved rank ``r mod W``'s file
  (W: the saved world size), through a temporary directory holding a link under the name the
  Trainer looks for; the Trainer's own code then restores it.

Imports only the standard library at module level (SAT's launcher reads the variable's name).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

from ckpt_engine.errors import ConfigError

log = logging.getLogger("ckpt_engine")

#: Set by SAT's launcher on an attempt that runs on fewer ranks than planned: the factor by which
#: each rank's gradient accumulation grows so that the global batch stays the planned one.
ACCUMULATION_SCALE_ENV = "SAT_GRAD_ACCUM_SCALE"

_RANK_FILE = re.compile(r"^rng_state_(\d+)\.pth$")
SINGLE_RNG_FILE = "rng_state.pth"


def accumulation_scale(environ: Mapping[str, str] = os.environ) -> int:
    """The factor ``SAT_GRAD_ACCUM_SCALE`` asks for (1 when unset); ConfigError when it is not a whole number >= 1."""
    raw = (environ.get(ACCUMULATION_SCALE_ENV) or "").strip()
    if not raw:
        return 1
    try:
        scale = int(raw)
    except ValueError:
        scale = 0
    if scale < 1:
        raise ConfigError(f"{ACCUMULATION_SCALE_ENV}={raw!r}: must be a whole number >= 1")
    return scale


def scale_accumulation(args: Any, environ: Mapping[str, str] = os.environ) -> int:
    """Multiply ``args.gradient_accumulation_steps`` by the launcher's factor (once per call); returns the factor."""
    scale = accumulation_scale(environ)
    if scale == 1:
        return 1
    before = int(args.gradient_accumulation_steps)
    args.gradient_accumulation_steps = before * scale
    log.info("[Concurrent Checkpoint] elastic: %d rank(s) instead of %d: gradient accumulation %d -> %d "
             "(%s=%d), the global batch stays %d", args.world_size, args.world_size * scale, before,
             args.gradient_accumulation_steps, ACCUMULATION_SCALE_ENV, scale,
             args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1))
    return scale


def saved_rng_files(checkpoint: str) -> list[str]:
    """The RNG state files a checkpoint holds, by saved rank (``rng_state.pth`` alone: world size 1)."""
    try:
        names = os.listdir(checkpoint)
    except OSError:
        return []
    ranked = sorted((int(m.group(1)), name) for name in names if (m := _RANK_FILE.match(name)))
    if ranked:
        return [name for _rank, name in ranked]
    return [SINGLE_RNG_FILE] if SINGLE_RNG_FILE in names else []


def rng_file_for(checkpoint: str, process_index: int, world_size: int) -> tuple[str, str] | None:
    """(the name the Trainer looks for, the saved file rank ``process_index`` restores); None: the Trainer's own.

    None when the Trainer finds its own name (same world size) or the checkpoint has no RNG file.
    """
    wanted = SINGLE_RNG_FILE if world_size <= 1 else f"rng_state_{process_index}.pth"
    if os.path.isfile(os.path.join(checkpoint, wanted)):
        return None
    saved = saved_rng_files(checkpoint)
    if not saved:
        return None
    return wanted, saved[process_index % len(saved)]


def map_rng_states(trainer: Any) -> None:
    """Wrap ``trainer._load_rng_state`` (instance level) so a checkpoint of another world size restores RNG states."""
    original = trainer._load_rng_state

    def load_rng_state(checkpoint: str | None) -> None:
        args = trainer.args
        mapping = None if checkpoint is None else rng_file_for(checkpoint, args.process_index, args.world_size)
        if mapping is None:
            return original(checkpoint)
        wanted, source = mapping
        log.info("[Concurrent Checkpoint] elastic: the checkpoint was saved by %d rank(s); rank %d of %d restores "
                 "%s", len(saved_rng_files(checkpoint)), args.process_index, args.world_size, source)
        with tempfile.TemporaryDirectory(prefix="ckpt-rng-") as view:
            os.symlink(os.path.abspath(os.path.join(checkpoint, source)), os.path.join(view, wanted))
            return original(view)

    trainer._load_rng_state = load_rng_state


def adapt_to_world_size(trainer: Any, environ: Mapping[str, str] = os.environ) -> None:
    """Both adaptations, at ``DecoratedCheckpointing``'s construction (before ``train()``)."""
    scale_accumulation(trainer.args, environ)
    map_rng_states(trainer)
