"""In-process HF Trainer checks: config validation, plain-Trainer compatibility, corrupt-newest fallback."""

from __future__ import annotations

import concurrent.futures
import errno
import logging
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from ckpt_engine import ConfigError, DecoratedCheckpointing


class Blocks(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 64, (32, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[index], "labels": self.data[index]}


def make_trainer(output_dir: Path, max_steps: int = 4) -> Trainer:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, save_steps=2, logging_steps=1,
                             per_device_train_batch_size=4, report_to="none", disable_tqdm=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=Blocks())


def config(trainer: Trainer | None, **extra: object) -> dict[str, object]:
    return {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer,
            "handle_sigterm": False, **extra}


@pytest.mark.parametrize("bad, match", [
    pytest.param({"host_cache": 1}, "unknown runtime_config key", id="unknown-key"),
    pytest.param({"host_cache_size": -1}, "host_cache_size", id="negative-cache"),
    pytest.param({"parser_threads": 0}, "parser_threads", id="zero-threads"),
    pytest.param({"pin_host_cache": "yes"}, "pin_host_cache", id="non-bool"),
    pytest.param({"on_error": "ignore"}, "on_error", id="bad-on-error"),
    pytest.param({"trainer": None}, "trainer", id="no-trainer"),
])
def test_bad_runtime_config_is_a_clear_error(tmp_path: Path, bad: dict[str, object], match: str) -> None:
    trainer = make_trainer(tmp_path)
    with pytest.raises(ConfigError, match=match):
        DecoratedCheckpointing(runtime_config={**config(trainer), **bad}, rank=-1)


def test_plain_trainer_resumes_from_concurrent_checkpoint(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    DecoratedCheckpointing(runtime_config=config(trainer), rank=-1)
    trainer.train()
    checkpoint = tmp_path / "concurrent_checkpoint" / "checkpoint-4"
    assert (checkpoint / "manifest.json").exists()
    plain = make_trainer(tmp_path / "plain", max_steps=6)
    plain.train(resume_from_checkpoint=str(checkpoint))  # no engine: the Trainer's own loader
    assert plain.state.global_step == 6
    trainer.save_model(str(tmp_path / "saved"))  # the Trainer's own saving keeps working beside the engine
    assert (tmp_path / "saved" / "model.safetensors").exists()


def test_resume_skips_corrupt_newest_and_keep_trainer_saves(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_trainer(tmp_path)
    DecoratedCheckpointing(runtime_config=config(trainer, keep_trainer_saves=True, keep_last=0), rank=-1)
    trainer.train()
    assert (tmp_path / "checkpoint-4" / "trainer_state.json").exists()  # the Trainer's own save, kept
    for name in ("checkpoint-4",):
        (tmp_path / name / "trainer_state.json").unlink()  # Trainer's own newest: incomplete
        target = tmp_path / "concurrent_checkpoint" / name / "optimizer.pt"
        target.write_bytes(target.read_bytes()[:-10])  # concurrent newest: truncated
    again = make_trainer(tmp_path, max_steps=4)
    hooked = DecoratedCheckpointing(runtime_config=config(again), rank=-1)
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        path = hooked.resolve_resume(-1)
    assert path == str(tmp_path / "concurrent_checkpoint" / "checkpoint-2")
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "checkpoint-4" in messages and "skipping" in messages and "Resuming from checkpoint-2" in messages


@pytest.mark.parametrize("on_error", ["continue", "raise"])
def test_enospc_during_training(tmp_path: Path, on_error: str) -> None:
    from ckpt_engine import FaultyStorage, PersistError

    trainer = make_trainer(tmp_path, max_steps=6)
    hooked = DecoratedCheckpointing(runtime_config=config(trainer, on_error=on_error, keep_last=0), rank=-1)
    faulty = FaultyStorage(hooked.engine.storage)
    hooked.engine.storage = faulty
    original = hooked.engine.save_files
    handles: list = []

    def save_files(step, files, **kwargs):  # type: ignore[no-untyped-def]
        # Switch the fault only between checkpoints: on a busy machine the Trainer reaches the
        # next save before the writer threads have finished the previous checkpoint's files.
        if handles:
            concurrent.futures.wait([handles[-1].persisted], timeout=60)
        if step == 4:
            faulty.arm(error=errno.ENOSPC)  # the disk fills up during checkpoint-4
        else:
            faulty.disarm()
        handles.append(original(step, files, **kwargs))
        return handles[-1]

    hooked.engine.save_files = save_files  # type: ignore[method-assign]
    root = tmp_path / "concurrent_checkpoint"
    if on_error == "continue":
        trainer.train()
        assert trainer.state.global_step == 6  # training went on
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("checkpoint")) == \
            ["checkpoint-2", "checkpoint-6"]
    else:
        with pytest.raises(PersistError, match="No space left"):
            trainer.train()
        assert not (root / "checkpoint-6").exists()  # stopped by the next step boundary or save
        assert (root / "checkpoint-2" / "manifest.json").exists()


def test_fsdp_keeps_the_trainers_own_saves(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """FSDP's state dicts are collective and sharded: the engine must not plan them from rank 0 alone."""
    trainer = make_trainer(tmp_path)
    hooked = DecoratedCheckpointing(runtime_config=config(trainer), rank=-1)
    trainer.is_fsdp_enabled = True  # as the Trainer sets it under accelerate's FSDP plugin
    saved: list[int] = []
    hooked._trainer_save_checkpoint = lambda model, trial=None: saved.append(trainer.state.global_step)
    with caplog.at_level(logging.WARNING, logger="ckpt_engine"):
        for step in (2, 4):
            trainer.state.global_step = step
            trainer._save_checkpoint(trainer.model, None)  # what the Trainer calls at save_steps
    assert saved == [2, 4]
    assert not (tmp_path / "concurrent_checkpoint" / "checkpoint-2").exists()
    warnings = [r.getMessage() for r in caplog.records if "FSDP" in r.getMessage()]
    assert len(warnings) == 1 and "Trainer's own synchronous checkpoints" in warnings[0]
    hooked.engine.close()
