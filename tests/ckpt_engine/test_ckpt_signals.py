"""SIGTERM handling: the grace period bounds how long a final checkpoint may take; the exit status is 143."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys, time
from ckpt_engine.signals import GracefulTermination
term = GracefulTermination(float(sys.argv[1]), on_timeout=lambda: print("grace expired", flush=True))
term.install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(float(sys.argv[2]))  # the final checkpoint takes this long
print("requested", term.requested, flush=True)
term.finish()
"""


@pytest.mark.parametrize("grace, work, expired", [pytest.param(5.0, 0.2, False, id="within-grace"),
                                                  pytest.param(0.5, 30.0, True, id="grace-expired")])
def test_exit_status_and_grace(grace: float, work: float, expired: bool) -> None:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(grace), str(work)], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert result.returncode == 143, result.stderr
    assert ("grace expired" in result.stdout) is expired
    assert ("requested True" in result.stdout) is not expired
    assert time.monotonic() - start < 20
