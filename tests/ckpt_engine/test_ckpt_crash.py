"""Crash consistency: SIGKILL at random moments during saves never leaves a loadable torn checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ckpt_engine import CheckpointEngine, verify_checkpoint
from ckpt_engine.manifest import list_checkpoint_steps

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def kill_during_saves(root: Path, delay: float) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), str(root), "8"], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def check_consistent(root: Path) -> int | None:
    """Every visible checkpoint verifies; the newest loads with all tensors from its own step."""
    engine = CheckpointEngine(root)  # also removes the dead process's temporary directories
    steps = list_checkpoint_steps(engine.storage)
    for step in steps:
        report = verify_checkpoint(engine.storage, f"checkpoint-{step}")
        assert report.ok, report.problems  # a directory under its final name is always complete
    assert not [p for p in root.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    if not steps:
        engine.close()
        return None
    state = engine.load()
    step = state["meta"]["step"]
    assert step == steps[0]
    for tensor in state["model"].values():
        assert torch.all(tensor == float(step))
    assert torch.all(state["meta"]["inner"] == step)
    engine.close()
    return step


def run_trials(tmp_path: Path, trials: int, seed: int) -> list[int | None]:
    rng = random.Random(seed)
    found = []
    for trial in range(trials):
        root = tmp_path / f"trial-{trial}"
        kill_during_saves(root, rng.uniform(0.05, 1.5))
        found.append(check_consistent(root))
    return found


def test_sigkill_during_saves_default(tmp_path: Path) -> None:
    found = run_trials(tmp_path, trials=4, seed=1)
    assert any(step is not None for step in found)


@pytest.mark.slow
def test_sigkill_during_saves_30_trials(tmp_path: Path) -> None:
    found = run_trials(tmp_path, trials=30, seed=2)
    assert sum(step is not None for step in found) >= 20
