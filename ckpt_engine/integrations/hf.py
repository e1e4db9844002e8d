"""Hugging Face Trainer integration: periodic saves become concurrent checkpoints, resume finds verified ones.

Uses only the Trainer's public extension points (a TrainerCallback and ``add_callback``)
plus two instance-level wraps: the Trainer's checkpoint-save step and ``train`` (to
resolve ``resume_from_checkpoint=True`` / ``CKPT_LAST_STEP`` to a verified checkpoint).
The Trainer itself does all loading, so a plain Trainer can also resume from these
directories. With several ranks (DeepSpeed ZeRO-1/2/3 or DDP) every rank writes its own
files (its ZeRO shards, its RNG state) into the same checkpoint and rank 0 commits it
(:mod:`ckpt_engine.multirank`).
Under ZeRO-3 the model weights are partitioned: ``model.safetensors`` holds the weights
gathered as the Trainer gathers them (``stage3_gather_16bit_weights_on_model_save``), or
is left out, as the Trainer leaves it out, when that is off (the DeepSpeed shards hold
the weights; ``zero_to_fp32.py`` recovers them).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from ckpt_engine.config import RuntimeConfig
from ckpt_engine.contract import (
    CONCURRENT_DIR,
    LAST_STEP_ENV,
    TRAINER_STATE_NAME,
    attempt_from_env,
    checkpoint_dir,
    parse_step,
)
from ckpt_engine.engine import CheckpointEngine, SaveHandle
from ckpt_engine.errors import ConfigError
from ckpt_engine.formats import (
    BytesFile,
    FilePlan,
    gc_paused,
    plan_safetensors,
    plan_torch_file,
)
from ckpt_engine.manifest import list_checkpoint_steps, verify_checkpoint
from ckpt_engine.metrics import recorder as metrics_recorder
from ckpt_engine.signals import GracefulTermination, StopVote, finish_process_group

log = logging.getLogger("ckpt_engine")

MIRROR_EXIT_MARGIN_S = 2.0  # after SIGTERM, stop waiting for the mirror this long before the grace period ends


def ensure_visible_logging() -> None:
    """Make the engine's INFO lines reach stderr when the script configured no logging."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def collect_rng_state() -> dict[str, Any]:
    """RNG states in the layout the Trainer's resume expects in ``rng_state.pth``."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all() if torch.distributed.is_initialized() \
            else torch.cuda.random.get_rng_state()
    return states


class ConcurrentCheckpointCallback(TrainerCallback):
    """Trainer hooks: wait for staging before the optimizer, finish saves at the end, react to SIGTERM."""

    def __init__(self, owner: DecoratedCheckpointing) -> None:
        self.owner = owner

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer has loaded the checkpoint it resumes from (model, optimizer, scheduler): the restore's end."""
        if self.owner.restored_at is None:
            self.owner.restored_at = time.time()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Lazy staging must finish before parameters change."""
        self.owner.engine.wait_staged()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Record progress, surface a failed checkpoint (``on_error='raise'``), react to SIGTERM."""
        self.owner.engine.record_step(state.global_step)
        if self.owner.engine.metrics is not None:  # an append; the sampler thread does the rest
            self.owner.engine.metrics.note_step(state.global_step, _samples_per_step(args),
                                                getattr(state, "num_input_tokens_seen", None))
        if not self.owner.first_step_noted:
            self.owner.note_first_step(state.global_step)
        self.owner.engine.raise_if_failed()
        if self.owner.stop_requested():
            control.should_save = True
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Stamp the Trainer's newest log entry with the wall time and SAT's attempt number.

        ``log_history`` travels inside every checkpoint's ``trainer_state.json`` (and so
        survives failover); the stamps let the Training Jobs page plot loss and steps/s over
        time, with each attempt marked. Names carry a ``sat_`` prefix; nothing else changes.
        """
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].setdefault("sat_time", round(time.time(), 3))
            attempt = attempt_from_env()
            if attempt is not None:
                state.log_history[-1].setdefault("sat_attempt", attempt)
        if logs and self.owner.engine.metrics is not None:
            self.owner.engine.metrics.note_log(logs, state.global_step, _samples_per_step(args),
                                               getattr(state, "num_input_tokens_seen", None))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Every in-flight checkpoint is committed (and mirrored, bounded) before train() returns."""
        vote = self.owner.stop_vote
        if vote is not None and vote.drain():  # a SIGTERM during the last step, seen by another rank
            self.owner.termination.request("another rank received SIGTERM")
        self.owner.wait()
        if self.owner.engine.metrics is not None and not self.owner.termination.requested:
            self.owner.engine.metrics.sample()  # the end of training is in the series, not an interval later
        release_process_group_at_exit()


def release_process_group_at_exit() -> None:
    """After a training that ended normally, destroy the default process group when the interpreter exits.

    Scripts of the original service never call ``destroy_process_group``. Left to the
    interpreter's finalization, gloo's worker threads may still hold work objects whose
    tensors need the GIL: the process then dies with ``terminate called without an active
    exception`` (SIGABRT) after training succeeded, and torchrun reports the job failed
    (pytorch/pytorch#190489; torch's own atexit handler for it was abandoned, #179291).
    Registered only when ``train()`` reached its end, as torchtitan does (a rank that failed
    mid-collective must not block in a teardown); the user's own later call makes it a no-op.
    """
    import atexit

    atexit.unregister(finish_process_group)  # once, however many trainers ended
    atexit.register(finish_process_group)


def _samples_per_step(args: Any) -> float | None:
    """Samples per optimizer step across all ranks (None when the Trainer's arguments do not say)."""
    try:
        return float(args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1))
    except (AttributeError, TypeError):
        return None


class DecoratedCheckpointing:
    """Hooks a Hugging Face Trainer so that its periodic saves become concurrent checkpoints.

    Call order: build the Trainer -> ``DecoratedCheckpointing(runtime_config={...,
    "trainer": trainer}, rank=local_rank)`` -> ``trainer.train(resume_from_checkpoint=...)``.
    ``resume_from_checkpoint=True`` (or ``CKPT_LAST_STEP=-1``) resumes from the newest
    complete, verified checkpoint (concurrent or the Trainer's own); ``CKPT_LAST_STEP=n``
    from step n (falling back past a corrupt one). With ``mirror_url`` (or
    ``CKPT_MIRROR_URL``) checkpoints are also copied to Object Storage, and a resume first
    restores the newest complete mirrored one the local directory lacks. See RuntimeConfig.
    With DeepSpeed (ZeRO-1/2/3) and world size > 1 it must be constructed on every rank
    (a broadcast agrees on a run token); rank 0 commits what all ranks wrote.
    """

    def __init__(self, runtime_config: Mapping[str, Any], rank: int = -1) -> None:
        self.config = RuntimeConfig.from_mapping(runtime_config)
        trainer = self.config.trainer
        if trainer is None or not hasattr(trainer, "_save_checkpoint") or not hasattr(trainer, "args"):
            raise ConfigError("runtime_config['trainer'] must be a transformers.Trainer")
        ensure_visible_logging()
        self.trainer = trainer
        self.rank = rank
        self.root = self.config.checkpoint_dir or os.path.join(trainer.args.output_dir, CONCURRENT_DIR)
        self.is_writer = trainer.args.process_index == 0
        self.engine = CheckpointEngine(
            self.root, host_cache_size=self.config.host_cache_size, parser_threads=self.config.parser_threads,
            pin_host_cache=self.config.pin_host_cache, keep_last=self.retention(),
            max_in_flight=self.config.max_in_flight, on_error=self.config.on_error,
            rank=max(rank, 0) if trainer.args.process_index == 0 else 1, mirror_url=self.config.effective_mirror_url())
        self.termination = GracefulTermination(self.config.effective_grace_seconds(), on_timeout=self._grace_expired)
        if self.config.handle_sigterm:
            self.termination.install()
        metrics_recorder()  # every node's local rank 0 samples its node (ckpt_engine.metrics), rank 0 the rest
        self.callback = ConcurrentCheckpointCallback(self)
        trainer.add_callback(self.callback)
        self._trainer_save_checkpoint = trainer._save_checkpoint
        self._trainer_train = trainer.train
        trainer._save_checkpoint = self._save_checkpoint
        trainer.train = self.train
        from ckpt_engine.integrations.elastic import adapt_to_world_size

        adapt_to_world_size(trainer)  # another world size than the checkpoint's (ADR 0029): global batch, RNG states
        if hasattr(trainer, "_load_best_model"):  # load_best_model_at_end: the best checkpoint may be in flight
            self._trainer_load_best_model = trainer._load_best_model
            trainer._load_best_model = self._load_best_model
        self.last_handle: SaveHandle | None = None
        self._warned_multirank = False
        self._warned_zero3_weights = False
        self._multirank_off = ""  # why the multi-rank commit is not in use, when it is not
        self.stop_vote: StopVote | None = None  # several ranks: they agree on when to stop for SIGTERM
        # How this process's training started (time.time()): train() called, checkpoint loaded, first step done
        self.restore_started_at: float | None = None
        self.restored_at: float | None = None
        self.resumed_from_step: int | None = None
        self.downloaded_step: int | None = None  # the step restored from Object Storage, if any
        self.first_step_noted = False
        if trainer.args.world_size > 1:
            self._setup_multirank()

    def retention(self) -> int:
        """Committed checkpoints kept (0 = all): the Trainer's ``save_total_limit`` when set, else ``keep_last``.

        ``save_total_limit=None`` with no ``keep_last`` keeps every checkpoint, as the Trainer
        does. The best checkpoint of ``load_best_model_at_end`` is always kept on top.
        """
        limit = self.trainer.args.save_total_limit
        if limit is not None:
            if self.config.keep_last is not None and self.config.keep_last != limit:
                log.warning("[Concurrent Checkpoint] save_total_limit=%d decides retention; runtime_config "
                            "keep_last=%d is ignored", limit, self.config.keep_last)
            return max(int(limit), 0)
        return self.config.keep_last if self.config.keep_last is not None else 0

    def _load_best_model(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's ``_load_best_model`` once every checkpoint in flight is committed."""
        self.wait()
        return self._trainer_load_best_model(*args, **kwargs)

    def _track_best_checkpoint(self, step: int) -> None:
        """Point ``best_model_checkpoint`` at the concurrent checkpoint of the best step, and keep it.

        The Trainer's own ``_save_checkpoint`` does this for its directories; the best step may
        be the one being saved now (committed later: ``_load_best_model`` waits for it).
        """
        state = self.trainer.state
        best = getattr(state, "best_global_step", None)
        if not best:
            return
        path = os.path.join(self.root, checkpoint_dir(best))
        if best == step or os.path.isdir(path):
            state.best_model_checkpoint = path
            self.engine.protected_steps = {best}

    def _setup_multirank(self) -> None:
        """Several ranks: every rank writes its part of each checkpoint, rank 0 commits.

        The parts: under DeepSpeed each rank's ZeRO shards, and under DeepSpeed or DDP each
        rank's ``rng_state_<rank>.pth``, which the Trainer restores per process. Runs on
        every rank's training thread at construction: agrees on a run token (a broadcast)
        and checks that all ranks see the checkpoint root. Without that, DeepSpeed saves
        stay the Trainer's synchronous ones and under DDP rank 0 writes alone (without the
        other ranks' RNG states, logged). See :mod:`ckpt_engine.multirank`.
        """
        import torch.distributed as dist

        from ckpt_engine.multirank import RankCoordinator, agree_run_token

        args = self.trainer.args
        if not (dist.is_available() and dist.is_initialized()):
            self._multirank_off = "torch.distributed is not initialized"
            return
        if self.config.handle_sigterm and dist.get_world_size() > 1:
            self.stop_vote = StopVote()
        token = agree_run_token(self.engine.storage, args.process_index, args.world_size)
        if token is None:
            self._multirank_off = f"not every rank sees {self.root}"
            return
        self.engine.coordinator = RankCoordinator(args.process_index, args.world_size, token,
                                                  timeout_s=float(self.config.commit_timeout_s))
        log.info("[Concurrent Checkpoint] rank %d of %d writes its part of each checkpoint (run %s)",
                 args.process_index, args.world_size, token)

    def stop_requested(self) -> bool:
        """Whether to take the final checkpoint and stop at this step (every rank's answer is the same)."""
        if self.stop_vote is None:
            return self.termination.requested
        if self.stop_vote.poll(self.termination.requested):
            self.termination.request("another rank received SIGTERM")  # no-op on a rank that got the signal
            return True
        return False

    # ---- resume -------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train`` with ``True`` / ``CKPT_LAST_STEP`` resolved to a verified checkpoint path."""
        if self.restore_started_at is None:  # the script is ready: imports, model and data are done
            self.restore_started_at = time.time()
        if resume_from_checkpoint is True:
            step = self.requested_step()
            self.downloaded_step = self.restore_from_mirror(step)
            resume_from_checkpoint = self.resolve_resume(step)
        elif isinstance(resume_from_checkpoint, str):
            self.resumed_from_step = parse_step(os.path.basename(os.path.normpath(resume_from_checkpoint)))
        if isinstance(resume_from_checkpoint, str):  # DeepSpeed saved by another world size: its universal view
            from ckpt_engine.integrations.elastic import resume_on_another_world_size

            resume_from_checkpoint = resume_on_another_world_size(self.trainer, resume_from_checkpoint, self.root)
        try:
            output = self._trainer_train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.wait()
        if self.termination.requested:
            self.termination.finish()
        return output

    @staticmethod
    def requested_step() -> int:
        """Step asked for by ``CKPT_LAST_STEP`` (-1, the newest, when unset)."""
        raw = os.environ.get(LAST_STEP_ENV, "-1").strip() or "-1"
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{LAST_STEP_ENV}={raw!r} is not an integer step") from None

    def resolve_resume(self, step: int = -1) -> str | None:
        """Path of the checkpoint to resume from, or None (logged) to start fresh.

        With several ranks (``torch.distributed`` initialized) every rank must call this, as
        ``train()`` does: rank 0's list of candidates is broadcast, each rank hashes only its
        share of a candidate's files (the checkpoint is read once in all, not once per rank),
        and the ranks exchange their findings, so all of them skip or take the same one.
        """
        group = _process_group()
        candidates: list[tuple[int, int, str]] = []
        for found in list_checkpoint_steps(self.engine.storage):
            candidates.append((found, 1, os.path.join(self.root, checkpoint_dir(found))))
        output_dir = self.trainer.args.output_dir
        for name in os.listdir(output_dir) if os.path.isdir(output_dir) else []:
            trainer_step = parse_step(name)
            if trainer_step is not None:
                candidates.append((trainer_step, 0, os.path.join(output_dir, name)))
        candidates.sort(reverse=True)
        if group is not None:
            candidates = _broadcast_from_rank0(candidates)
        for found, concurrent, path in candidates:
            if step >= 0 and found > step:
                continue
            problem = self._check_candidate(path, concurrent=bool(concurrent), share=group)
            if group is not None:
                problem = _gather_problems(problem)
            if problem:
                log.warning("[Concurrent Checkpoint] checkpoint-%d at %s is not usable, skipping it: %s",
                            found, path, problem)
                continue
            if step >= 0 and found != step:
                log.warning("[Concurrent Checkpoint] checkpoint-%d requested but not usable; falling back to "
                            "checkpoint-%d", step, found)
            log.info("[Concurrent Checkpoint] Resuming from checkpoint-%d (%s)", found, path)
            self.engine.record_resume(found)
            self.resumed_from_step = found
            return path
        log.info("[Concurrent Checkpoint] No Checkpoint found with step: %d", step)
        return None

    def _check_candidate(self, path: str, *, concurrent: bool, share: tuple[int, int] | None = None) -> str | None:
        if concurrent:
            report = verify_checkpoint(self.engine.storage, os.path.basename(path), share=share)
            if share is not None and report.manifest is not None:
                files = report.manifest.files
                log.info("[Concurrent Checkpoint] %s: rank %d of %d checked the checksums of %d of %d files "
                         "(%.1f of %.1f MB); the other ranks check the rest", os.path.basename(path), share[0],
                         share[1], len(report.hashed), len(files),
                         sum(files[name].size for name in report.hashed) / 1e6,
                         sum(entry.size for entry in files.values()) / 1e6)
            return None if report.ok else "; ".join(report.problems)
        if not os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
            return f"no {TRAINER_STATE_NAME} (incomplete Trainer checkpoint)"
        return None

    def note_first_step(self, step: int) -> None:
        """The first optimizer step of this process is done: log and record how the training started.

        restore = ``train()`` called -> the Trainer's ``on_train_begin`` (the checkpoint found,
        verified and loaded); first step = from there to the end of the first step (the RNG
        states, the data loader skipping to the resume point, one step). The job report
        splits each fault's recovery with them (``MetricsRecorder.note_restore``).
        """
        self.first_step_noted = True
        now = time.time()
        started, restored = self.restore_started_at, self.restored_at
        if started is None or not self.is_writer:
            return
        if self.resumed_from_step is not None and restored is not None:
            source = ("Object Storage" if self.downloaded_step == self.resumed_from_step
                      else "the node-local copy")
            log.info("[Concurrent Checkpoint] restored checkpoint-%d from %s (verified) in %.2fs; "
                     "first step (%d) done %.2fs later",
                     self.resumed_from_step, source, restored - started, step, now - restored)
        if self.engine.metrics is not None:
            self.engine.metrics.note_restore(step=self.resumed_from_step, started_at=started, restored_at=restored,
                                             first_step=step, first_step_at=now)

    # ---- save ---------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any = None) -> None:
        trainer = self.trainer
        if self.config.keep_trainer_saves:
            self._trainer_save_checkpoint(model, trial)
        if trial is None and getattr(trainer, "hp_search_backend", None) is None:
            trainer.store_flos()
        step = trainer.state.global_step
        deepspeed = bool(getattr(trainer, "is_deepspeed_enabled", False))
        coordinator = self.engine.coordinator
        if getattr(trainer, "is_fsdp_enabled", False):
            # FSDP's model and optimizer state dicts are collective and sharded (FSDP.optim_state_dict):
            # rank 0 alone planning model.state_dict() would hang or save one shard
            self._use_trainer_saves(model, trial, "FSDP: concurrent FSDP checkpoints are not implemented")
            return
        if deepspeed and trainer.args.world_size > 1 and coordinator is None:
            # per-rank ZeRO shards need the cross-rank commit, which could not be set up: stay synchronous
            self._use_trainer_saves(model, trial, f"DeepSpeed with world size {trainer.args.world_size}: no "
                                                  f"concurrent multi-rank commit: {self._multirank_off}")
            return
        if coordinator is not None:
            coordinator.next_save()  # every rank, every save: the shared temp name stays agreed
        elif not self.is_writer:
            return
        elif trainer.args.world_size > 1 and not self._warned_multirank:
            log.warning("[Concurrent Checkpoint] world size %d: rank 0 writes each checkpoint alone; the other "
                        "ranks' RNG states (rng_state_<rank>.pth) are not saved (no multi-rank commit: %s)",
                        trainer.args.world_size, self._multirank_off)
            self._warned_multirank = True
        self._track_best_checkpoint(step)
        files = self.plan_checkpoint(step, deepspeed=deepspeed)
        lazy = not deepspeed  # DeepSpeed steps its optimizer inside backward(): stage before returning
        self.last_handle = self.engine.save_files(step, files, layout="hf", lazy=lazy,
                                                  metadata={"global_step": step, "deepspeed": deepspeed})
        if self.termination.requested:
            self.termination.note_final_checkpoint(step)

    def _use_trainer_saves(self, model: Any, trial: Any, reason: str) -> None:
        """Save this checkpoint the Trainer's own (synchronous) way; say why, once."""
        if not self._warned_multirank:
            log.warning("[Concurrent Checkpoint] using the Trainer's own synchronous checkpoints (%s)", reason)
            self._warned_multirank = True
        if not self.config.keep_trainer_saves:  # else it has already saved this one
            self._trainer_save_checkpoint(model, trial)

    @gc_paused()
    def plan_checkpoint(self, step: int, *, deepspeed: bool = False) -> list[FilePlan]:
        """The files of an HF-layout checkpoint at ``step`` (only metadata is copied here).

        On a non-zero rank of a multi-rank run only that rank's part: its
        ``rng_state_<rank>.pth`` and, under DeepSpeed, its ZeRO shards. Under ZeRO-3 every
        rank first takes part in the weights gather (:meth:`_model_weights`).
        """
        trainer, args = self.trainer, self.trainer.args
        weights = self._model_weights(deepspeed)  # under ZeRO-3 a gather every rank takes part in
        if not self.is_writer:
            if args.save_only_model:
                return []
            files = []
            if deepspeed:
                from ckpt_engine.integrations.deepspeed import plan_deepspeed_files

                files = plan_deepspeed_files(trainer.model_wrapped, step, self.root, write_latest=False)
            files.append(plan_torch_file(f"rng_state_{args.process_index}.pth", collect_rng_state()))
            return files
        model = trainer.model
        files: list[FilePlan] = []
        if weights is not None:
            files.append(plan_safetensors("model.safetensors", weights, {"format": "pt"}))
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            files.append(BytesFile(name="config.json", data=config.to_json_string().encode()))
        generation = getattr(model, "generation_config", None)
        if generation is not None and hasattr(generation, "to_json_string"):
            files.append(BytesFile(name="generation_config.json", data=generation.to_json_string().encode()))
        if not args.save_only_model:
            if deepspeed:
                from ckpt_engine.integrations.deepspeed import plan_deepspeed_files

                files.extend(plan_deepspeed_files(trainer.model_wrapped, step, self.root))
            elif trainer.optimizer is not None:
                files.append(plan_torch_file("optimizer.pt", trainer.optimizer.state_dict()))
            if trainer.lr_scheduler is not None and (not deepspeed or not _is_deepspeed_scheduler(trainer)):
                files.append(plan_torch_file("scheduler.pt", trainer.lr_scheduler.state_dict()))
            scaler = getattr(trainer.accelerator, "scaler", None)
            if scaler is not None:
                files.append(plan_torch_file("scaler.pt", scaler.state_dict()))
            rng_name = "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
            files.append(plan_torch_file(rng_name, collect_rng_state()))
        files.append(BytesFile(name=TRAINER_STATE_NAME, data=self._trainer_state_json()))
        files.append(BytesFile(name="training_args.bin", data=_torch_bytes(args)))
        return files

    def _model_weights(self, deepspeed: bool) -> Mapping[str, torch.Tensor] | None:
        """The weights for ``model.safetensors``: the model's own, or under ZeRO-3 gathered as the Trainer does.

        ZeRO-3 leaves each rank only its partition (``state_dict()`` holds empty
        placeholders), so every rank takes part in DeepSpeed's gather and rank 0 gets the
        full weights (fresh host tensors). With ``stage3_gather_16bit_weights_on_model_save``
        off there is nothing to gather: None, and the checkpoint's weights are the
        DeepSpeed shards alone, as in the Trainer's own checkpoints.
        """
        trainer = self.trainer
        if not (deepspeed and _zero_stage(trainer) == 3):
            return trainer.model.state_dict() if self.is_writer else None
        try:
            weights = trainer.accelerator.get_state_dict(trainer.deepspeed)
        except ValueError:  # accelerate: stage3_gather_16bit_weights_on_model_save is false
            if self.is_writer and not self._warned_zero3_weights:
                log.warning("[Concurrent Checkpoint] ZeRO-3 without stage3_gather_16bit_weights_on_model_save: "
                            "checkpoints hold no model.safetensors; the weights are in the DeepSpeed shards "
                            "(global_step<N>/, zero_to_fp32.py recovers them)")
                self._warned_zero3_weights = True
            return None
        return weights if self.is_writer else None

    def _trainer_state_json(self) -> bytes:
        from transformers.trainer_callback import ExportableState

        trainer = self.trainer
        for callback in trainer.callback_handler.callbacks + [trainer.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                if isinstance(trainer.state.stateful_callbacks.get(name), list):
                    trainer.state.stateful_callbacks[name].append(callback.state())
                else:
                    trainer.state.stateful_callbacks[name] = callback.state()
        return (json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n").encode()

    def _grace_expired(self) -> None:
        log.error("[Concurrent Checkpoint] grace period expired before the final checkpoint committed; exiting")

    def wait(self) -> None:
        """Block until every in-flight checkpoint is committed and mirrored (bounded; within the grace period)."""
        self.engine.wait(mirror_deadline=self.mirror_deadline())

    def mirror_deadline(self) -> float | None:
        """When to stop waiting for the mirror (``time.monotonic()``): None (the default bound) unless SIGTERM came."""
        started = self.termination.requested_at
        if not self.termination.requested or started is None:
            return None
        return started + self.termination.grace_seconds - MIRROR_EXIT_MARGIN_S

    def restore_from_mirror(self, step: int = -1) -> int | None:
        """Download the newest complete mirrored checkpoint (or ``step``) when the local root lacks it."""
        url = self.config.effective_mirror_url()
        if url is None:
            return None
        from ckpt_engine.mirror import restore_from_mirror

        with self.trainer.args.main_process_first(local=True, desc="restore the checkpoint mirror"):
            return restore_from_mirror(self.engine.storage, url, step)


def _process_group() -> tuple[int, int] | None:
    """(rank, world size) of the default process group when several ranks run, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


def _broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a collective)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather_problems(problem: str | None) -> str | None:
    """Every rank's finding about one candidate, joined (a collective): None only if no rank found a problem."""
    import torch.distributed as dist

    found: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(found, problem)
    reported = [f"rank {rank}: {text}" for rank, text in enumerate(found) if text]
    return "; ".join(reported) or None


def _zero_stage(trainer: Any) -> int | None:
    """The DeepSpeed ZeRO stage the Trainer runs with (None without DeepSpeed)."""
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    return getattr(getattr(state, "deepspeed_plugin", None), "zero_stage", None)


def _is_deepspeed_scheduler(trainer: Any) -> bool:
    try:
        from accelerate.utils import DeepSpeedSchedulerWrapper
    except ImportError:  # pragma: no cover - accelerate always ships it
        return False
    return isinstance(trainer.lr_scheduler, DeepSpeedSchedulerWrapper)
