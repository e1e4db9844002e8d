"""A stand-in trainer for DAG tests: steps, 'commits' a checkpoint every N steps, resumes, handles SIGTERM.

It writes progress.json the way the checkpoint engine does (step, last_committed_step,
resumed_from_step, and the attempt it runs as),
so the launcher, the fault injector and the resume logic see what they see in production.
"""

import json
import os
import signal
import sys
import time

out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
os.makedirs(out, exist_ok=True)
max_steps = int(os.environ.get("FAKE_STEPS", "40"))
interval = int(os.environ.get("FAKE_SAVE_EVERY", "5"))
step_seconds = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
committed = sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-"))
resume = os.environ.get("CKPT_LAST_STEP")
start = 0
if resume is not None:
    wanted = int(resume)
    start = (committed[-1] if committed else 0) if wanted == -1 else wanted
    print(f"[Concurrent Checkpoint] Resuming from checkpoint-{start} (CKPT_LAST_STEP={resume})", flush=True)
try:  # SAT's per-job metrics, as the engine's Trainer callback feeds them (none without SAT_METRICS_DIR)
    from ckpt_engine.metrics import recorder

    metrics = recorder()
except ImportError:
    metrics = None
attempt = os.environ.get("SAT_ATTEMPT", "")
state = {"step": None, "last_committed_step": committed[-1] if committed else None, "committed_steps": committed,
         "resumed_from_step": start if resume is not None else None,
         "attempt": int(attempt) if attempt.isdigit() else None}


def write_progress(writer="loop"):
    # Each writer its own temporary file: the SIGTERM handler runs between any two bytecodes of the
    # loop's write, and sharing one name let the loop's half-written buffer land in the file the
    # handler had just renamed into place (progress.json torn, its checkpoint read as none).
    tmp = os.path.join(out, f"progress.json.{writer}.tmp")
    with open(tmp, "w") as handle:
        json.dump(state, handle)
    os.replace(tmp, os.path.join(out, "progress.json"))


def commit(step):
    os.makedirs(os.path.join(out, f"checkpoint-{step}"), exist_ok=True)
    state["last_committed_step"] = step
    state["committed_steps"].append(step)
    if metrics is not None:
        metrics.note_save(step, {"blocking_s": 0.001, "persist_s": 0.01, "bytes": 1000.0})


def on_sigterm(signum, frame):
    commit(state["step"])
    write_progress("final")
    print(f"SIGTERM: final checkpoint at step {state['step']}", flush=True)
    if metrics is not None:
        metrics.close()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_sigterm)
for step in range(start + 1, max_steps + 1):
    time.sleep(step_seconds)
    state["step"] = step
    if step % interval == 0:
        commit(step)
    write_progress()
    if metrics is not None:
        metrics.note_log({"loss": 5.0 * 0.97 ** step, "learning_rate": 1e-3, "epoch": step / max_steps}, step, 8)
if metrics is not None:
    metrics.close()
print(f"finished at step {max_steps}", flush=True)
with open(os.path.join(os.environ["SAT_OUTPUT_DIR"], "trainer_state.json"), "w") as handle:
    json.dump({"global_step": max_steps, "log_history": [{"step": 1, "loss": 5.0}, {"step": max_steps, "loss": 1.0}]}, handle)
