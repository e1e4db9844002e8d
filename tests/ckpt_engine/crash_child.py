"""Child process for crash tests: saves a changing state every step until it is killed.

Each state's tensors are filled with the step number, so a loaded checkpoint is
consistent only if every tensor holds the checkpoint's own step.
"""

from __future__ import annotations

import sys

import torch

from ckpt_engine import CheckpointEngine

if __name__ == "__main__":
    root, megabytes = sys.argv[1], float(sys.argv[2])
    engine = CheckpointEngine(root, host_cache_size=megabytes / 1024 / 2, parser_threads=2, keep_last=2,
                              slab_bytes=1 << 20)
    numel = int(megabytes * (1 << 20) / 4 / 4)
    weights = {f"w{i}": torch.zeros(numel) for i in range(4)}
    print("READY", flush=True)
    step = 0
    while True:
        step += 1
        for tensor in weights.values():
            tensor.fill_(float(step))
        handle = engine.save(step, {"model": weights, "meta": {"step": step, "inner": torch.full((3,), step)}},
                             lazy=True)
        handle.wait_staged()
