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
* a ratio's round counts only when its baseline's overhead in that round is clearly above
  the loop's noise (``overhead_rounds.py``: more than 3 x the robust spread of the
  no-checkpoint runs, one per round); the others are left out, so the spread is finite.
  The valid-round counts are printed; fewer than 3 valid rounds fails the run (exit 2,
  with what was measured), it does not print a figure.

The last line::

    blocking_ratio=<median> overhead_ratio=<median> spread=<lo>-<hi> vs_dcp=<median>
    vs_dcp_spread=<lo>-<hi> stall_s=<median> peak_rss_mb=<median> pairs=<n> disk_mb_s=<lo>-<hi>
    valid=<n>/<pairs> vs_dcp_valid=<n>/<pairs>

``--interval`` adds what users choose by (issue 47 item 4), for every way: the shortest
checkpoint interval in steps whose slowdown stays under 1%, the work a fault loses at that
interval and the goodput at one fault per hour (``overhead_rounds.shortest_interval``),
from the measured step time, each way's cost per checkpoint (its overhead less its final
wait, per checkpoint) and its measured time from save to durable; and a line
``interval_steps=<ours> interval_steps_sync=<n> interval_steps_dcp=<n> lost_s=<ours>
goodput_1fph=<ours>``.

``disk_mb_s`` is the directory's O_DIRECT write rate measured before the first round and
after the last: the final checkpoint's durable write cannot overlap training, so on a
slower disk the same engine shows a larger ``overhead_ratio`` (ADR 0030).

    python tests/benchmarks/ckpt_overhead.py --dir /tmp/ckpt-bench [--peers all] [--interval]

``--peers`` (``ckpt_peers.py``) adds DCP's process-based async_save, torchsnapshot and
DeepSpeed's engines as more ways, each a row and a ``vs_<peer>=`` median on the last line
(``n/a`` where too few rounds are valid for it); each that cannot run here says why.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ckpt_peers import PEERS, make_peers
from overhead_rounds import (
    TooFewValidRounds,
    ValidRatio,
    noise_s,
    shortest_interval,
    valid_ratio,
)
from paired import Paired, PeakRss, alternating, disk_write_rate, ratios

from ckpt_engine import CheckpointEngine


@dataclass
class Result:
    """Timings of one way of checkpointing."""

    name: str
    total_s: float = 0.0
    blocking_s: list[float] = field(default_factory=list)
    peak_extra_rss_mb: float = 0.0
    final_s: float = 0.0  # the wait for durability after the loop


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
            t0 = time.perf_counter()
            finalize()
            result.final_s = time.perf_counter() - t0
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
    parser.add_argument("--peers", default="",
                        help=f"comma-separated peers to run beside ours, or 'all' ({', '.join(PEERS)}); each that "
                             "cannot run here says why")
    parser.add_argument("--interval", action="store_true",
                        help="also report the shortest interval with <1%% slowdown, work lost per fault, goodput")
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
    durable_s: dict[str, list[float]] = {}  # per way: seconds from the save call to durable, every checkpoint

    def dcp_wait() -> None:
        while dcp_futures:
            future = dcp_futures.pop(0)
            (getattr(future, "upload_completion", None) or future).result()  # type: ignore[union-attr]

    def dcp_save(step: int) -> None:
        dcp_wait()  # one in flight, like ours
        shutil.rmtree(base / f"dcp-{step - 2 * args.every}", ignore_errors=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        started = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=str(base / f"dcp-{step}"))
        done = getattr(future, "upload_completion", None) or future
        done.add_done_callback(  # type: ignore[union-attr]
            lambda _: durable_s.setdefault("dcp.async_save", []).append(time.perf_counter() - started))
        staging = getattr(future, "staging_completion", None)
        if staging is not None:
            staging.result()
        dcp_futures.append(future)

    def ours(priority: str) -> tuple[str, Callable[[], Result], CheckpointEngine]:
        name = f"ours ({priority})"
        engine = CheckpointEngine(base / f"ours-{priority}", host_cache_size=args.host_cache_gb,
                                  parser_threads=args.parser_threads, keep_last=1, background_priority=priority)

        def save(step: int) -> None:
            started = time.perf_counter()
            handle = engine.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, lazy=True)
            handle.persisted.add_done_callback(
                lambda _: durable_s.setdefault(name, []).append(time.perf_counter() - started))

        return name, lambda: loop(name, checkpoint=save, before_step=engine.wait_staged, finalize=engine.wait), engine

    methods: dict[str, Callable[[], Result]] = {
        "none": lambda: loop("none"),
        "sync torch.save": lambda: loop("sync torch.save", checkpoint=sync_save),
    }
    if not args.no_dcp:
        methods["dcp.async_save"] = lambda: loop("dcp.async_save", checkpoint=dcp_save, finalize=dcp_wait)
    which = list(PEERS) if args.peers.strip() == "all" else [p.strip() for p in args.peers.split(",") if p.strip()]
    peers, unavailable = make_peers(which, base, lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                                    {"model": model, "optim": optimizer}, args.every, durable_s)
    for key, reason in unavailable.items():
        print(f"peer {key}: cannot run here: {reason}", flush=True)
    for peer in peers:
        methods[peer.name] = (lambda peer=peer: loop(peer.name, checkpoint=peer.checkpoint,  # type: ignore[misc]
                                                     finalize=peer.finalize))
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

    noise = noise_s([r["none"].total_s for r in rounds])
    failures: list[str] = []

    def versus(name: str, baseline: str, label: str) -> ValidRatio | None:
        """``name``'s overhead over ``baseline``'s, per round where the baseline's stands clear of the noise."""
        try:
            return valid_ratio(overheads(name), overheads(baseline), noise, label=label)
        except TooFewValidRounds as exc:
            failures.append(str(exc))
            return None

    def median_of(name: str, value: Callable[[Result], float]) -> float:
        return statistics.median(value(r[name]) for r in rounds)

    print(f"{'method (median of pairs)':<34}{'total_s':>9}{'slowdown':>10}{'stall/ckpt_s':>14}{'stall_max_s':>13}"
          f"{'peak_extra_rss_MB':>19}")
    for name in methods:
        slowdown = Paired.of(r[name].total_s / r["none"].total_s - 1 for r in rounds)
        print(f"{name:<34}{median_of(name, lambda r: r.total_s):>9.2f}{slowdown.median:>10.1%}"
              f"{median_of(name, mean_stall):>14.3f}{median_of(name, lambda r: max(r.blocking_s, default=0.0)):>13.3f}"
              f"{median_of(name, lambda r: r.peak_extra_rss_mb):>19.0f}")
    print(f"noise of the no-checkpoint loop: {noise:.3f} s (1.4826 x MAD of {len(rounds)} runs, at least 0.5% of "
          f"their median); a round counts for a ratio when its baseline's overhead is above {3 * noise:.3f} s")
    baselines = {"sync torch.save": "overhead_ratio"} | ({} if args.no_dcp else {"dcp.async_save": "vs_dcp"})
    for baseline, label in baselines.items():
        print(f"{baseline} overhead per pair {[round(o, 3) for o in overheads(baseline)]} s")
    found: dict[tuple[str, str], ValidRatio | None] = {}
    for name in engines:
        parts = []
        for baseline, label in baselines.items():
            ratio = found[name, label] = versus(name, baseline, f"{name} {label}")
            parts.append(f"{label} per valid pair {[round(v, 3) for v in ratio.values]} ({ratio.valid}/{ratio.rounds} "
                         "valid)" if ratio is not None else f"{label}: too few valid pairs")
        print(f"{name}: " + ", ".join(parts) + f"; host pool peak {peak_pool[name] / 1e6:.0f} MB for a "
              f"{size / 1e6:.0f} MB state")

    peer_ratios = {peer.short: versus(reported, peer.name, f"{reported} vs_{peer.short}") for peer in peers}
    for peer in peers:
        ratio = peer_ratios[peer.short]
        print(f"{reported} vs {peer.name}: " + (
            f"per valid pair {[round(v, 3) for v in ratio.values]} ({ratio.valid}/{ratio.rounds} valid)"
            if ratio is not None else "too few valid pairs (the peer's overhead is within the noise)"))
    interval_line = ""
    if args.interval:
        interval_line = print_intervals(methods, rounds, args.steps, args.every, durable_s, reported, noise,
                                        {peer.name: peer.short for peer in peers})

    print(f"reported: {reported} (memory bound is measured in a fresh process by ckpt_io.py)")
    dist.destroy_process_group()
    shutil.rmtree(base, ignore_errors=True)
    overhead, versus_dcp = found[reported, "overhead_ratio"], found.get((reported, "vs_dcp"))
    if overhead is None or (not args.no_dcp and versus_dcp is None):
        for failure in failures:  # a peer's too few valid rounds is its n/a, not why the run failed
            if failure.startswith((f"{reported} overhead_ratio:", f"{reported} vs_dcp:")):
                print(f"FAILED: {failure}", file=sys.stderr)
        print(f"FAILED: fewer than 3 valid rounds; no figures (noise {noise:.3f} s)", flush=True)
        sys.exit(2)
    blocking = ratios([mean_stall(r[reported]) for r in rounds], [mean_stall(r["sync torch.save"]) for r in rounds])
    last = (f"blocking_ratio={blocking.median:.3f} overhead_ratio={overhead.median:.3f} "
            f"spread={overhead.spread()}")
    if versus_dcp is not None:
        last += f" vs_dcp={versus_dcp.median:.3f} vs_dcp_spread={versus_dcp.spread()}"
    last += (f" stall_s={median_of(reported, mean_stall):.3f} "
             f"peak_rss_mb={median_of(reported, lambda r: r.peak_extra_rss_mb):.0f} pairs={args.pairs} "
             f"disk_mb_s={min(disk) / 1e6:.0f}-{max(disk) / 1e6:.0f} valid={overhead.valid}/{overhead.rounds}")
    if versus_dcp is not None:
        last += f" vs_dcp_valid={versus_dcp.valid}/{versus_dcp.rounds}"
    for short, ratio in peer_ratios.items():  # a peer with too few valid rounds is n/a, not a failed run
        last += f" vs_{short}=" + (f"{ratio.median:.3f}" if ratio is not None else "n/a")
    if interval_line:
        print(interval_line)
    print(last)


def print_intervals(methods: dict[str, Callable[[], Result]], rounds: list[dict[str, Result]], steps: int,
                    every: int, durable_s: dict[str, list[float]], reported: str, noise: float,
                    peer_shorts: dict[str, str]) -> str:
    """The interval table (issue 47 item 4) for every way; returns its summary line."""
    step_s = statistics.median(r["none"].total_s for r in rounds) / steps
    checkpoints = steps // every
    print(f"interval (1% slowdown bound, one fault per hour; step {step_s * 1e3:.1f} ms, from the no-checkpoint runs):")
    print(f"{'method':<34}{'cost/ckpt_s':>12}{'durable_s':>11}{'interval_steps':>16}{'slowdown':>10}"
          f"{'lost_s/fault':>14}{'goodput_1fph':>14}")
    figures = {}
    for name in methods:
        if name == "none":
            continue
        cost = statistics.median((r[name].total_s - r["none"].total_s - r[name].final_s) / checkpoints
                                 for r in rounds)
        durable = statistics.median(durable_s.get(name, [])) if durable_s.get(name) else 0.0
        # a synchronous save is durable when it returns: its whole cost is in ``cost``, nothing persists after
        figures[name] = found = shortest_interval(step_s, cost, durable)
        within = abs(cost) * checkpoints <= 3 * noise  # this way's whole overhead is not clear of the noise
        print(f"{name:<34}{cost:>12.3f}{durable:>11.3f}{found.interval_steps:>16d}{found.slowdown:>10.2%}"
              f"{found.lost_s_per_fault:>14.1f}{found.goodput:>14.2%}" + ("  (cost within noise)" if within else ""))
    ours = figures[reported]
    line = f"interval_steps={ours.interval_steps}"
    shorts = {"sync torch.save": "sync", "dcp.async_save": "dcp"} | peer_shorts
    for name, short in shorts.items():
        if name in figures:
            line += f" interval_steps_{short}={figures[name].interval_steps}"
    line += f" lost_s={ours.lost_s_per_fault:.1f} goodput_1fph={ours.goodput:.4f}"
    for name, short in shorts.items():
        if name in figures:
            line += f" goodput_1fph_{short}={figures[name].goodput:.4f}"
    return line


if __name__ == "__main__":
    main()
