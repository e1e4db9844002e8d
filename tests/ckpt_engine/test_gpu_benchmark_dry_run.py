"""The device check runs end to end (on the CPU, tiny sizes) before a GPU machine is ever lent.

``tests/benchmarks/gpu_check.sh`` is what a session with a GPU runs in its one short device
call: the CUDA test, the seed script on the GPU with a resume, and ``ckpt_overhead_gpu.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # `make test-slow`: it rehearses the device call; make test stays under its 20 minutes
def test_gpu_check_script_dry_run_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(ROOT / "tests" / "benchmarks" / "gpu_check.sh"), "--cpu"],
                            env={**os.environ, "OUT": str(out), "PYTHON": sys.executable}, capture_output=True,
                            text=True, timeout=600)
    summary = (out / "summary.txt").read_text().splitlines()
    assert result.returncode == 0, "\n".join(summary) + result.stdout[-2000:] + result.stderr[-2000:]
    assert summary[:4] == ["versions: exit 0", "gpu_test: exit 0", "seed: exit 0", "bench: exit 0"]
    assert "no CUDA device" in (out / "versions.txt").read_text()
    assert "1 skipped" in (out / "gpu_test.txt").read_text()  # the CUDA test itself needs the GPU
    seed = (out / "seed.txt").read_text()
    assert "Resuming from checkpoint-20" in seed and "OK       checkpoint-30" in seed
    lines = (out / "bench.txt").read_text().strip().splitlines()
    assert lines[0].startswith("cpu (dry run): state")
    assert [line.split()[0] for line in lines[1:4]] == ["none", "sync", "ours"]
    assert re.fullmatch(r"blocking_ratio=\d+\.\d{4} overhead_ratio=\d+\.\d{3}", lines[-1]) and lines[-1] == summary[-1]
