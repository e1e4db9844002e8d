"""Benchmark: persist throughput against the disk's own sequential write rate, restore time against safetensors.

All measured in the same run on the same directory (not a timed test):

* disk: 64 MiB writes from one preallocated buffer, then fsync;
* ours: ``CheckpointEngine.save`` of the same number of bytes (stage, write, checksum,
  fsync, manifest, rename) -> ``persist_ratio=ours/disk`` (target >= 0.8);
* restore: ``CheckpointEngine.load`` (reads and verifies checksums) against
  ``safetensors.torch.load_file`` of the same tensors -> ``restore_ratio`` (target <= 1.2).

    python tests/benchmarks/ckpt_io.py --dir /tmp/ckpt-io --gb 1
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

import psutil
import safetensors.torch
import torch

from ckpt_engine import CheckpointEngine


def disk_write_rate(path: Path, total: int, chunk: int = 64 << 20, direct: bool = False) -> float:
    """Bytes per second of a plain sequential write plus fsync (buffered, or O_DIRECT)."""
    buffer = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(chunk))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
    try:
        written = 0
        while written < total:
            written += os.write(fd, memoryview(buffer)[: min(chunk, total - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    path.unlink()
    return total / elapsed


def measure_peak_memory(root: Path, tensors: dict[str, torch.Tensor], size: int) -> list[str]:
    """Peak RSS above the live state during a save, for a cache larger and one smaller than the state."""
    process = psutil.Process()
    lines = []
    for cache_gb in (50.0, size / (1 << 30) / 8):
        engine = CheckpointEngine(root / f"cache-{cache_gb:.3f}", host_cache_size=cache_gb, keep_last=1)
        baseline, peak, done = process.memory_info().rss, 0, threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        engine.save(1, {"model": tensors}).wait()
        done.set()
        sampler.join()
        cache = min(int(cache_gb * (1 << 30)), size)
        extra = max(peak - baseline, 0)
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
    parser.add_argument("--repeat", type=int, default=3)
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
    for step in range(1, args.repeat + 1):
        disk.append(max(disk_write_rate(base / "raw.bin", size), disk_write_rate(base / "raw.bin", size, direct=True)))
        start = time.perf_counter()
        engine.save(step, {"model": tensors}).wait()
        ours.append(size / (time.perf_counter() - start))
    disk_rate, ours_rate = statistics.median(disk), statistics.median(ours)
    print(f"bytes={size / 1e9:.2f}GB disk_write(best of buffered, O_DIRECT)={disk_rate / 1e9:.2f}GB/s ours_persist={ours_rate / 1e9:.2f}GB/s "
          f"(runs disk={[round(x / 1e9, 2) for x in disk]} ours={[round(x / 1e9, 2) for x in ours]})")

    reference = base / "reference.safetensors"
    safetensors.torch.save_file(tensors, reference)
    destination = {key: torch.empty_like(value) for key, value in tensors.items()}  # a model's parameters
    plain, restored = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        loaded = safetensors.torch.load_file(reference)
        for key, value in loaded.items():
            destination[key].copy_(value)
        plain.append(time.perf_counter() - start)
        del loaded
        start = time.perf_counter()
        state = engine.load()
        for key, value in state["model"].items():
            destination[key].copy_(value)
        restored.append(time.perf_counter() - start)
        assert torch.equal(destination["layer0.weight"], tensors["layer0.weight"])
        del state
    plain_s, ours_s = statistics.median(plain), statistics.median(restored)
    print(f"restore: safetensors.load_file={plain_s:.3f}s ours_load(verified)={ours_s:.3f}s "
          "(both copied into preallocated tensors, as load_state_dict does; page cache warm for both)")
    engine.close()
    memory_lines = measure_peak_memory(base / "memory", tensors, size)
    for line in memory_lines:
        print(line)
    print(f"persist_ratio={ours_rate / disk_rate:.3f} restore_ratio={ours_s / plain_s:.3f}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
