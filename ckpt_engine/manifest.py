"""The manifest written last into every checkpoint, and verification against it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import xxhash

from ckpt_engine.errors import CorruptCheckpointError
from ckpt_engine.storage import Storage

MANIFEST_NAME = "manifest.json"
FORMAT = "ckpt_engine/1"
CHECKPOINT_PREFIX = "checkpoint-"
TMP_PREFIX = ".tmp-checkpoint-"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_READ_BLOCK = 8 << 20


def new_hasher() -> Any:
    """The streaming hash used for per-file checksums (xxh3-64)."""
    return xxhash.xxh3_64()


def format_checksum(hasher: Any) -> str:
    """Checksum text as stored in the manifest."""
    return f"xxh3_64:{hasher.hexdigest()}"


def utc_now() -> str:
    """Current time as ISO 8601 with a UTC offset."""
    return datetime.now(timezone.utc).isoformat()


@dataclass
class FileEntry:
    """One file of a checkpoint as committed."""

    size: int
    checksum: str


@dataclass
class Manifest:
    """What a committed checkpoint contains; its presence means the checkpoint is complete."""

    step: int
    files: dict[str, FileEntry]
    layout: str = "state"
    created_at: str = field(default_factory=utc_now)
    format: str = FORMAT
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        """Serialized form."""
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Parse a manifest; raises CorruptCheckpointError on bad content."""
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise ValueError(f"unknown format {data.get('format')!r}")
            files = {name: FileEntry(**entry) for name, entry in data["files"].items()}
            return cls(step=int(data["step"]), files=files, layout=data.get("layout", "state"),
                       created_at=data.get("created_at", ""), metadata=data.get("metadata", {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(f"unreadable manifest: {exc}") from exc


@dataclass
class VerifyReport:
    """Result of checking one checkpoint directory against its manifest."""

    name: str
    step: int
    ok: bool
    problems: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


def checkpoint_dir(step: int) -> str:
    """Directory name of the checkpoint for ``step``."""
    return f"{CHECKPOINT_PREFIX}{step}"


def parse_step(name: str) -> int | None:
    """The step of a ``checkpoint-<step>`` name, else None."""
    match = _CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None


def list_checkpoint_steps(storage: Storage, root: str = "") -> list[int]:
    """Steps of every ``checkpoint-<step>`` directory under ``root``, newest first."""
    steps = (parse_step(name) for name in storage.list_dir(root))
    return sorted((step for step in steps if step is not None), reverse=True)


def read_manifest(storage: Storage, directory: str) -> Manifest:
    """The manifest of ``directory``; a missing one means an incomplete checkpoint."""
    key = f"{directory}/{MANIFEST_NAME}" if directory else MANIFEST_NAME
    try:
        raw = storage.read_bytes(key)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{directory}: no manifest (incomplete checkpoint)") from None
    return Manifest.from_json(raw)


def hash_file(storage: Storage, key: str) -> tuple[int, str]:
    """Size and checksum of a stored file, read in blocks."""
    hasher, size = new_hasher(), 0
    with storage.open_reader(key) as fh:
        while block := fh.read(_READ_BLOCK):
            hasher.update(block)
            size += len(block)
    return size, format_checksum(hasher)


def verify_checkpoint(storage: Storage, directory: str, *, deep: bool = True) -> VerifyReport:
    """Check presence, sizes and (``deep``) checksums of every file named in the manifest."""
    step = parse_step(directory.rsplit("/", 1)[-1])
    report = VerifyReport(name=directory, step=-1 if step is None else step, ok=False)
    try:
        manifest = read_manifest(storage, directory)
    except CorruptCheckpointError as exc:
        report.problems.append(str(exc))
        return report
    report.manifest = manifest
    if step is not None and manifest.step != step:
        report.problems.append(f"manifest step {manifest.step} does not match directory {directory}")
    for name, entry in manifest.files.items():
        key = f"{directory}/{name}"
        if not storage.exists(key):
            report.problems.append(f"{name}: missing")
            continue
        size = storage.size(key)
        if size != entry.size:
            report.problems.append(f"{name}: size {size} != {entry.size} in manifest (truncated?)")
            continue
        if deep:
            _, checksum = hash_file(storage, key)
            if checksum != entry.checksum:
                report.problems.append(f"{name}: checksum {checksum} != {entry.checksum} in manifest")
    report.ok = not report.problems
    return report
