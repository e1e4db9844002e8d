"""Test harness: runs include/scripts/seed_train.py unchanged, optionally slowed down per step.

``SEED_STEP_SLEEP`` (seconds) sleeps before each training step so a test can kill the
process at a chosen moment; ``SEED_NO_SHM=1`` skips DeepSpeed's CPU shared-memory
all-reduce op (a JIT build irrelevant to checkpointing); ``SEED_CPU_DIST=1`` makes
Accelerate count the ranks of a CPU-only multi-process DeepSpeed run (it picks no
backend without an accelerator and reports world size 1 although DeepSpeed runs gloo
over all ranks; on GPUs it picks nccl and needs no help).
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
    if os.environ.get("SEED_CPU_DIST"):
        import accelerate.state
        from accelerate.utils import DistributedType

        prepare = accelerate.state.PartialState._prepare_backend

        def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):  # type: ignore[no-untyped-def]
            chosen, kind = prepare(self, cpu, sagemaker_dp, backend)
            if chosen is None and kind == DistributedType.NO and int(os.environ.get("LOCAL_RANK", "-1")) != -1:
                return "gloo", DistributedType.MULTI_CPU
            return chosen, kind

        accelerate.state.PartialState._prepare_backend = prepare_backend
    sys.argv = [str(SCRIPT), *sys.argv[1:]]
    runpy.run_path(str(SCRIPT), run_name="__main__")
