"""Resuming on another world size (issue 32, ADR 0029): the gradient accumulation scale and the per-rank RNG files.

What the Trainer does on its own (transformers 5.x `Trainer._load_rng_state`): at world size 1 it
reads `rng_state.pth`, at N `rng_state_<process_index>.pth`; a checkpoint of another world size has
no such file and the Trainer goes on with fresh RNG states ("Didn't find an RNG file ..."). The
engine's wrap hands it the saved rank `r mod W`'s file instead. The end-to-end shrink (2 ranks ->
1, loss and sample order against an uninterrupted run) is tests/e2e/test_elastic_failover.py.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_engine.errors import ConfigError
from ckpt_engine.integrations.elastic import (
    ACCUMULATION_SCALE_ENV,
    accumulation_scale,
    map_rng_states,
    rng_file_for,
    scale_accumulation,
)


def rng_state(seed: int) -> dict:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}


def checkpoint_of(tmp_path: Path, names: dict[str, int]) -> Path:
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    for name, seed in names.items():
        torch.save(rng_state(seed), folder / name)
    return folder


@pytest.mark.parametrize(("saved", "rank", "world", "expected"), [
    pytest.param({"rng_state_0.pth": 1, "rng_state_1.pth": 2}, 0, 1, ("rng_state.pth", "rng_state_0.pth"), id="2-to-1"),
    pytest.param({"rng_state_0.pth": 1, "rng_state_1.pth": 2}, 1, 2, None, id="same-world"),
    pytest.param({"rng_state.pth": 1}, 1, 2, ("rng_state_1.pth", "rng_state.pth"), id="1-to-2"),
    pytest.param({"rng_state_0.pth": 1, "rng_state_1.pth": 2}, 2, 3, ("rng_state_2.pth", "rng_state_0.pth"),
                 id="2-to-3-wraps"),
    pytest.param({}, 0, 1, None, id="no-rng-file"),
])
def test_each_new_rank_gets_a_saved_ranks_file(tmp_path, saved, rank, world, expected):
    assert rng_file_for(str(checkpoint_of(tmp_path, saved)), rank, world) == expected


class _Args:
    world_size, process_index, per_device_train_batch_size = 1, 0, 8

    def __init__(self, accumulation: int) -> None:
        self.gradient_accumulation_steps = accumulation


def test_the_accumulation_grows_by_the_launchers_factor_and_a_bad_factor_names_the_variable():
    args = _Args(3)
    assert scale_accumulation(args, {ACCUMULATION_SCALE_ENV: "2"}) == 2 and args.gradient_accumulation_steps == 6
    assert scale_accumulation(args, {}) == 1 and args.gradient_accumulation_steps == 6
    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError, match=f"{ACCUMULATION_SCALE_ENV}=.*must be a whole number >= 1"):
            accumulation_scale({ACCUMULATION_SCALE_ENV: bad})


def test_a_trainer_at_world_size_one_restores_rank_zeros_state_from_a_two_rank_checkpoint(tmp_path, caplog):
    """The Trainer's own `_load_rng_state`, wrapped: without the wrap it finds no `rng_state.pth` and restores nothing."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1))
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                                          report_to=[]))
    assert trainer.args.world_size == 1
    checkpoint = checkpoint_of(tmp_path, {"rng_state_0.pth": 11, "rng_state_1.pth": 22})
    wanted = torch.load(checkpoint / "rng_state_0.pth", weights_only=False)["cpu"]

    torch.manual_seed(99)
    trainer._load_rng_state(str(checkpoint))  # the Trainer alone: no rng_state.pth, nothing restored
    assert not torch.equal(torch.random.get_rng_state(), wanted)

    map_rng_states(trainer)
    torch.manual_seed(99)
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        trainer._load_rng_state(str(checkpoint))
    assert torch.equal(torch.random.get_rng_state(), wanted)
    assert "saved by 2 rank(s); rank 0 of 1 restores rng_state_0.pth" in caplog.text
    assert sorted(p.name for p in checkpoint.iterdir()) == ["rng_state_0.pth", "rng_state_1.pth"]  # left as it was
