"""Staging: planned tensor bytes copied device -> bounded host slabs, handed to each file's writer as segments."""

from __future__ import annotations

import ctypes
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ckpt_engine.formats import Blob, FilePlan
from ckpt_engine.pool import SEGMENT_ALIGNMENT, HostBufferPool, Slab

FIRST_SEGMENT_BYTES = 4 << 20  # segment size while the first slab fills (see _StagingRun.segment_limit)
PACK_BELOW_BYTES = 64 << 10  # smaller CPU blobs are packed into shared segments (the writer slices them apart)
PACK_RUN_BYTES = 1 << 20  # a packed segment is handed over once it holds this much
# memmove without releasing the GIL, for small copies: releasing it for a few bytes means
# queueing behind the writer thread to get it back (up to the 5 ms switch interval)
_memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value)
_RELEASE_GIL_ABOVE_BYTES = 256 << 10


@dataclass
class Segment:
    """A staged run of bytes in a slab; ``event`` (CUDA) must complete before it is read."""

    slab: Slab
    offset: int
    nbytes: int
    event: Any = None


@dataclass
class Abort:
    """Staging failed: nothing more comes on this queue."""

    error: BaseException


SegmentQueue = queue.SimpleQueue[Segment | Abort]


@dataclass
class _Source:
    """Where one blob's bytes are read from: an address (contiguous CPU memory), else a flat tensor."""

    on_gpu: bool
    by_address: bool
    address: int = 0
    flat: Any = None


class Stager:
    """Copies the blobs of planned files into the pool's slabs, in order, on the caller's thread.

    ``stream`` (CUDA) is the side stream device copies run on; None without CUDA.
    """

    def __init__(self, pool: HostBufferPool, stream: Any = None) -> None:
        self.pool, self.stream = pool, stream

    def stage(self, files: Sequence[FilePlan], queues: Sequence[SegmentQueue]) -> float:
        """Stage every file's blobs into its queue; returns the seconds it took. On failure each queue gets an Abort."""
        started = time.perf_counter()
        run = _StagingRun(self.pool, self.stream)
        try:
            for plan, out in zip(files, queues):
                run.stage_file(plan, out)
            run.synchronize()
        except BaseException as exc:
            for out in queues:
                out.put(Abort(exc))
            raise
        finally:
            run.seal()
        return time.perf_counter() - started


class _StagingRun:
    """One ``Stager.stage`` call's state: the slab being filled, the bytes staged, the open packed run."""

    def __init__(self, pool: HostBufferPool, stream: Any) -> None:
        self.pool, self.stream = pool, stream
        self.slab: Slab | None = None
        self.staged = 0
        self.run: tuple[SegmentQueue, int] | None = None  # (queue, start offset) of small blobs packed back to back

    def stage_file(self, plan: FilePlan, out: SegmentQueue) -> None:
        for blob in plan.blobs:
            self.stage_blob(blob, out)
        self.close_run()  # a run never spans two files: each file has its own queue

    def stage_blob(self, blob: Blob, out: SegmentQueue) -> None:
        tensor = blob.tensor
        on_gpu = self.stream is not None and tensor.is_cuda
        # CPU bytes are copied by address with one plain memmove (no tensor slices; not torch's
        # copy_, which splits large copies over its intra-op threads and takes the writers'
        # cores); large copies release the GIL, small ones keep it
        by_address = not on_gpu and tensor.device.type == "cpu" and tensor.is_contiguous()
        packed = by_address and blob.nbytes < PACK_BELOW_BYTES
        if not packed:
            self.close_run()
        source = self.source_of(blob, on_gpu, by_address)
        position = 0
        while position < blob.nbytes:
            slab = self.slab_with_room()
            count = min(slab.capacity - slab.fill, blob.nbytes - position, self.segment_limit(slab))
            offset = slab.fill
            event = self.copy(source, slab, offset, position, count)
            if packed:  # small blobs: one segment for many, cut at PACK_RUN_BYTES
                self.pack(out, offset, count)
            else:
                self.hand_over(out, offset, count, event)
            position += count
            self.staged += count

    def source_of(self, blob: Blob, on_gpu: bool, by_address: bool) -> _Source:
        if by_address:
            return _Source(on_gpu, by_address, address=blob.tensor.data_ptr())
        if on_gpu:  # a non-contiguous tensor is made contiguous on the side stream, before its copies
            with torch.cuda.stream(self.stream):
                return _Source(on_gpu, by_address, flat=blob.source)
        return _Source(on_gpu, by_address, flat=blob.source)

    def slab_with_room(self) -> Slab:
        if self.slab is None or self.slab.fill >= self.slab.capacity:
            self.close_run()
            if self.slab is not None:
                self.pool.seal(self.slab)
            self.slab = self.pool.acquire()
        return self.slab

    def segment_limit(self, slab: Slab) -> int:
        # short segments through the first slab: the disk starts ~1 ms after save() and never
        # waits for a whole slab's copy
        return FIRST_SEGMENT_BYTES if self.staged < self.pool.slab_bytes else slab.capacity

    def copy(self, source: _Source, slab: Slab, offset: int, position: int, count: int) -> Any:
        """Copy ``count`` bytes from ``position`` of the source to ``offset`` in the slab; the CUDA event, if any."""
        if source.by_address:
            move = ctypes.memmove if count > _RELEASE_GIL_ABOVE_BYTES else _memmove_holding_gil
            move(slab.address + offset, source.address + position, count)
            return None
        if source.on_gpu:
            with torch.cuda.stream(self.stream):
                slab.tensor[offset:offset + count].copy_(source.flat[position:position + count], non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            return event
        slab.tensor[offset:offset + count].copy_(source.flat[position:position + count])
        return None

    def pack(self, out: SegmentQueue, offset: int, count: int) -> None:
        assert self.slab is not None
        if self.run is None:
            self.run = (out, offset)
        self.slab.fill = offset + count
        if self.slab.fill - self.run[1] >= PACK_RUN_BYTES:
            self.close_run()

    def close_run(self) -> None:
        if self.run is not None:
            (out, offset), self.run = self.run, None
            assert self.slab is not None
            self.hand_over(out, offset, self.slab.fill - offset)

    def hand_over(self, out: SegmentQueue, offset: int, count: int, event: Any = None) -> None:
        slab = self.slab
        assert slab is not None
        self.pool.ref(slab)
        out.put(Segment(slab, offset, count, event))
        slab.fill = min(slab.capacity, offset + count + (-(offset + count) % SEGMENT_ALIGNMENT))

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def seal(self) -> None:
        if self.slab is not None:
            self.pool.seal(self.slab)
