"""File formats the engine writes from staged bytes: safetensors, torch zip (``torch.load``-able) and raw bytes.

A :class:`FilePlan` is built on the training thread and holds only metadata plus a
list of :class:`Blob` (tensor bytes still to be staged); ``render`` runs on a writer
thread and pulls the staged bytes of each blob in order, so a file never has to fit
in host memory at once.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import pickle
import struct
import uuid
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

try:  # ISA-L's CRC-32 is zlib's checksum at ~3x the speed: the zip CRC was the save's largest CPU cost (ADR 0030)
    from isal.isal_zlib import crc32
except ImportError:  # an image without isal (the vendored engine needs only the standard library's)
    from zlib import crc32

ALIGNMENT = 64
DATA_ALIGNMENT = 4096  # large records start on a block boundary so O_DIRECT can write them from staged memory
_LARGE_RECORD = 64 << 10
_ZIP64_LIMIT = 0xFFFFFFFF

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a checkpoint is planned (also a decorator).

    Planning allocates a few objects per tensor; in a training process, with millions of
    live objects, every few hundred allocations start a collection, which more than
    doubled the planning time of a 20,000-tensor state. Nothing planned forms a cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Sink(Protocol):
    """Where a renderer writes a file's bytes, in order."""

    def write(self, data: bytes | memoryview) -> None: ...


BlobSegments = Callable[[int], Iterator[memoryview]]


@dataclass
class Blob:
    """Bytes of one tensor or storage still to be staged (``tensor``: dense, any device)."""

    tensor: torch.Tensor
    nbytes: int

    @property
    def source(self) -> torch.Tensor:
        """The bytes as a flat uint8 tensor on the tensor's device (a copy only when not contiguous)."""
        return _flat_bytes(self.tensor)


@dataclass
class FilePlan(ABC):
    """One file of a checkpoint: its name, the blobs it needs staged, and how to render it."""

    name: str
    blobs: list[Blob] = field(default_factory=list)

    @abstractmethod
    def render(self, sink: Sink, segments: BlobSegments) -> None:
        """Write the whole file to ``sink``; ``segments(i)`` yields blob i's staged bytes."""

    @property
    def payload_bytes(self) -> int:
        """Bytes that go through the host buffer pool."""
        return sum(blob.nbytes for blob in self.blobs)


@dataclass
class BytesFile(FilePlan):
    """A small file whose bytes are known at plan time (json, pickled args)."""

    data: bytes = b""

    def render(self, sink: Sink, segments: BlobSegments) -> None:
        sink.write(self.data)


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


def _storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class SafetensorsFile(FilePlan):
    """A flat name -> tensor mapping in the safetensors format."""

    header: bytes = b""

    def render(self, sink: Sink, segments: BlobSegments) -> None:
        sink.write(struct.pack("<Q", len(self.header)))
        sink.write(self.header)
        for index in range(len(self.blobs)):
            for segment in segments(index):
                sink.write(segment)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


@gc_paused()
def plan_safetensors(name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None,
                     *, drop_shared: bool = True) -> SafetensorsFile:
    """Plan a safetensors file; tensors sharing storage keep only their first name (tied weights)."""
    kept: list[tuple[str, torch.Tensor]] = []
    seen: set[tuple[str, int]] = set()
    for key, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"{key}: dtype {tensor.dtype} has no safetensors name")
        storage_key = _storage_key(tensor)
        if tensor.numel() and storage_key in seen:
            if drop_shared:
                continue
            raise ValueError(f"{key} shares storage with another tensor")
        if tensor.numel():
            seen.add(storage_key)
        kept.append((key, tensor))
    # tensors whose size is a whole number of disk blocks first: every one of them starts on a
    # block boundary, so O_DIRECT writes it straight from the staged memory; then the rest,
    # widest dtypes first, which keeps every tensor aligned to its element size (zero-copy loads)
    kept.sort(key=lambda item: (item[1].numel() * item[1].element_size() % DATA_ALIGNMENT != 0,
                                -item[1].element_size()))
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs: list[Blob] = []
    offset = 0
    for key, tensor in kept:
        nbytes = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                       "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        if nbytes:  # a state_dict's tensors are detached already; a Parameter's .data may be swapped later
            plain = type(tensor) is torch.Tensor and not tensor.requires_grad
            blobs.append(Blob(tensor if plain else tensor.detach(), nbytes))
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % DATA_ALIGNMENT)  # tensor data starts on a disk block boundary
    return SafetensorsFile(name=name, blobs=blobs, header=raw)


def parse_safetensors(buffer: np.ndarray) -> dict[str, torch.Tensor]:
    """Tensors from safetensors bytes held in ``buffer``, as views where alignment allows."""
    (header_len,) = struct.unpack("<Q", buffer[:8].tobytes())
    header = json.loads(buffer[8:8 + header_len].tobytes())
    header.pop("__metadata__", None)
    base = torch.from_numpy(buffer)
    start = 8 + header_len
    out: dict[str, torch.Tensor] = {}
    for key, info in header.items():
        dtype = DTYPES_BY_NAME[info["dtype"]]
        begin, end = (start + o for o in info["data_offsets"])
        raw = base[begin:end]
        size = torch.empty((), dtype=dtype).element_size()
        if begin % size:
            raw = raw.clone()
        out[key] = raw.view(dtype).reshape(info["shape"])
    return out


# the legacy typed storage class torch.save records for each dtype (e.g. torch.FloatStorage)
_STORAGE_TYPES = {dtype: getattr(torch, name) for dtype, name in torch.storage._dtype_to_storage_type_map().items()}


class _TensorStorage:
    """A tensor's storage as ``torch.save`` records it, without building a ``TypedStorage``."""

    __slots__ = ("numel", "storage_type", "untyped")

    def __init__(self, untyped: torch.UntypedStorage, storage_type: type, numel: int) -> None:
        self.untyped, self.storage_type, self.numel = untyped, storage_type, numel


class _StoragePickler(pickle.Pickler):
    """Pickles like ``torch.save``: tensors become persistent storage references."""

    def __init__(self, file: io.BytesIO, storages: list[tuple[str, torch.UntypedStorage]]) -> None:
        super().__init__(file, protocol=2)
        self._storages = storages
        self._keys: dict[tuple[str, int], str] = {}

    def reducer_override(self, obj: Any) -> Any:
        """A plain dense tensor: the records ``Tensor.__reduce_ex__`` makes, at a third of its cost.

        ``torch.save`` spends ~30 us per tensor there (it wraps the storage in a
        ``TypedStorage`` and looks for subclass state); optimizer state has three tensors
        per parameter, and this runs on the training thread. Anything else (subclasses,
        quantized, sparse, nested, conj/neg bits, Python attributes, other devices, new
        dtypes) takes torch's own path; a ``Parameter`` keeps its own ``__reduce_ex__``,
        whose plain ``.data`` then comes here.
        """
        if type(obj) is not torch.Tensor:
            return NotImplemented
        storage_type = _STORAGE_TYPES.get(obj.dtype)
        if storage_type is None or obj.layout is not torch.strided or obj.is_quantized or obj.is_nested \
                or obj.device.type not in ("cpu", "cuda") or obj.__dict__ or torch._C._get_tensor_metadata(obj):
            return NotImplemented
        untyped = obj.untyped_storage()
        storage = _TensorStorage(untyped, storage_type, untyped.nbytes() // obj.element_size())
        return (torch._utils._rebuild_tensor_v2,
                (storage, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad, OrderedDict()))

    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        if type(obj) is _TensorStorage:
            untyped, storage_type, numel = obj.untyped, obj.storage_type, obj.numel
        elif isinstance(obj, torch.storage.TypedStorage):
            untyped = obj._untyped_storage
            storage_type = getattr(torch, obj._pickle_storage_type())
            numel = obj._size()
        elif isinstance(obj, torch.UntypedStorage):
            untyped, storage_type, numel = obj, torch.UntypedStorage, obj.nbytes()
        else:
            return None
        identity = (str(untyped.device), untyped.data_ptr()) if untyped.data_ptr() else ("id", id(untyped))
        key = self._keys.get(identity)
        if key is None:
            key = self._keys[identity] = str(len(self._keys))
            self._storages.append((key, untyped))
        return ("storage", storage_type, key, torch.serialization.location_tag(untyped), numel)


def _dos_time() -> tuple[int, int]:
    return 0, (0 << 9) | (1 << 5) | 1  # 1980-01-01 00:00, fixed for reproducible files


@dataclass
class _ZipEntry:
    name: bytes
    offset: int
    crc: int = 0
    size: int = 0
    streamed: bool = False


class _ZipWriter:
    """Minimal sequential writer of an uncompressed zip with 64-byte aligned records."""

    def __init__(self, sink: Sink, force_zip64: bool = False) -> None:
        self._sink, self._pos, self._force64 = sink, 0, force_zip64
        self.entries: list[_ZipEntry] = []

    def _emit(self, data: bytes | memoryview) -> None:
        self._sink.write(data)
        self._pos += len(memoryview(data).cast("B"))

    def _local_header(self, entry: _ZipEntry, size: int, crc: int, zip64: bool) -> None:
        flags = 0x08 if entry.streamed else 0
        extra = struct.pack("<HHQQ", 0x0001, 16, 0, 0) if zip64 else b""
        head_len = 30 + len(entry.name) + len(extra)
        alignment = DATA_ALIGNMENT if size >= _LARGE_RECORD else ALIGNMENT
        pad = -(self._pos + head_len + 4) % alignment
        extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        shown = _ZIP64_LIMIT if zip64 else (0 if entry.streamed else size)
        date_time = _dos_time()
        self._emit(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if zip64 else 20, flags, 0, date_time[0],
                               date_time[1], 0 if entry.streamed else crc, shown, shown, len(entry.name),
                               len(extra)) + entry.name + extra)

    def add_bytes(self, name: str, data: bytes) -> None:
        """Add a small record whose bytes are known."""
        entry = _ZipEntry(name.encode(), self._pos, crc32(data), len(data))
        self._local_header(entry, entry.size, entry.crc, zip64=False)
        self._emit(data)
        self.entries.append(entry)

    def add_stream(self, name: str, size: int, chunks: Iterator[memoryview]) -> None:
        """Add a record of known size from chunks, CRC computed on the way (data descriptor)."""
        entry = _ZipEntry(name.encode(), self._pos, 0, size, streamed=True)
        zip64 = self._force64 or size >= _ZIP64_LIMIT
        self._local_header(entry, size, 0, zip64)
        crc, seen = 0, 0
        for chunk in chunks:
            crc = crc32(chunk, crc)
            seen += len(chunk)
            self._emit(chunk)
        if seen != size:
            raise ValueError(f"record {name}: expected {size} bytes, got {seen}")
        entry.crc = crc
        fmt = "<IIQQ" if zip64 else "<IIII"
        self._emit(struct.pack(fmt, 0x08074B50, crc, size, size))
        self.entries.append(entry)

    def finish(self) -> None:
        """Write the central directory (zip64 records when needed)."""
        cd_start = self._pos
        for entry in self.entries:
            big_size = self._force64 or entry.size >= _ZIP64_LIMIT
            big_offset = self._force64 or entry.offset >= _ZIP64_LIMIT
            extra_values = ([entry.size, entry.size] if big_size else []) + ([entry.offset] if big_offset else [])
            extra = struct.pack(f"<HH{len(extra_values)}Q", 0x0001, 8 * len(extra_values), *extra_values) \
                if extra_values else b""
            size_field = _ZIP64_LIMIT if big_size else entry.size
            date_time = _dos_time()
            self._emit(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45 if extra else 20,
                                   0x08 if entry.streamed else 0, 0, date_time[0], date_time[1], entry.crc,
                                   size_field, size_field, len(entry.name), len(extra), 0, 0, 0, 0,
                                   _ZIP64_LIMIT if big_offset else entry.offset) + entry.name + extra)
        cd_size = self._pos - cd_start
        count = len(self.entries)
        if self._force64 or cd_start >= _ZIP64_LIMIT or count >= 0xFFFF:
            eocd64 = self._pos
            self._emit(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_start))
            self._emit(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
        self._emit(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                               min(cd_size, _ZIP64_LIMIT), min(cd_start, _ZIP64_LIMIT), 0))


@dataclass
class TorchFile(FilePlan):
    """An object in ``torch.save``'s zip format; storages are streamed from staged bytes."""

    pickle_bytes: bytes = b""
    storage_keys: list[str] = field(default_factory=list)
    force_zip64: bool = False

    def render(self, sink: Sink, segments: BlobSegments) -> None:
        zipw = _ZipWriter(sink, force_zip64=self.force_zip64)
        zipw.add_bytes("archive/data.pkl", self.pickle_bytes)
        zipw.add_bytes("archive/.format_version", b"1")
        zipw.add_bytes("archive/.storage_alignment", str(ALIGNMENT).encode())
        zipw.add_bytes("archive/byteorder", b"little")
        for index, key in enumerate(self.storage_keys):
            zipw.add_stream(f"archive/data/{key}", self.blobs[index].nbytes, segments(index))
        zipw.add_bytes("archive/version", b"3\n")
        zipw.add_bytes("archive/.data/serialization_id", uuid.uuid4().hex.encode().ljust(40, b"0"))
        zipw.finish()


@gc_paused()
def plan_torch_file(name: str, obj: Any, *, force_zip64: bool = False) -> TorchFile:
    """Plan a ``torch.load``-able file for ``obj``; non-tensor parts are pickled now (snapshotted)."""
    storages: list[tuple[str, torch.UntypedStorage]] = []
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _StoragePickler(buffer, storages).dump(obj)
    blobs = [Blob(_storage_bytes(storage), storage.nbytes()) for _, storage in storages]
    return TorchFile(name=name, blobs=blobs, pickle_bytes=buffer.getvalue(),
                     storage_keys=[key for key, _ in storages], force_zip64=force_zip64)


def is_flat_tensor_dict(value: Any) -> bool:
    """Whether ``value`` is a non-empty str -> dense tensor mapping without shared storage."""
    if not isinstance(value, Mapping) or not value:
        return False
    seen: set[tuple[str, int]] = set()
    for key, tensor in value.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            return False
        if tensor.layout != torch.strided or tensor.dtype not in SAFETENSORS_DTYPES or tensor.is_quantized:
            return False
        if tensor.numel():
            storage_key = _storage_key(tensor)
            if storage_key in seen:
                return False
            seen.add(storage_key)
    return True
