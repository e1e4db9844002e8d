"""The HF Trainer's checkpoint conventions under the engine: save_total_limit, load_best_model_at_end, save_only_model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_ckpt_trainer import Blocks
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from ckpt_engine import DecoratedCheckpointing


def make_trainer(output_dir: Path, **args: Any) -> Trainer:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    training = TrainingArguments(output_dir=str(output_dir), max_steps=8, save_steps=2, logging_steps=1,
                                 per_device_train_batch_size=4, report_to="none", disable_tqdm=True, seed=0,
                                 learning_rate=1e-3, **args)
    return Trainer(model=model, args=training, train_dataset=Blocks(), eval_dataset=Blocks())


def train(trainer: Trainer, **extra: Any) -> list[int]:
    """Train with the engine; the steps of the committed checkpoints, oldest first."""
    DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "parser_threads": 1, "pin_host_cache": True,
                                           "trainer": trainer, "handle_sigterm": False, **extra}, rank=-1)
    trainer.train()
    root = Path(trainer.args.output_dir) / "concurrent_checkpoint"
    return sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if (p / "manifest.json").exists())


@pytest.mark.parametrize("limit, extra, kept", [
    pytest.param(None, {}, [2, 4, 6, 8], id="no-limit-keeps-all"),
    pytest.param(2, {}, [6, 8], id="save_total_limit-2"),
    pytest.param(2, {"keep_last": 1}, [6, 8], id="save_total_limit-wins-over-keep_last"),
    pytest.param(None, {"keep_last": 1}, [8], id="keep_last-when-no-limit"),
])
def test_retention_follows_save_total_limit(tmp_path: Path, limit: int | None, extra: dict[str, Any],
                                            kept: list[int]) -> None:
    assert train(make_trainer(tmp_path, save_total_limit=limit), **extra) == kept


def test_load_best_model_at_end_keeps_and_loads_the_best_checkpoint(tmp_path: Path) -> None:
    # greater_is_better on eval_loss: the best is the first evaluation, far from the newest
    trainer = make_trainer(tmp_path, save_total_limit=1, eval_strategy="steps", eval_steps=2,
                           load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True)
    kept = train(trainer)
    best = trainer.state.best_global_step
    assert best and best != 8
    assert kept == sorted({best, 8})  # the newest (save_total_limit=1) and the best, never deleted
    best_dir = Path(trainer.state.best_model_checkpoint)
    assert best_dir == tmp_path / "concurrent_checkpoint" / f"checkpoint-{best}"
    saved = load_file(str(best_dir / "model.safetensors"))
    current = trainer.model.state_dict()
    assert all(torch.equal(current[name], tensor) for name, tensor in saved.items())  # the best model was loaded


def test_save_only_model_writes_no_optimizer_scheduler_or_rng_state(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, save_only_model=True)
    assert train(trainer) == [2, 4, 6, 8]
    files = {p.name for p in (tmp_path / "concurrent_checkpoint" / "checkpoint-8").iterdir()}
    assert "model.safetensors" in files and "trainer_state.json" in files
    assert not files & {"optimizer.pt", "scheduler.pt", "rng_state.pth"}
