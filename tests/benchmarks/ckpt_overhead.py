"""Benchmark: training-loop cost of checkpointing, four ways, in one process (not a timed test).

Same model/optimizer state (>= 500 MB: an MLP plus AdamW moments) and the same compute
loop, a checkpoint every ``--every`` steps, for: none, synchronous ``torch.save`` (+fsync,
durable like the others), ``torch.distributed.checkpoint.async_save`` and ours
(CheckpointEngine, lazy staging waited for just before ``optimizer.step``).
Per-checkpoint blocking time is the time the training thread is held by the
checkpoint (including waits for a previous one); overhead is the end-to-end slowdown
versus no checkpointing, including the final wait for durability. The last line is
``blocking_ratio=<ours/sync> overhead_ratio=<ours/sync> vs_dcp=<ours/dcp>`` where
vs_dcp compares end-to-end overhead.

    python tests/benchmarks/ckpt_overhead.py --dir /tmp/ckpt-bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckpt_engine import CheckpointEngine


@dataclass
class Result:
    """Timings of one way of checkpointing."""

    name: str
    total_s: float = 0.0
    blocking_s: list[float] = field(default_factory=list)
    peak_extra_rss_mb: float = 0.0


def build(width: int, layers: int, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP and AdamW with populated moments."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters plus optimizer tensors."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


class RssSampler:
    """Samples this process's RSS every 10 ms to find the peak."""

    def __init__(self) -> None:
        self.process, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> RssSampler:
        self.baseline = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, every: int, batch: int,
        checkpoint: Callable[[int], None] | None, before_step: Callable[[], None] | None,
        finalize: Callable[[], None] | None) -> Result:
    """The shared compute loop; hooks measure how long they hold the training thread."""
    width = model[0].in_features
    data = torch.randn(batch, width)
    result = Result(name)
    pending = 0.0
    with RssSampler() as rss:
        start = time.perf_counter()
        for step in range(1, steps + 1):
            loss = model(data).pow(2).mean()
            loss.backward()
            if before_step is not None:
                t0 = time.perf_counter()
                before_step()
                pending += time.perf_counter() - t0
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            if checkpoint is not None and step % every == 0:
                if result.blocking_s or pending:
                    result.blocking_s[-1:] = [x + pending for x in result.blocking_s[-1:]]
                pending = 0.0
                t0 = time.perf_counter()
                checkpoint(step)
                result.blocking_s.append(time.perf_counter() - t0)
        if result.blocking_s and pending:
            result.blocking_s[-1] += pending
        if finalize is not None:
            finalize()
        result.total_s = time.perf_counter() - start
    result.peak_extra_rss_mb = (rss.peak - rss.baseline) / 1e6
    return result


def main() -> None:
    """Run the four ways and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp/ckpt-overhead")
    parser.add_argument("--width", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--host-cache-gb", type=float, default=50.0)
    parser.add_argument("--parser-threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the fastest of each is kept")
    args = parser.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29577")
    dist.init_process_group("gloo", rank=0, world_size=1)

    model, optimizer = build(args.width, args.layers)
    size = state_bytes(model, optimizer)
    print(f"state: {size / 1e6:.0f} MB ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params + AdamW), "
          f"{args.steps} steps, checkpoint every {args.every}, torch threads {torch.get_num_threads()}")

    def loop(name: str, **hooks: Callable | None) -> Result:  # type: ignore[type-arg]
        return run(name, model, optimizer, args.steps, args.every, args.batch, hooks.get("checkpoint"),
                   hooks.get("before_step"), hooks.get("finalize"))

    loop("warmup")

    def sync_save(step: int) -> None:
        path = base / f"sync-{step}.pt"
        with open(path, "wb") as fh:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        path.unlink()  # keep the disk footprint flat between checkpoints

    dcp_futures: list[object] = []

    def dcp_wait() -> None:
        while dcp_futures:
            future = dcp_futures.pop(0)
            (getattr(future, "upload_completion", None) or future).result()  # type: ignore[union-attr]

    def dcp_save(step: int) -> None:
        dcp_wait()  # one in flight, like ours
        shutil.rmtree(base / f"dcp-{step - 2 * args.every}", ignore_errors=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        future = dcp.async_save(state, checkpoint_id=str(base / f"dcp-{step}"))
        staging = getattr(future, "staging_completion", None)
        if staging is not None:
            staging.result()
        dcp_futures.append(future)

    engine = CheckpointEngine(base / "ours", host_cache_size=args.host_cache_gb, parser_threads=args.parser_threads,
                              keep_last=1)

    def ours_save(step: int) -> None:
        engine.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, lazy=True)

    methods: dict[str, Callable[[], Result]] = {
        "none": lambda: loop("none"),
        "sync torch.save": lambda: loop("sync torch.save", checkpoint=sync_save),
        "dcp.async_save": lambda: loop("dcp.async_save", checkpoint=dcp_save, finalize=dcp_wait),
        "ours (ckpt_engine)": lambda: loop("ours (ckpt_engine)", checkpoint=ours_save,
                                           before_step=engine.wait_staged, finalize=engine.wait),
    }
    best: dict[str, Result] = {}
    for round_index in range(args.rounds):
        names = list(methods)
        names = names[round_index % len(names):] + names[: round_index % len(names)]
        for name in names:
            result = methods[name]()
            print(f"  round {round_index + 1}: {name:<20} {result.total_s:7.2f}s", flush=True)
            if name not in best or result.total_s < best[name].total_s:
                best[name] = result
    results = [best[name] for name in methods]
    ours = best["ours (ckpt_engine)"]
    peak_pool = engine.pool.peak_bytes
    engine.close()
    none_s = results[0].total_s

    print(f"{'method':<22}{'total_s':>9}{'slowdown':>10}{'block/ckpt_s':>14}{'block_max_s':>13}{'peak_extra_rss_MB':>19}")
    for result in results:
        blocking = statistics.mean(result.blocking_s) if result.blocking_s else 0.0
        print(f"{result.name:<22}{result.total_s:>9.2f}{result.total_s / none_s - 1:>10.1%}{blocking:>14.3f}"
              f"{max(result.blocking_s, default=0.0):>13.3f}{result.peak_extra_rss_mb:>19.0f}")
    sync, dcp_result = results[1], results[2]
    print(f"ours: host pool peak {peak_pool / 1e6:.0f} MB for a {size / 1e6:.0f} MB state "
          f"(memory bound is measured in a fresh process by ckpt_io.py)")

    def overhead(result: Result) -> float:
        return max(result.total_s - none_s, 1e-9)

    blocking_ratio = statistics.mean(ours.blocking_s) / statistics.mean(sync.blocking_s)
    print(f"blocking_ratio={blocking_ratio:.3f} overhead_ratio={overhead(ours) / overhead(sync):.3f} "
          f"vs_dcp={overhead(ours) / overhead(dcp_result):.3f}")
    dist.destroy_process_group()
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
