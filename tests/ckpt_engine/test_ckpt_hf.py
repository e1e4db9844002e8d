"""HF Trainer integration through the seed script shape: run, kill, resume, equivalence, SIGTERM, DeepSpeed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import read_progress, seed_env, write_ds_config
from safetensors.torch import load_file

from ckpt_engine.manifest import CHECKSUM_PREFIX

HF_FILES = {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "training_args.bin", "manifest.json"}


def committed(root: Path, step: int):  # type: ignore[no-untyped-def]
    return lambda: (read_progress(root).get("last_committed_step") or 0) >= step


def losses(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def test_seed_script_run_kill_resume(tmp_path: Path, run_seed) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    out.mkdir()
    root = out / "concurrent_checkpoint"
    first = run_seed(out, "--max_steps", "20", "--save_steps", "5", env={"SEED_STEP_SLEEP": "0.1"},
                     kill_when=committed(root, 10))
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:]
    progress = read_progress(root)
    assert {"step", "last_committed_step", "committed_steps", "updated_at"} <= set(progress)
    last = progress["last_committed_step"]
    assert last >= 10 and last in progress["committed_steps"]
    for step in progress["committed_steps"]:
        folder = root / f"checkpoint-{step}"
        assert HF_FILES <= {p.name for p in folder.iterdir()}
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["step"] == step and manifest["layout"] == "hf"
        assert all(entry["size"] > 0 and entry["checksum"].startswith(CHECKSUM_PREFIX)
                   for entry in manifest["files"].values())

    resumed = run_seed(out, "--max_steps", "20", "--save_steps", "5",
                       env={"CKPT_LAST_STEP": str(last), "SAT_ATTEMPT": "2"})
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"Resuming from checkpoint-{last}" in resumed.stdout
    assert read_progress(root)["last_committed_step"] == 20
    # The Trainer's log entries carry the wall time and the attempt (the Training Jobs page's Monitoring tab).
    history = json.loads((root / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    logged = [entry for entry in history if "loss" in entry]
    assert logged and all("sat_time" in entry for entry in logged)
    assert {entry.get("sat_attempt") for entry in logged if entry["step"] > last} == {2}
    times = [entry["sat_time"] for entry in logged]
    assert times == sorted(times)

    newest = run_seed(out, "--max_steps", "25", "--save_steps", "5", env={"CKPT_LAST_STEP": "-1"})
    assert newest.returncode == 0, newest.stdout[-3000:]
    assert "Resuming from checkpoint-20" in newest.stdout
    assert read_progress(root)["last_committed_step"] == 25


def test_fresh_start_with_resume_requested(tmp_path: Path, run_seed) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "fresh"
    out.mkdir()
    result = run_seed(out, "--max_steps", "3", "--save_steps", "3", env={"CKPT_LAST_STEP": "-1"})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "[Concurrent Checkpoint] No Checkpoint found with step: -1" in result.stdout
    assert (out / "concurrent_checkpoint" / "checkpoint-3" / "manifest.json").exists()


def test_resume_equivalence(tmp_path: Path, run_seed) -> None:  # type: ignore[no-untyped-def]
    steps, half = 16, 8
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    straight.mkdir()
    broken.mkdir()
    args = ("--max_steps", str(steps), "--save_steps", str(half))
    assert run_seed(straight, *args).returncode == 0
    killed = run_seed(broken, *args, env={"SEED_STEP_SLEEP": "0.2"},
                      kill_when=committed(broken / "concurrent_checkpoint", half))
    assert killed.returncode == -signal.SIGKILL
    resumed = run_seed(broken, *args, env={"CKPT_LAST_STEP": str(half)})
    assert resumed.returncode == 0 and f"Resuming from checkpoint-{half}" in resumed.stdout

    final_a = straight / "concurrent_checkpoint" / f"checkpoint-{steps}"
    final_b = broken / "concurrent_checkpoint" / f"checkpoint-{steps}"
    loss_a, loss_b = losses(final_a), losses(final_b)
    for step in range(half + 1, steps + 1):
        assert loss_b[step] == pytest.approx(loss_a[step], rel=1e-5), step
    params_a, params_b = load_file(final_a / "model.safetensors"), load_file(final_b / "model.safetensors")
    assert params_a.keys() == params_b.keys()
    for key in params_a:
        torch.testing.assert_close(params_b[key], params_a[key], rtol=1e-5, atol=1e-7)


def test_sigterm_takes_final_checkpoint_and_exits_143(tmp_path: Path, vendor_dir: Path, corpus_dir: Path) -> None:
    out = tmp_path / "spot"
    out.mkdir()
    root = out / "concurrent_checkpoint"
    command = [sys.executable, str(Path(__file__).with_name("run_seed.py")), "--data_dir", str(corpus_dir),
               "--output_dir", str(out), "--max_steps", "200", "--save_steps", "5"]
    proc = subprocess.Popen(command, env=seed_env(vendor_dir, SEED_STEP_SLEEP="0.1", CKPT_GRACE_SECONDS="30"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not committed(root, 5)() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.25)  # land between periodic saves
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    progress = read_progress(root)
    final = progress["last_committed_step"]
    assert final is not None and final >= 5
    assert "SIGTERM received" in output and f"final checkpoint checkpoint-{final} committed" in output
    assert (root / f"checkpoint-{final}" / "manifest.json").exists()


def test_sigterm_to_the_deepspeed_launchers_group_commits_a_final_checkpoint(
        tmp_path: Path, vendor_dir: Path, corpus_dir: Path) -> None:
    """A Spot notice as SAT delivers it, to the whole process group of the real `deepspeed` launcher.

    The launcher dies at once, `deepspeed.launcher.launch` passes a second SIGTERM on and
    SIGKILLs its rank 30 s later: the rank takes its final checkpoint well inside that.
    """
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds"
    out.mkdir()
    root = out / "concurrent_checkpoint"
    config = write_ds_config(tmp_path / "ds.json", 1)
    venv_bin = str(Path(sys.executable).parent)
    command = ["deepspeed", "--num_gpus", "1", "--master_port", "29573", str(Path(__file__).with_name("run_seed.py")),
               "--data_dir", str(corpus_dir), "--output_dir", str(out), "--max_steps", "400", "--save_steps", "5",
               "--deepspeed", str(config)]
    env = seed_env(vendor_dir, SEED_STEP_SLEEP="0.1", CKPT_GRACE_SECONDS="20",
                   PATH=f"{venv_bin}:{os.environ['PATH']}")
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not committed(root, 5)() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.25)  # land between periodic saves
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)  # the pipe closes when the rank, last, has exited
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    final = read_progress(root)["last_committed_step"]
    assert f"final checkpoint checkpoint-{final} committed" in output, output[-3000:]
    assert output.count("SIGTERM received") == 1  # the launcher's second SIGTERM changes nothing
    assert "SIGKILLs its ranks" not in output  # 20 s of grace fit in the launcher's 30 s
    manifest = json.loads((root / f"checkpoint-{final}" / "manifest.json").read_text())
    assert any(name.startswith(f"global_step{final}/") for name in manifest["files"])


# ZeRO-1 at one rank runs with `make test-slow`; test_ckpt_deepspeed_datastates.py covers ZeRO 1/2/3 at one rank.
@pytest.mark.parametrize("stage", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_deepspeed_one_rank_save_and_resume(tmp_path: Path, run_seed, stage: int) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds"
    out.mkdir()
    config = write_ds_config(tmp_path / "ds.json", stage, datastates_ckpt={"host_cache_size": 1, "parser_threads": 1})
    dist_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    first = run_seed(out, "--max_steps", "6", "--save_steps", "3", "--deepspeed", str(config), env=dist_env)
    assert first.returncode == 0, first.stdout[-3000:]
    folder = out / "concurrent_checkpoint" / "checkpoint-3"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "latest" in manifest["files"] and (folder / "latest").read_text() == "global_step3"
    assert any(name.startswith("global_step3/") and "optim_states" in name for name in manifest["files"])
    if stage == 3:  # partitioned weights and no gather configured: like the Trainer, no model.safetensors
        assert "model.safetensors" not in manifest["files"]
        assert "global_step3/zero_pp_rank_0_mp_rank_00_model_states.pt" in manifest["files"]
        assert "ZeRO-3 without stage3_gather_16bit_weights_on_model_save" in first.stdout
    else:
        assert "model.safetensors" in manifest["files"]
    second = run_seed(out, "--max_steps", "6", "--save_steps", "3", "--deepspeed", str(config),
                      env={**dist_env, "CKPT_LAST_STEP": "3"})
    assert second.returncode == 0, second.stdout[-3000:]
    assert "Resuming from checkpoint-3" in second.stdout
    assert "No datastates engine found" not in first.stdout + second.stdout  # the vendor alias imported
