"""Benchmark: the training-loop stall of a checkpoint made of many small tensors, against synchronous saves.

Per-tensor costs, not bytes, decide the stall for states with thousands of small
tensors (biases and norms of deep models, MoE experts, per-parameter optimizer state).
The same state in the same process, each way ``--repeat`` times in turn, medians:

* flat: ``--tensors`` small tensors of mixed sizes in one flat dict (one safetensors
  file). Ours is the time ``CheckpointEngine.save`` blocks (planned and staged; the write
  goes on behind it), against ``safetensors.torch.save_file`` + fsync and ``torch.save``
  + fsync, which block for everything;
* optimizer: an AdamW-shaped state for ``--tensors / 3`` parameters (``step``,
  ``exp_avg``, ``exp_avg_sq`` each, a torch zip file), against ``torch.save`` + fsync.

The last line: ``flat_blocking_ratio=<ours/safetensors> optimizer_blocking_ratio=<ours/torch.save>``.

    PYTHONPATH=. python tests/benchmarks/ckpt_many_tensors.py --tensors 20000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from ckpt_engine import CheckpointEngine


def synced(save: Callable[[Any, Path], None], state: Any, path: Path) -> Callable[[], None]:
    """A synchronous save of ``state`` to ``path`` that returns once the bytes are on disk."""
    def run() -> None:
        save(state, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return run


def main() -> None:
    """Time each way in turn and print the medians and the two ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp/ckpt-many-tensors")
    parser.add_argument("--tensors", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    torch.manual_seed(0)
    flat = {f"layers.{i}.norm.weight": torch.randn(16 + (i * 37) % 1024) for i in range(args.tensors)}
    params = args.tensors // 3
    optimizer = {"state": {i: {"step": torch.tensor(float(i)), "exp_avg": torch.randn(16 + (i * 37) % 1024),
                               "exp_avg_sq": torch.rand(16 + (i * 37) % 1024)} for i in range(params)},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(params))}]}
    engine = CheckpointEngine(base / "ours", host_cache_size=1.0, keep_last=1)
    step = 0

    def ours(state: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            nonlocal step
            engine.wait()  # the previous checkpoint's write is not part of this stall
            step += 1
            engine.save(step, state)
        return run

    ways: dict[str, Callable[[], None]] = {
        "flat ours": ours({"model": flat}),
        "flat safetensors+fsync": synced(safetensors.torch.save_file, flat, base / "flat.safetensors"),
        "flat torch.save+fsync": synced(torch.save, flat, base / "flat.pt"),
        "optimizer ours": ours({"optimizer": optimizer}),
        "optimizer torch.save+fsync": synced(torch.save, optimizer, base / "optimizer.pt"),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for name, run in ways.items():  # warm-up: host buffers, imports
        run()
    for repeat in range(args.repeat):
        for name, run in ways.items() if repeat % 2 == 0 else reversed(ways.items()):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    engine.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    flat_mb = sum(t.numel() * t.element_size() for t in flat.values()) / 1e6
    print(f"flat: {len(flat)} tensors, {flat_mb:.1f} MB; optimizer: {params} parameters, {3 * params} tensors")
    for name, values in times.items():
        print(f"{name:<28} blocking median={median[name]:.3f}s runs={[round(v, 3) for v in values]}")
    print(f"flat_blocking_ratio={median['flat ours'] / median['flat safetensors+fsync']:.3f} "
          f"optimizer_blocking_ratio={median['optimizer ours'] / median['optimizer torch.save+fsync']:.3f}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
