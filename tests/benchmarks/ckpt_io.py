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
import os
import shutil
import statistics
import time
from pathlib import Path

import safetensors.torch
import torch

from ckpt_engine import CheckpointEngine


def disk_write_rate(path: Path, total: int, chunk: int = 64 << 20) -> float:
    """Bytes per second of a plain sequential write plus fsync."""
    buffer = memoryview(os.urandom(chunk))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total:
            written += os.write(fd, buffer[: min(chunk, total - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    path.unlink()
    return total / elapsed


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
        disk.append(disk_write_rate(base / "raw.bin", size))
        start = time.perf_counter()
        engine.save(step, {"model": tensors}).wait()
        ours.append(size / (time.perf_counter() - start))
    disk_rate, ours_rate = statistics.median(disk), statistics.median(ours)
    print(f"bytes={size / 1e9:.2f}GB disk_write={disk_rate / 1e9:.2f}GB/s ours_persist={ours_rate / 1e9:.2f}GB/s "
          f"(runs disk={[round(x / 1e9, 2) for x in disk]} ours={[round(x / 1e9, 2) for x in ours]})")

    reference = base / "reference.safetensors"
    safetensors.torch.save_file(tensors, reference)
    plain, restored = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        loaded = safetensors.torch.load_file(reference)
        plain.append(time.perf_counter() - start)
        del loaded
        start = time.perf_counter()
        state = engine.load()
        restored.append(time.perf_counter() - start)
        assert torch.equal(state["model"]["layer0.weight"], tensors["layer0.weight"])
        del state
    plain_s, ours_s = statistics.median(plain), statistics.median(restored)
    print(f"restore: safetensors.load_file={plain_s:.3f}s ours_load(verified)={ours_s:.3f}s (page cache warm for both)")
    print(f"persist_ratio={ours_rate / disk_rate:.3f} restore_ratio={ours_s / plain_s:.3f}")
    engine.close()
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
