"""The rehearsal injector (sitecustomize) in a real Python process: raise at step N, or hold until the fault comes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sat_tasks.testing.runs import INJECT_DIR

# A stand-in training loop: writes progress.json as the engine does, takes a "final checkpoint" on SIGTERM.
TRAIN = """
import json, os, signal, sys, time
out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
os.makedirs(out, exist_ok=True)
def on_term(signum, frame):
    print("final checkpoint at step", step, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
for step in range(1, 60):
    with open(os.path.join(out, "progress.json.tmp"), "w") as handle:
        json.dump({"step": step, "attempt": int(os.environ["SAT_ATTEMPT"])}, handle)
    os.replace(os.path.join(out, "progress.json.tmp"), os.path.join(out, "progress.json"))
    print("step", step, flush=True)
    time.sleep(0.02)
print("finished", flush=True)
"""


def start(tmp_path, action: str, attempt: int = 1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(INJECT_DIR), "SAT_OUTPUT_DIR": str(tmp_path), "SAT_ATTEMPT": str(attempt),
           "SAT_REHEARSE_AT_STEP": "5", "SAT_REHEARSE_ACTION": action, "SAT_REHEARSE_ATTEMPT": "1"}
    return subprocess.Popen([sys.executable, "-c", TRAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_user_error_raises_in_the_script_with_a_traceback(tmp_path):
    proc = start(tmp_path, "raise")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "Traceback (most recent call last)" in out and "RehearsedUserError: rehearsed user error" in out
    assert "finished" not in out


def test_hold_pauses_training_until_sigterm_reaches_the_scripts_own_handler(tmp_path):
    proc = start(tmp_path, "hold")
    progress = tmp_path / "concurrent_checkpoint" / "progress.json"
    deadline = time.monotonic() + 120
    held = None
    while time.monotonic() < deadline:  # wait for the event: the step stops moving at >= 5
        step = json.loads(progress.read_text())["step"] if progress.exists() else 0
        if step >= 5:
            time.sleep(1.0)
            if json.loads(progress.read_text())["step"] == step:
                held = step
                break
        time.sleep(0.05)
    assert held is not None and held < 59, "training did not hold at step 5"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "rehearsal: training held at step >= 5" in out and f"final checkpoint at step {held}" in out


@pytest.mark.parametrize("action", ["raise", "hold"])
def test_a_later_attempt_is_left_alone(tmp_path, action):
    proc = start(tmp_path, action, attempt=2)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.rstrip().endswith("finished"), out
