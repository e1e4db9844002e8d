"""What the checkpoint benchmarks share: rounds in alternating order, medians of paired ratios, peak RSS.

On this shared 2-core machine one run of a side can be 30% off its neighbour's for reasons
that have nothing to do with it (another tenant, what the disk just wrote), so a figure is
the median of ratios taken inside each round (pair), never a ratio of two separate
medians or of two best runs, and every round is printed with it. ``ckpt_io.py`` and
``ckpt_overhead.py`` use these, and the disk's own write rate, which decides what the
last (unhidden) save of a run can cost.
"""

from __future__ import annotations

import mmap
import os
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import psutil


def alternating(names: Sequence[str], index: int) -> list[str]:
    """The order of round ``index``: as given in even rounds, reversed in odd ones (ABBA for two sides).

    Every side runs as often early as late in a round, so a drift over the round (the
    disk filling its cache, another process starting) lands on all sides alike.
    """
    return list(names) if index % 2 == 0 else list(reversed(names))


@dataclass(frozen=True)
class Paired:
    """The median of per-round values and their range (min-max)."""

    median: float
    lo: float
    hi: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Paired:
        """Summary of ``values`` (one per round); at least one is needed."""
        kept = tuple(values)
        if not kept:
            raise ValueError("no rounds to summarise")
        return cls(statistics.median(kept), min(kept), max(kept), kept)

    def spread(self, digits: int = 3) -> str:
        """``lo-hi`` as printed on a benchmark's last line."""
        return f"{self.lo:.{digits}f}-{self.hi:.{digits}f}"

    def rounds(self, digits: int = 3) -> list[float]:
        """Every round's value, rounded for printing."""
        return [round(value, digits) for value in self.values]


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Paired:
    """Median and range of numerator/denominator taken round by round (paired)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators: rounds must pair")
    return Paired.of(n / d for n, d in zip(numerators, denominators))


class PeakRss:
    """This process's peak RSS while the block runs, sampled every ``interval`` seconds (``extra``: above the start)."""

    def __init__(self, interval: float = 0.005) -> None:
        self.process, self.interval = psutil.Process(), interval
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-rss")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> Self:
        self.baseline = self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra(self) -> int:
        """Bytes of the peak above the RSS at the start."""
        return max(self.peak - self.baseline, 0)


def disk_write_rate(path: Path, total: int, chunk: int = 64 << 20, direct: bool = False) -> float:
    """Bytes per second of a plain sequential write of a new file plus fsync (buffered, or O_DIRECT).

    The file is left in place: the caller deletes it before the next write of the same
    kind, as the engine's retention deletes its previous checkpoint. ``total`` is rounded up
    to whole 4 KiB blocks (O_DIRECT writes whole blocks) and the rate is of what was written.
    """
    total = -(-total // 4096) * 4096
    buffer = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(chunk))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0), 0o644)
    try:
        written = 0
        while written < total:
            written += os.write(fd, memoryview(buffer)[: min(chunk, total - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return total / (time.perf_counter() - start)
