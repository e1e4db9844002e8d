"""Fixtures for the checkpoint engine tests: a vendor dir, a small corpus, a seed-script runner."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ckpt_helpers import seed_env

from ckpt_engine.vendor import write_vendor_dir

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "training", "checkpoint", "engine", "spot", "resume", "data"]


@pytest.fixture(scope="session")
def vendor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CHECKPOINT_VENDOR directory laid out by write_vendor_dir."""
    return write_vendor_dir(tmp_path_factory.mktemp("vendor"))


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a few KB of text."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    (folder / "a.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(3000)))
    return folder


SeedRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_seed(vendor_dir: Path, corpus_dir: Path) -> SeedRunner:
    """Run the seed script to completion (or until ``kill_when`` holds, then SIGKILL)."""

    def run(output_dir: Path, *args: str, env: dict[str, str] | None = None,
            kill_when: Callable[[], bool] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(HERE / "run_seed.py"), "--data_dir", str(corpus_dir),
                   "--output_dir", str(output_dir), *args]
        proc = subprocess.Popen(command, env=seed_env(vendor_dir, **(env or {})), cwd=str(output_dir.parent),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        if kill_when is not None:
            while proc.poll() is None and not kill_when():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return subprocess.CompletedProcess(command, proc.returncode, out, "")

    return run
