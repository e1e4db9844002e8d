"""GPU variant of ckpt_overhead: one short self-contained run (< 5 minutes) for a lent CUDA machine.

Same loop and reporting as ``ckpt_overhead.py`` with the state on the GPU: none,
synchronous (copy to host + ``torch.save`` + fsync) and ours (pinned host cache, copies
on a side stream, waited for just before ``optimizer.step``). Prints per-checkpoint
blocking and slowdown, then ``blocking_ratio=<ours/sync> overhead_ratio=<ours/sync>``.
H200 target: blocking_ratio <= 0.02.

    PYTHONPATH=. python tests/benchmarks/ckpt_overhead_gpu.py --dir /tmp/ckpt-gpu

``--device cpu`` runs the same script on the CPU with tiny sizes (the test suite does, so
the script is known to run end to end before a GPU machine is lent); its numbers mean
nothing for the GPU target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ckpt_engine import CheckpointEngine


def main() -> None:
    """Run none / sync / ours on the GPU and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp/ckpt-gpu")
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--parser-threads", type=int, default=4)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --device cpu for a dry run)")
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    torch.manual_seed(0)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(args.batch, args.width, device=device)
    size = sum(p.numel() for p in model.parameters()) * 4 * 3
    name = torch.cuda.get_device_name() if on_gpu else "cpu (dry run)"
    print(f"{name}: state {size / 1e9:.2f} GB, {args.steps} steps, every {args.every}")

    def loop(checkpoint: Callable[[int], None] | None = None, before_step: Callable[[], None] | None = None,
             finalize: Callable[[], None] | None = None) -> tuple[float, list[float]]:
        blocking: list[float] = []
        synchronize()
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            model(data).float().pow(2).mean().backward()
            if before_step is not None:
                t0 = time.perf_counter()
                before_step()
                if blocking:
                    blocking[-1] += time.perf_counter() - t0
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            if checkpoint is not None and step % args.every == 0:
                t0 = time.perf_counter()
                checkpoint(step)
                blocking.append(time.perf_counter() - t0)
        synchronize()
        if finalize is not None:
            finalize()
        return time.perf_counter() - start, blocking

    loop()  # warm-up (kernels, optimizer state)
    none_s, _ = loop()

    def sync_save(step: int) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        path = base / f"sync-{step}.pt"
        with open(path, "wb") as fh:
            torch.save(state, fh)  # device-to-host copies happen inside, synchronously
            fh.flush()
            os.fsync(fh.fileno())
        path.unlink()

    sync_s, sync_block = loop(checkpoint=sync_save)

    engine = CheckpointEngine(base / "ours", host_cache_size=size / 1e9 * 1.2 / 1.073741824 + 1,
                              parser_threads=args.parser_threads, keep_last=1, pin_host_cache=True)

    def ours_save(step: int) -> None:
        engine.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, lazy=True)

    ours_save(0)  # warm-up: pinned buffers are allocated once, then reused
    engine.wait()
    ours_s, ours_block = loop(checkpoint=ours_save, before_step=engine.wait_staged, finalize=engine.wait)
    engine.close()
    again_s, _ = loop()
    none_s = min(none_s, again_s)

    for name, total, block in (("none", none_s, []), ("sync", sync_s, sync_block), ("ours", ours_s, ours_block)):
        mean_block = statistics.mean(block) if block else 0.0
        print(f"{name:<6} total={total:7.2f}s slowdown={total / none_s - 1:7.1%} block/ckpt={mean_block:.4f}s")
    overhead_ours, overhead_sync = max(ours_s - none_s, 1e-9), max(sync_s - none_s, 1e-9)
    print(f"blocking_ratio={statistics.mean(ours_block) / statistics.mean(sync_block):.4f} "
          f"overhead_ratio={overhead_ours / overhead_sync:.3f}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
