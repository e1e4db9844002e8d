"""Resuming on another world size (issue 32, ADR 0029): the gradient accumulation scale and the per-rank RNG files.

What the Trainer does on its own (transformers 5.x `Trainer._load_rng_state`): at world size 1 it
reads `rng_state.pth`, at N `rng_state_<process_index>.pth`; a checkpoint of another world size has
no such file and the Trainer goes on with fresh RNG states ("Didn't find an RNG file ..."). The
engine's wrap hands it the saved rank `r mod W`'s file instead. DeepSpeed ZeRO-1/2/3 checkpoints of
another world size resume through DeepSpeed's universal format (slow tests below). The end-to-end
shrink (2 ranks -> 1, loss and sample order against an uninterrupted run) is
tests/e2e/test_elastic_failover.py.
"""

from __future__ import annotations

import json
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


# ---- DeepSpeed ZeRO: the universal view ------------------------------------------------------------
def zero_checkpoint(root: Path, ranks: int) -> Path:
    """A committed-looking DeepSpeed checkpoint: its `latest` tag and one ZeRO optimizer shard per saved rank."""
    folder = root / "checkpoint-3"
    (folder / "global_step3").mkdir(parents=True)
    (folder / "latest").write_text("global_step3")
    (folder / "global_step3" / "mp_rank_00_model_states.pt").write_bytes(b"model")
    for rank in range(ranks):
        (folder / "global_step3" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"shard")
    for name in ("model.safetensors", "scheduler.pt", "trainer_state.json", "rng_state_0.pth", "manifest.json"):
        (folder / name).write_bytes(name.encode())
    return folder


def fake_convert(calls: list[str]):
    def convert(input_folder: str, output_folder: str) -> None:
        calls.append(input_folder)
        Path(output_folder, "zero", "w").mkdir(parents=True)
        Path(output_folder, "zero", "w", "fp32.pt").write_bytes(b"universal")
        Path(output_folder, "mp_rank_00_model_states.pt").write_bytes(b"model")
    return convert


def test_a_zero_checkpoint_of_another_world_size_gets_a_checked_universal_view_once(tmp_path):
    from ckpt_engine.integrations.elastic import (
        resume_dir,
        saved_zero_ranks,
        universal_view,
    )

    root = tmp_path / "concurrent_checkpoint"
    checkpoint = zero_checkpoint(root, ranks=2)
    assert saved_zero_ranks(str(checkpoint)) == ("global_step3", 2)
    assert universal_view(str(checkpoint), str(root), 2, is_writer=True) is None  # same world size: as it is
    calls: list[str] = []
    view = Path(universal_view(str(checkpoint), str(root), 1, is_writer=True, convert=fake_convert(calls)))
    assert view == root / "universal" / "checkpoint-3" and calls == [str(checkpoint / "global_step3")]
    assert (view / "latest_universal").read_text() == "global_step3_universal"
    manifest = json.loads((view / "manifest.json").read_text())
    assert manifest["layout"] == "deepspeed-universal" and manifest["step"] == 3
    assert set(manifest["files"]) == {"latest_universal", "global_step3_universal/mp_rank_00_model_states.pt",
                                      "global_step3_universal/zero/w/fp32.pt"}
    assert sorted(p.name for p in view.iterdir()) == ["global_step3_universal", "latest_universal", "manifest.json"]
    assert sorted(p.name for p in checkpoint.iterdir()) == [  # the committed checkpoint is left as it was
        "global_step3", "latest", "manifest.json", "model.safetensors", "rng_state_0.pth", "scheduler.pt",
        "trainer_state.json"]

    joined = Path(resume_dir(str(checkpoint), str(view)))  # what the Trainer resumes from: both, as links
    assert joined.name == "checkpoint-3" and not joined.is_relative_to(root)
    assert sorted(p.name for p in joined.iterdir()) == [
        "global_step3", "global_step3_universal", "latest", "latest_universal", "model.safetensors",
        "rng_state_0.pth", "scheduler.pt", "trainer_state.json"]
    assert (joined / "model.safetensors").resolve() == (checkpoint / "model.safetensors").resolve()
    assert (joined / "latest_universal").resolve() == (view / "latest_universal").resolve()

    assert universal_view(str(checkpoint), str(root), 1, is_writer=True, convert=fake_convert(calls)) == str(view)
    assert len(calls) == 1  # checked against its manifest and reused
    (view / "global_step3_universal" / "zero" / "w" / "fp32.pt").write_bytes(b"flipped!!")
    universal_view(str(checkpoint), str(root), 1, is_writer=True, convert=fake_convert(calls))
    assert len(calls) == 2  # a view that fails its manifest is built again
    (checkpoint / "manifest.json").write_bytes(b"checkpoint-3 saved again")
    universal_view(str(checkpoint), str(root), 1, is_writer=True, convert=fake_convert(calls))
    assert len(calls) == 3  # a view of the checkpoint as it was before is not reused
    assert universal_view(str(checkpoint), str(root), 1, is_writer=False) == str(view)


def test_after_a_universal_load_each_optimizer_state_counts_its_own_steps():
    """DeepSpeed 0.19's ZeRO-3 universal load shares one `step` tensor between partitions; the callback separates them."""
    from types import SimpleNamespace

    from ckpt_engine.integrations.elastic import _separate_step_counts

    shared = torch.tensor(3.0)
    base = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))])
    for param in base.param_groups[0]["params"]:
        base.state[param] = {"step": shared, "exp_avg": torch.zeros_like(param)}
    trainer = SimpleNamespace(model_wrapped=SimpleNamespace(optimizer=SimpleNamespace(optimizer=base)))
    _separate_step_counts(trainer).on_train_begin(None, None, None)
    steps = [state["step"] for state in base.state.values()]
    assert [float(step) for step in steps] == [3.0, 3.0] and steps[0] is not steps[1]
    steps[0].add_(1)  # what torch's Adam does to one partition's count at its step
    assert [float(step) for step in steps] == [4.0, 3.0]


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "saved", "resumed"), [
    pytest.param(1, 2, 1, id="zero1-2-to-1"),
    pytest.param(2, 2, 1, id="zero2-2-to-1"),
    pytest.param(3, 2, 1, id="zero3-2-to-1"),
    pytest.param(2, 1, 2, id="zero2-1-to-2"),
])
def test_deepspeed_zero_resumes_on_another_world_size_through_the_universal_format(
        tmp_path, vendor_dir, corpus_dir, stage, saved, resumed):
    """The seed script under DeepSpeed ZeRO-``stage``: ``saved`` ranks save, ``resumed`` ranks go on, same losses.

    The job is planned for 2 ranks; a run on 1 rank accumulates 2 micro-batches (the launcher's
    ``SAT_GRAD_ACCUM_SCALE``), so the global batch and the samples of each step are the planned
    run's, and the losses of steps 4-6 after the resume from checkpoint-3 must equal an
    uninterrupted 2-rank run's (they are equal to the last bit; under ZeRO-3 without the
    engine's separated ``step`` tensors step 6 was 1.4e-3 off). Slow: two or three torchrun
    launches of DeepSpeed on CPU plus the conversion, 3.5-9 min each on this loaded machine.
    """
    pytest.importorskip("deepspeed")
    import subprocess
    import sys

    from ckpt_helpers import seed_env, write_ds_config

    config = write_ds_config(tmp_path / "ds.json", stage)

    def torchrun(ranks: int, out: Path, env: dict[str, str] | None = None) -> str:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
                   "ckpt_engine.launch", str(Path(__file__).with_name("run_seed.py")), "--data_dir", str(corpus_dir),
                   "--output_dir", str(out), "--max_steps", "6", "--save_steps", "3", "--deepspeed", str(config)]
        scale = {ACCUMULATION_SCALE_ENV: str(2 // ranks)} if ranks < 2 else {}
        done = subprocess.run(command, env=seed_env(vendor_dir, DS_ACCELERATOR="cpu", SEED_CPU_DIST="1", **scale,
                                                    **(env or {})),
                              cwd=str(tmp_path), capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done.stdout + done.stderr

    out = tmp_path / "run"
    if saved == 2:
        torchrun(2, out)
        uninterrupted = losses(out / "concurrent_checkpoint" / "checkpoint-6")
    else:
        torchrun(2, tmp_path / "reference")
        uninterrupted = losses(tmp_path / "reference" / "concurrent_checkpoint" / "checkpoint-6")
        torchrun(saved, out)
    log = torchrun(resumed, out, env={"CKPT_LAST_STEP": "3", "SAT_ATTEMPT": "2"})
    assert f"checkpoint-3 was saved by {saved} rank(s), {resumed} now: converting its ZeRO shards" in log
    assert f"rank 0 of {resumed} resumes from the universal view" in log
    after = losses(out / "concurrent_checkpoint" / "checkpoint-6")
    assert {step: after[step] for step in (4, 5, 6)} == pytest.approx(
        {step: uninterrupted[step] for step in (4, 5, 6)}, abs=1e-4)


def losses(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}
