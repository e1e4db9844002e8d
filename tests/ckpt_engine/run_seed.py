"""Test harness: runs include/scripts/seed_train.py unchanged, optionally slowed down per step.

``SEED_STEP_SLEEP`` (seconds) sleeps before each training step so a test can kill the
process at a chosen moment; ``SEED_NO_SHM=1`` skips DeepSpeed's CPU shared-memory
all-reduce op (a JIT build irrelevant to checkpointing).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "include" / "scripts" / "seed_train.py"

if __name__ == "__main__":
    delay = float(os.environ.get("SEED_STEP_SLEEP", "0") or 0)
    if delay:
        import transformers

        original = transformers.Trainer.training_step

        def slowed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(delay)
            return original(self, *args, **kwargs)

        transformers.Trainer.training_step = slowed
    if os.environ.get("SEED_NO_SHM"):
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    sys.argv = [str(SCRIPT), *sys.argv[1:]]
    runpy.run_path(str(SCRIPT), run_name="__main__")
