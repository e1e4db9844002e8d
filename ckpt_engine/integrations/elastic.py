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


# ---- DeepSpeed ZeRO: resharding through DeepSpeed's universal checkpoint ------------------------------------
UNIVERSAL_LAYOUT = "deepspeed-universal"
_ZERO_SHARD = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_zero_ranks(checkpoint: str) -> tuple[str, int] | None:
    """(the DeepSpeed tag ``latest`` names, how many ranks saved its ZeRO shards); None without a DeepSpeed part."""
    try:
        with open(os.path.join(checkpoint, "latest"), encoding="utf-8") as handle:
            tag = handle.read().strip()
        names = os.listdir(os.path.join(checkpoint, tag))
    except OSError:
        return None
    ranks = {int(m.group(1)) for name in names if (m := _ZERO_SHARD.match(name))}
    return (tag, len(ranks)) if ranks else None


def universal_view(checkpoint: str, root: str, world_size: int, *, is_writer: bool,
                   convert: Any = None) -> str | None:
    """For a DeepSpeed checkpoint saved by another number of ranks: its conversion to DeepSpeed's universal format.

    ``<root>/universal/checkpoint-<step>/`` (:data:`~ckpt_engine.planner.UNIVERSAL_DIR`) holds
    only what the conversion made: ``<tag>_universal/`` (DeepSpeed's ``ds_to_universal`` of the
    checkpoint's ZeRO shards), ``latest_universal`` and a ``manifest.json`` of those files
    (layout ``deepspeed-universal``) that also records the checksum of the checkpoint's own
    manifest. It is reused when it checks out against its manifest and was made from the
    checkpoint as it is now (a checkpoint of that step saved again gets a new conversion), else
    built again. It holds no link to the checkpoint's files, so an upload of the checkpoint
    root carries each file once; :func:`resume_dir` joins the two for the Trainer. Retention
    deletes a view with its checkpoint (:func:`ckpt_engine.writer.CheckpointWriter.apply_retention`).
    The checkpoint itself is not touched. None when the checkpoint needs no conversion (same
    world size, no ZeRO shards). The writer (rank 0) builds it; the caller makes the other ranks wait.
    """
    found = saved_zero_ranks(checkpoint)
    if found is None or found[1] == world_size:
        return None
    tag, saved = found
    from ckpt_engine.manifest import verify_checkpoint
    from ckpt_engine.planner import UNIVERSAL_DIR
    from ckpt_engine.storage.file import FileStorage

    name = os.path.basename(os.path.normpath(checkpoint))
    view = os.path.join(root, UNIVERSAL_DIR, name)
    if not is_writer:
        return view
    storage = FileStorage(os.path.join(root, UNIVERSAL_DIR))
    source = _manifest_checksum(checkpoint)
    if os.path.isdir(view):
        report = verify_checkpoint(storage, name)
        made_from = report.manifest.metadata.get("source_manifest") if report.manifest is not None else None
        if report.ok and source is not None and made_from == source:
            log.info("[Concurrent Checkpoint] elastic: %s was converted to DeepSpeed's universal format before (%s)",
                     name, view)
            return view
    log.info("[Concurrent Checkpoint] elastic: %s was saved by %d rank(s), %d now: converting its ZeRO shards to "
             "DeepSpeed's universal format (ds_to_universal) into %s", name, saved, world_size, view)
    _build_universal_view(checkpoint, view, tag, source, convert or _ds_to_universal)
    report = verify_checkpoint(storage, name)
    if not report.ok:
        raise ConfigError(f"the universal conversion of {name} does not check out: {'; '.join(report.problems)}")
    return view


def _manifest_checksum(checkpoint: str) -> str | None:
    """sha256 of the checkpoint's manifest.json (what its files are), None without one."""
    import hashlib

    from ckpt_engine.contract import MANIFEST_NAME

    try:
        with open(os.path.join(checkpoint, MANIFEST_NAME), "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def _build_universal_view(checkpoint: str, view: str, tag: str, source: str | None, convert: Any) -> None:
    import shutil

    from ckpt_engine.contract import MANIFEST_NAME, FileEntry, Manifest, parse_step
    from ckpt_engine.manifest import hash_file
    from ckpt_engine.storage.file import FileStorage

    staging = view + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(staging)
    convert(os.path.join(checkpoint, tag), os.path.join(staging, f"{tag}_universal"))
    with open(os.path.join(staging, "latest_universal"), "w", encoding="utf-8") as handle:
        handle.write(f"{tag}_universal")
    storage = FileStorage(staging)
    files = {}
    for folder, _dirs, names in os.walk(staging):
        for file_name in names:
            key = os.path.relpath(os.path.join(folder, file_name), staging)
            size, checksum = hash_file(storage, key)
            files[key] = FileEntry(size=size, checksum=checksum)
    step = parse_step(os.path.basename(os.path.normpath(checkpoint)))
    manifest = Manifest(step=-1 if step is None else step, files=files, layout=UNIVERSAL_LAYOUT,
                        metadata={"converted_from": os.path.abspath(checkpoint), "tag": tag,
                                  "source_manifest": source})
    with open(os.path.join(staging, MANIFEST_NAME), "wb") as handle:
        handle.write(manifest.to_json())
    os.replace(staging, view)


def resume_dir(checkpoint: str, view: str) -> str:
    """A temporary ``checkpoint-<step>/`` of links: the checkpoint's files and the view's conversion, for the Trainer.

    The Trainer resumes from one directory (weights, scheduler, trainer state, RNG states) and
    DeepSpeed's universal load reads ``latest_universal`` in that same directory. The links
    live in the system's temporary directory, not under the checkpoint root (which the results
    upload carries), and are removed when the process exits.
    """
    import atexit
    import shutil

    from ckpt_engine.contract import MANIFEST_NAME

    holder = tempfile.mkdtemp(prefix="ckpt-universal-")
    atexit.register(shutil.rmtree, holder, True)
    joined = os.path.join(holder, os.path.basename(os.path.normpath(checkpoint)))
    os.makedirs(joined)
    for folder in (checkpoint, view):  # the view's names (``latest_universal``, ``<tag>_universal``) are its own
        for entry in os.listdir(folder):
            target = os.path.join(joined, entry)
            if entry != MANIFEST_NAME and not os.path.lexists(target):
                os.symlink(os.path.abspath(os.path.join(folder, entry)), target)
    return joined


def _ds_to_universal(input_folder: str, output_folder: str) -> None:
    """DeepSpeed's own converter, as its CLI runs it (one worker each; missing client state injected)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           input_folder, "--output_folder", output_folder, "--num_extract_workers", "1",
                           "--num_merge_workers", "1", "--inject_missing_state"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigError(f"ds_to_universal of {input_folder} failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout)[-2000:]}")


def resume_on_another_world_size(trainer: Any, checkpoint: str | None, root: str) -> str | None:
    """The path the Trainer resumes from: ``checkpoint``, or for DeepSpeed saved by another world size a joined view.

    Called on every rank after the checkpoint is chosen, before ``Trainer.train`` builds the
    DeepSpeed engine: rank 0 converts (or reuses) the universal view, every rank joins it with
    the checkpoint (:func:`resume_dir`) and sets ``checkpoint.load_universal`` in the DeepSpeed
    config, so the engine loads ``latest_universal`` (its parameters and optimizer state
    resharded to this world size by DeepSpeed).
    """
    if checkpoint is None or not getattr(trainer, "is_deepspeed_enabled", False):
        return checkpoint
    args = trainer.args
    view = universal_view(checkpoint, root, args.world_size, is_writer=args.process_index == 0)
    if args.world_size > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # the writer has built (or found) the view
    if view is None:
        return checkpoint
    plugin = trainer.accelerator.state.deepspeed_plugin
    plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
    log.info("[Concurrent Checkpoint] elastic: rank %d of %d resumes from the universal view %s",
             args.process_index, args.world_size, view)
    trainer.add_callback(_separate_step_counts(trainer))
    return resume_dir(checkpoint, view)


def _separate_step_counts(trainer: Any) -> Any:
    """A callback that gives each optimizer state its own ``step`` tensor once the universal checkpoint is loaded.

    DeepSpeed 0.19's ZeRO-3 universal load (``load_hp_checkpoint_state_from_checkpoint_dir_stage3``)
    stores one and the same ``step`` tensor in the state of every flat fp32 partition. ZeRO-3
    steps the partitions one at a time and torch's Adam adds 1 to ``step`` in place, so each
    optimizer step then counted once per partition: the bias correction ran ahead and the
    losses after a ZeRO-3 resume drifted from the uninterrupted run's (measured: 1.4e-5 at the
    first step after the resume, 1.4e-3 at the second; with the tensors separated they are
    equal, tests/ckpt_engine/test_elastic_resume.py). ZeRO-1/2 loads give each its own already.
    ``on_train_begin`` runs after the Trainer loaded the checkpoint and before the first step.
    """
    from transformers import TrainerCallback

    class SeparateStepCounts(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            zero_optimizer = getattr(trainer.model_wrapped, "optimizer", None)
            base = getattr(zero_optimizer, "optimizer", None)
            seen: set[int] = set()
            for param_state in getattr(base, "state", {}).values():
                step = param_state.get("step")
                if step is None or not hasattr(step, "clone"):
                    continue
                if id(step) in seen:
                    param_state["step"] = step.clone()
                seen.add(id(param_state["step"]))

    return SeparateStepCounts()
