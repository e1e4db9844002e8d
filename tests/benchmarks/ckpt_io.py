"""Benchmark: persist throughput against the disk's own sequential write rate, restore time against safetensors.

All measured in the same run on the same directory (not a timed test):

* disk: 64 MiB writes from one preallocated buffer, then fsync (best of buffered, measured
  once, and O_DIRECT, measured each repeat);
* ours: ``CheckpointEngine.save`` of the same number of bytes (stage, write, checksum,
  fsync, manifest, rename) -> ``persist_ratio``, the median over repeats of ours/disk
  measured back to back in the same repeat (target >= 0.8);
* restore: ``CheckpointEngine.load`` (reads and verifies checksums) against
  ``safetensors.torch.load_file`` of the same tensors, both copied into preallocated
  tensors as ``load_state_dict`` does -> ``restore_ratio`` (target <= 1.2).

Conditions, the same for both sides of each ratio:

* before every timed write the engine's queued retention deletes are drained and
  ``os.sync()`` runs, so no earlier write or unlink is still going to the disk while the
  next write is timed;
* both sides keep their newest file and delete the one before right after writing it
  (ours: retention with ``keep_last=1``), and the two alternate in ABBA order (each goes
  first in every other repeat): on this virtual disk a write runs up to ~30% slower or
  faster depending on what was written and deleted just before it;
* ``restore_ratio`` is measured cold: the files' pages are dropped from the page cache
  (``POSIX_FADV_DONTNEED`` after fsync) before each load, as on a resume, which is a new
  process, usually on another node after a failover or a Spot reclaim.
  ``restore_ratio_warm`` repeats it with both files in the page cache, where verifying
  every byte costs one more pass over memory than the plain copy (see ADR 0003).

    python tests/benchmarks/ckpt_io.py --dir /tmp/ckpt-io --gb 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import safetensors.torch
import torch
from paired import PeakRss, alternating, disk_write_rate, ratios

from ckpt_engine import CheckpointEngine


def settle(engine: CheckpointEngine) -> None:
    """Let earlier work reach the disk before the next timed write: queued retention deletes, then ``sync``."""
    engine.wait()
    os.sync()


def evict(files: list[Path]) -> None:
    """Drop the files' pages from the page cache (they are clean after fsync), as a new node would start."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_peak_memory(root: Path, tensors: dict[str, torch.Tensor], size: int) -> list[str]:
    """Peak RSS above the live state during a save, for a cache larger and one smaller than the state."""
    lines = []
    for cache_gb in (50.0, size / (1 << 30) / 8):
        engine = CheckpointEngine(root / f"cache-{cache_gb:.3f}", host_cache_size=cache_gb, keep_last=1)
        with PeakRss() as rss:
            engine.save(1, {"model": tensors}).wait()
        cache = min(int(cache_gb * (1 << 30)), size)
        extra = rss.extra
        lines.append(f"memory: host_cache_size={cache_gb:.3f}GB state={size / 1e6:.0f}MB peak_extra_rss={extra / 1e6:.0f}MB "
                     f"pool_peak={engine.pool.peak_bytes / 1e6:.0f}MB bound(cache used+10%)={cache * 1.1 / 1e6:.0f}MB "
                     f"within={'yes' if extra <= cache * 1.1 else 'no'}")
        engine.close()
    return lines


def main() -> None:
    """Measure and print the two ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/tmp/ckpt-io")
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--parser-threads", type=int, default=1)
    args = parser.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    total = int(args.gb * (1 << 30))
    tensors = {f"layer{i}.weight": torch.randn(total // 16 // 4) for i in range(16)}
    size = sum(t.numel() * t.element_size() for t in tensors.values())

    disk, ours = [], []
    engine = CheckpointEngine(base / "ours", host_cache_size=max(args.gb * 1.1, 0.1),
                              parser_threads=args.parser_threads, keep_last=1)

    settle(engine)
    buffered = disk_write_rate(base / "raw-buffered.bin", size)  # once: slower than O_DIRECT on most disks
    (base / "raw-buffered.bin").unlink()

    def measure_disk(step: int) -> None:
        settle(engine)
        direct = disk_write_rate(base / f"raw-{step}.bin", size, direct=True)
        (base / f"raw-{step - 1}.bin").unlink(missing_ok=True)  # as our commit hands the previous checkpoint to retention
        disk.append(max(direct, buffered))

    def measure_ours(step: int) -> None:
        settle(engine)
        start = time.perf_counter()
        engine.save(step, {"model": tensors}).wait()
        ours.append(size / (time.perf_counter() - start))

    sides = {"disk": measure_disk, "ours": measure_ours}
    for step in range(1, args.repeat + 1):  # ABBA: each side goes first in every other repeat
        for side in alternating(list(sides), step - 1):
            sides[side](step)
    disk_rate, ours_rate = statistics.median(disk), statistics.median(ours)
    persist = ratios(ours, disk)  # paired: the disk's rate drifts
    print(f"bytes={size / 1e9:.2f}GB disk_write(best of buffered, O_DIRECT)={disk_rate / 1e9:.2f}GB/s ours_persist={ours_rate / 1e9:.2f}GB/s "
          f"(runs disk={[round(x / 1e9, 2) for x in disk]} ours={[round(x / 1e9, 2) for x in ours]})")

    settle(engine)
    reference = base / "reference.safetensors"
    safetensors.torch.save_file(tensors, reference)
    ours_dir = base / "ours" / f"checkpoint-{args.repeat}"
    destination = {key: torch.empty_like(value) for key, value in tensors.items()}  # a model's parameters

    def plain_load() -> None:
        loaded = safetensors.torch.load_file(reference)
        for key, value in loaded.items():
            destination[key].copy_(value)

    def our_load() -> None:
        state = engine.load()
        for key, value in state["model"].items():
            destination[key].copy_(value)

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for cache in ("cold", "warm"):
            for name, load, files in (("plain", plain_load, [reference]), ("ours", our_load, list(ours_dir.iterdir()))):
                if cache == "cold":
                    evict(files)
                else:
                    load()  # bring the pages in
                start = time.perf_counter()
                load()
                times.setdefault((name, cache), []).append(time.perf_counter() - start)
                assert torch.equal(destination["layer0.weight"], tensors["layer0.weight"])
                for value in destination.values():
                    value.zero_()
    median = {key: statistics.median(value) for key, value in times.items()}
    for cache in ("cold", "warm"):
        print(f"restore ({cache} page cache): safetensors.load_file={median['plain', cache]:.3f}s "
              f"ours_load(verified)={median['ours', cache]:.3f}s (both copied into preallocated tensors, as "
              f"load_state_dict does; runs plain={[round(x, 3) for x in times['plain', cache]]} "
              f"ours={[round(x, 3) for x in times['ours', cache]]})")
    engine.close()
    memory_lines = measure_peak_memory(base / "memory", tensors, size)
    for line in memory_lines:
        print(line)
    print(f"persist_ratio={persist.median:.3f} persist_spread={persist.spread()} restore_ratio={median['ours', 'cold'] / median['plain', 'cold']:.3f} "
          f"restore_ratio_warm={median['ours', 'warm'] / median['plain', 'warm']:.3f}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
