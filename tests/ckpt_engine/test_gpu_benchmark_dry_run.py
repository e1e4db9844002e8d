"""The GPU benchmark script runs end to end (on the CPU, tiny sizes) before a GPU machine is ever lent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ckpt_overhead_gpu_script_dry_run_on_cpu(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "benchmarks" / "ckpt_overhead_gpu.py"), "--device", "cpu",
         "--dir", str(tmp_path / "bench"), "--width", "64", "--layers", "2", "--batch", "16",
         "--steps", "6", "--every", "3", "--parser-threads", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("cpu (dry run): state")
    assert [line.split()[0] for line in lines[1:4]] == ["none", "sync", "ours"]
    assert re.fullmatch(r"blocking_ratio=\d+\.\d{4} overhead_ratio=\d+\.\d{3}", lines[-1])
    assert not (tmp_path / "bench").exists()  # the script cleans up after itself
