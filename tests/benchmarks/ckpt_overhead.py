"""Benchmark: training-loop cost of checkpointing, several ways, in one process (not a timed test).

Same model/optimizer state (>= 500 MB: an MLP plus AdamW moments) and the same compute
loop, a checkpoint every ``--every`` steps, for: none, synchronous ``torch.save`` (+fsync,
durable like the others), ``torch.distributed.checkpoint.async_save`` and ours
(CheckpointEngine, lazy staging waited for just before ``optimizer.step``; one engine per
``--priorities`` value, the first is the one the last line reports).
Per-checkpoint blocking (stall) is the time the training thread is held by the checkpoint
(including waits for a previous one); overhead is the end-to-end slowdown versus no
checkpointing, including the final wait for durability.

How the figures are made to hold on a shared machine (the helpers are ``paired.py``'s,
as ``ckpt_io.py`` uses them):

* one warm-up round of every way first, not counted: it imports and allocates what each
  needs once per process (our staging pool, DCP's planner), and is printed on its own;
* then ``--pairs`` rounds; each runs every way once, in the given order in even rounds
  and reversed in odd ones, so no way always runs first or last;
* each ratio is taken inside a round (ours' overhead over sync's, over DCP's) and the
  last line gives the median over rounds and its range (min-max); stall and peak RSS
  are medians over rounds too. Every round is printed.

The last line::

    blocking_ratio=<median> overhead_ratio=<median> spread=<lo>-<hi> vs_dcp=<median>
    vs_dcp_spread=<lo>-<hi> stall_s=<median> peak_rss_mb=<median> pairs=<n> disk_mb_s=<lo>-<hi>

``disk_mb_s`` is the directory's O_DIRECT write rate measured before the first round and
after the last: the final checkpoint's durable write cannot overlap training, so on a
slower disk the same engine shows a larger ``overhead_ratio`` (ADR 0030).

    python tests/benchmarks/ckpt_overhead.py --dir /tmp/ckpt-bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from paired import Paired, PeakRss, alternating, disk_write_rate, ratios

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


def run(name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, every: int, batch: int,
        checkpoint: Callable[[int], None] | None, before_step: Callable[[], None] | None,
        finalize: Callable[[], None] | None) -> Result:
    """The shared compute loop; hooks measure how long they hold the training thread."""
    width = model[0].in_features
    data = torch.randn(batch, width)
    result = Result(name)
    pending = 0.0
    with PeakRss(0.01) as rss:
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
    result.peak_extra_rss_mb = rss.extra / 1e6
    return result


def free_port() -> int:
    """A TCP port nothing listens on now, for this process's one-rank process group."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure_disk(base: Path, size: int, when: str) -> float:
    """The disk's O_DIRECT write rate for one state's bytes (+fsync), printed: it bounds the last save's wait."""
    path = base / "disk-rate.bin"
    rate = disk_write_rate(path, size, direct=True)
    path.unlink()
    print(f"disk {when}: {rate / 1e6:.0f} MB/s O_DIRECT + fsync; the last checkpoint's {size / 1e6:.0f} MB "
          f"cannot be durable in less than {size / rate:.2f} s after the loop ends (every way pays it)", flush=True)
    return rate


def mean_stall(result: Result) -> float:
    """Mean seconds the training thread was held per checkpoint."""
    return statistics.mean(result.blocking_s) if result.blocking_s else 0.0


def main() -> None:
    """Run every way in paired rounds and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/ckpt-overhead")
    parser.add_argument("--width", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--host-cache-gb", type=float, default=50.0)
    parser.add_argument("--parser-threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=5, help="counted rounds (each runs every way once); at least 1")
    parser.add_argument("--priorities", default="normal",
                        help="comma-separated background_priority values, one engine each; the first is reported")
    parser.add_argument("--no-dcp", action="store_true", help="leave torch.distributed.checkpoint out (no vs_dcp)")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    priorities = [p.strip() for p in args.priorities.split(",") if p.strip()]
    if not priorities:
        parser.error("--priorities must name at least one background_priority")
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # another benchmark may hold a fixed one
    dist.init_process_group("gloo", rank=0, world_size=1)

    model, optimizer = build(args.width, args.layers)
    size = state_bytes(model, optimizer)
    print(f"state: {size / 1e6:.0f} MB ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params + AdamW), "
          f"{args.steps} steps, checkpoint every {args.every}, torch threads {torch.get_num_threads()}, "
          f"{args.pairs} pairs after one warm-up round", flush=True)
    disk = [measure_disk(base, size, "before")]

    def loop(name: str, **hooks: Callable | None) -> Result:  # type: ignore[type-arg]
        return run(name, model, optimizer, args.steps, args.every, args.batch, hooks.get("checkpoint"),
                   hooks.get("before_step"), hooks.get("finalize"))

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

    def ours(priority: str) -> tuple[str, Callable[[], Result], CheckpointEngine]:
        name = f"ours ({priority})"
        engine = CheckpointEngine(base / f"ours-{priority}", host_cache_size=args.host_cache_gb,
                                  parser_threads=args.parser_threads, keep_last=1, background_priority=priority)

        def save(step: int) -> None:
            engine.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, lazy=True)

        return name, lambda: loop(name, checkpoint=save, before_step=engine.wait_staged, finalize=engine.wait), engine

    methods: dict[str, Callable[[], Result]] = {
        "none": lambda: loop("none"),
        "sync torch.save": lambda: loop("sync torch.save", checkpoint=sync_save),
    }
    if not args.no_dcp:
        methods["dcp.async_save"] = lambda: loop("dcp.async_save", checkpoint=dcp_save, finalize=dcp_wait)
    engines: dict[str, CheckpointEngine] = {}
    for priority in priorities:
        name, method, engine = ours(priority)
        methods[name], engines[name] = method, engine
    reported = next(iter(engines))

    rounds: list[dict[str, Result]] = []
    for index in range(args.pairs + 1):  # round 0 is the warm-up
        label = "warm-up (not counted)" if index == 0 else f"pair {index}"
        results: dict[str, Result] = {}
        for name in alternating(list(methods), index):
            results[name] = methods[name]()
        print(f"{label}: " + "  ".join(
            f"{name} {results[name].total_s:.2f}s stall {mean_stall(results[name]):.3f}s "
            f"rss +{results[name].peak_extra_rss_mb:.0f}MB" for name in methods), flush=True)
        if index:
            rounds.append(results)
    disk.append(measure_disk(base, size, "after"))
    peak_pool = {name: engine.pool.peak_bytes for name, engine in engines.items()}
    for engine in engines.values():
        engine.close()

    def overheads(name: str) -> list[float]:
        """Seconds ``name`` took over no checkpointing, per round (negative: lost in that round's noise)."""
        return [r[name].total_s - r["none"].total_s for r in rounds]

    def versus(name: str, baseline: str) -> Paired:
        """``name``'s overhead over ``baseline``'s, per round (inf where the baseline showed no overhead)."""
        return Paired.of(o / b if b > 0 else float("inf") for o, b in zip(overheads(name), overheads(baseline)))

    def median_of(name: str, value: Callable[[Result], float]) -> float:
        return statistics.median(value(r[name]) for r in rounds)

    print(f"{'method (median of pairs)':<26}{'total_s':>9}{'slowdown':>10}{'stall/ckpt_s':>14}{'stall_max_s':>13}"
          f"{'peak_extra_rss_MB':>19}")
    for name in methods:
        slowdown = Paired.of(r[name].total_s / r["none"].total_s - 1 for r in rounds)
        print(f"{name:<26}{median_of(name, lambda r: r.total_s):>9.2f}{slowdown.median:>10.1%}"
              f"{median_of(name, mean_stall):>14.3f}{median_of(name, lambda r: max(r.blocking_s, default=0.0)):>13.3f}"
              f"{median_of(name, lambda r: r.peak_extra_rss_mb):>19.0f}")
    for name in engines:
        line = f"{name}: overhead_ratio per pair {versus(name, 'sync torch.save').rounds()}"
        if not args.no_dcp:
            line += f", vs_dcp per pair {versus(name, 'dcp.async_save').rounds()}"
        print(f"{line}; host pool peak {peak_pool[name] / 1e6:.0f} MB for a {size / 1e6:.0f} MB state")

    blocking = ratios([mean_stall(r[reported]) for r in rounds], [mean_stall(r["sync torch.save"]) for r in rounds])
    overhead = versus(reported, "sync torch.save")
    last = (f"blocking_ratio={blocking.median:.3f} overhead_ratio={overhead.median:.3f} "
            f"spread={overhead.spread()}")
    if not args.no_dcp:
        versus_dcp = versus(reported, "dcp.async_save")
        last += f" vs_dcp={versus_dcp.median:.3f} vs_dcp_spread={versus_dcp.spread()}"
    last += (f" stall_s={median_of(reported, mean_stall):.3f} "
             f"peak_rss_mb={median_of(reported, lambda r: r.peak_extra_rss_mb):.0f} pairs={args.pairs} "
             f"disk_mb_s={min(disk) / 1e6:.0f}-{max(disk) / 1e6:.0f}")
    print(f"reported: {reported} (memory bound is measured in a fresh process by ckpt_io.py)")
    print(last)
    dist.destroy_process_group()
    shutil.rmtree(base, ignore_errors=True)

if __name__ == "__main__":
    main()
