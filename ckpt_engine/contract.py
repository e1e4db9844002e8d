"""The contract between SAT's orchestrator and the in-container runtime: names, environment, records.

One module both sides import (ADR 0018): what the training container finds in its
environment, where it writes, and the records it leaves for the orchestrator to read.
Changing the on-disk format is a change here plus its readers (the type checker finds
them). It imports nothing outside the standard library but ``ckpt_engine.errors``, so
``sat_tasks.core`` and the spec may import it too (pyproject.toml says so).

A checkpoint's manifest says its format version (``ckpt_engine/<n>``). A change to that
format raises MANIFEST_VERSION and adds the upgrade from the version before, so the
reader still loads every older checkpoint; a newer one is refused, and so is a manifest
without SAT's marker (below, "checkpoint format versions"; ADR 0003).

A checkpoint root (``<output_dir>/concurrent_checkpoint/``; a mirror keeps the same names
under its URL)::

    checkpoint-<step>/                    checkpoint_dir(step): one committed checkpoint
        <files>..., manifest.json         MANIFEST_NAME (Manifest), written last: no manifest = no checkpoint
    .tmp-checkpoint-<step>-<id>/          TMP_PREFIX: a checkpoint being written
    .trash-<name>-<id>/                   TRASH_PREFIX: one being deleted
    progress.json                         PROGRESS_NAME (ProgressRecord): what the orchestrator reads

A run's results in Object Storage (``<results>/<job>/<run_id>/``; ``sat_tasks.io.run_layout``
turns these names into URIs)::

    status.json                           STATUS_NAME: the status history
    attempts/attempt-<k>.json             attempt_record_name(k): the attempt record
    attempts/attempt-<k>.verdict.json     verdict_name(k)
    attempts/attempt-<k>.log              attempt_log_name(k): Kubernetes, the attempt's section of job.log
    checkpoints/                          MIRROR_DIR: the engine's mirror (a checkpoint root)
    metrics/attempt-<k>/<node>/<series>.jsonl   METRICS_DIR + series_path(): per-job metrics
    output/                               OUTPUT_DIR: the training outputs (their checkpoint root included)
    task-failures/<task>.json             task_failure_name(task)
    stop.json, tags.json                  STOP_NAME, TAGS_NAME: what people did in the Training Jobs view
    job.log, report.json, report.html     JOB_LOG_NAME, REPORT_NAME, REPORT_HTML_NAME
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

from ckpt_engine.errors import CorruptCheckpointError, UnreadableCheckpointError

# ---- a checkpoint root ---------------------------------------------------------------------------
CONCURRENT_DIR = "concurrent_checkpoint"
MANIFEST_NAME = "manifest.json"
PROGRESS_NAME = "progress.json"
CHECKPOINT_PREFIX = "checkpoint-"
TMP_PREFIX = ".tmp-checkpoint-"
TRASH_PREFIX = ".trash-"
# The Hugging Face Trainer's own state file, in every checkpoint and in the outputs (its log_history).
TRAINER_STATE_NAME = "trainer_state.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(step: int) -> str:
    """Directory name of the checkpoint for ``step``."""
    return f"{CHECKPOINT_PREFIX}{step}"


def parse_step(name: str) -> int | None:
    """The step of a ``checkpoint-<step>`` name, else None."""
    match = _CHECKPOINT_RE.match(name)
    return int(match.group(1)) if match else None


# ---- a run's results prefix ----------------------------------------------------------------------
STATUS_NAME = "status.json"
ATTEMPTS_DIR = "attempts/"
MIRROR_DIR = "checkpoints/"
METRICS_DIR = "metrics/"
OUTPUT_DIR = "output/"
TASK_FAILURES_DIR = "task-failures/"
STOP_NAME = "stop.json"
TAGS_NAME = "tags.json"
JOB_LOG_NAME = "job.log"
REPORT_NAME = "report.json"
REPORT_HTML_NAME = "report.html"


def attempt_record_name(attempt: int) -> str:
    """``attempts/attempt-<k>.json``: the attempt record."""
    return f"{ATTEMPTS_DIR}attempt-{attempt}.json"


def verdict_name(attempt: int) -> str:
    """``attempts/attempt-<k>.verdict.json``: the attempt's verdict."""
    return f"{ATTEMPTS_DIR}attempt-{attempt}.verdict.json"


def attempt_log_name(attempt: int) -> str:
    """``attempts/attempt-<k>.log``: the attempt's section of job.log (Kubernetes)."""
    return f"{ATTEMPTS_DIR}attempt-{attempt}.log"


def task_failure_name(task_id: str) -> str:
    """``task-failures/<task>.json``: why a task failed, as it noted it."""
    return f"{TASK_FAILURES_DIR}{task_id}.json"


# The per-job metrics series, each ``attempt-<k>/<node>[-r<node rank>]/<series>.jsonl`` under METRICS_DIR.
SERIES = ("training", "checkpoint", "system", "job")
HOST_DEVICE = "host"  # a record's ``device`` when it is about the node, not one of its GPUs (``gpu<i>``)


def series_path(attempt: int | None, node: str, series: str, node_rank: int | None = None) -> str:
    """Relative path of one series file: ``attempt-<k>/<node>[-r<node rank>]/<series>.jsonl``."""
    where = node + (f"-r{node_rank}" if node_rank else "")
    return f"attempt-{attempt if attempt is not None else 0}/{where}/{series}.jsonl"


# ---- the environment of a training process -------------------------------------------------------
# What SAT sets (sat_tasks.core.runtime_env.training_environment, the backends' launchers).
VENDOR_ENV = "CHECKPOINT_VENDOR"  # the vendored engine's directory (also PYTHONPATH)
LAST_STEP_ENV = "CKPT_LAST_STEP"  # resume from this step; -1: the newest complete checkpoint
GRACE_ENV = "CKPT_GRACE_SECONDS"  # seconds for the final checkpoint after SIGTERM
MIRROR_URL_ENV = "CKPT_MIRROR_URL"  # where committed checkpoints are mirrored (MIRROR_DIR of the run)
S3_ENDPOINT_ENV = "CKPT_S3_ENDPOINT_URL"
# "0" (a job's env): state files load with weights_only=False, any pickle runs (ckpt_engine.sniff; ADR 0020)
WEIGHTS_ONLY_ENV = "CKPT_WEIGHTS_ONLY"
JOB_NAME_ENV = "SAT_JOB_NAME"
RUN_ID_ENV = "SAT_RUN_ID"
ATTEMPT_ENV = "SAT_ATTEMPT"  # the attempt number; progress.json carries it
NODE_ENV = "SAT_NODE"
NODES_ENV = "SAT_NODES"
POD_NAME_ENV = "SAT_POD_NAME"
FRAMEWORK_ENV = "SAT_FRAMEWORK"
DATA_DIR_ENV = "SAT_DATA_DIR"
OUTPUT_DIR_ENV = "SAT_OUTPUT_DIR"  # the checkpoint root is CONCURRENT_DIR under it
CODE_DIR_ENV = "SAT_CODE_DIR"
FAILOVERS_USED_ENV = "SAT_FAILOVERS_USED"
PROGRESS_FILE_ENV = "SAT_PROGRESS_FILE"  # the engine's progress.json, as the launcher and the sidecar watch it
METRICS_DIR_ENV = "SAT_METRICS_DIR"  # unset: no per-job metrics
METRICS_URL_ENV = "SAT_METRICS_URL"  # METRICS_DIR of the run
METRICS_INTERVAL_ENV = "SAT_METRICS_INTERVAL_SECONDS"
# Set by the launcher when the node's sidecar sampler (`python -m ckpt_engine.metrics`) runs
# beside the command: the sidecar writes the system and job series, the training process
# only training and checkpoint.
METRICS_SIDECAR_ENV = "SAT_METRICS_SIDECAR"
OTLP_ENV = "SAT_OTLP_ENDPOINT"
# SAT's test harness (`sat test`): steps and checkpoint interval for the script, and a rehearsal's injection.
MAX_STEPS_ENV = "SAT_MAX_STEPS"
SAVE_STEPS_ENV = "SAT_SAVE_STEPS"
REHEARSE_AT_STEP_ENV = "SAT_REHEARSE_AT_STEP"
REHEARSE_ACTION_ENV = "SAT_REHEARSE_ACTION"
REHEARSE_ATTEMPT_ENV = "SAT_REHEARSE_ATTEMPT"
REHEARSE_HOLD_SECONDS_ENV = "SAT_REHEARSE_HOLD_SECONDS"


def env_int(name: str) -> int | None:
    """An integer environment variable (negative allowed), or None when unset or not an integer."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else None


def attempt_from_env() -> int | None:
    """The attempt number SAT gave this process (``SAT_ATTEMPT``), or None outside SAT."""
    raw = os.environ.get(ATTEMPT_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


# ---- records -------------------------------------------------------------------------------------
def utc_now() -> str:
    """Current time as ISO 8601 with a UTC offset."""
    return datetime.now(timezone.utc).isoformat()


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``data`` that ``cls`` declares (a newer writer's extra fields are left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class ProgressRecord:
    """Contents of ``progress.json``, written by the engine (rank 0), read by the orchestrator and the UI.

    ``step`` is the training step (None until training runs); ``resumed_from_step`` the
    checkpoint this process resumed from; ``attempt`` the ``SAT_ATTEMPT`` it ran as (the
    file outlives attempts: a reader tells this attempt's step from an earlier one's).
    Committed checkpoints (``last_committed_step``, ``committed_steps``) stay valid across attempts.
    """

    step: int | None = None
    last_committed_step: int | None = None
    committed_steps: list[int] = field(default_factory=list)
    in_flight_step: int | None = None
    last_mirrored_step: int | None = None
    updated_at: str = field(default_factory=utc_now)
    last_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    resumed_from_step: int | None = None
    attempt: int | None = field(default_factory=attempt_from_env)

    def to_json(self) -> bytes:
        """The file's bytes."""
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_dict(cls, data: Any) -> ProgressRecord:
        """The record in ``data`` (a parsed progress.json); unknown fields are ignored, missing ones empty.

        Not a dict (nothing written yet, a damaged file): an empty record with no attempt.
        """
        if not isinstance(data, dict):
            return cls(updated_at="", attempt=None)
        return cls(**{"updated_at": "", "attempt": None, **_known(cls, data)})

    @classmethod
    def from_json(cls, raw: bytes | str) -> ProgressRecord:
        """Parse progress.json's bytes (an unreadable file reads as an empty record)."""
        try:
            return cls.from_dict(json.loads(raw))
        except ValueError:
            return cls.from_dict(None)


# ---- checkpoint format versions (ADR 0003, "Format versions") ----------------------------------
# A manifest's ``format`` is ``ckpt_engine/<version>``. This engine writes MANIFEST_VERSION and
# reads every version from which MANIFEST_UPGRADES leads to it: the reader upgrades an older
# manifest one version at a time (MANIFEST_UPGRADES[n] takes a parsed version-n manifest to the
# same manifest in version n + 1) before it parses the current shape. A newer version is refused
# (upgrade the engine), and so is anything without the ``ckpt_engine/`` marker (not SAT's).
# Both are read when a manifest is, so a test may change them. To bump the version: first write
# tests/ckpt_engine/fixtures/manifest-v<old>/ with make_manifest_fixtures.py, then raise
# MANIFEST_VERSION and add MANIFEST_UPGRADES[old]; test_manifest_versions.py loads every fixture.
ManifestUpgrade = Callable[[dict[str, Any]], dict[str, Any]]
MANIFEST_FAMILY = "ckpt_engine"
MANIFEST_VERSION = 1
MANIFEST_FORMAT = f"{MANIFEST_FAMILY}/{MANIFEST_VERSION}"  # what this engine writes
MANIFEST_UPGRADES: dict[int, ManifestUpgrade] = {}  # none yet: version 1 is the only one written so far


def manifest_format(version: int) -> str:
    """The ``format`` value of manifest version ``version``."""
    return f"{MANIFEST_FAMILY}/{version}"


def readable_manifest_versions() -> range:
    """The versions this engine reads: the current one and those the upgrade chain leads from."""
    oldest = MANIFEST_VERSION
    while oldest - 1 in MANIFEST_UPGRADES:
        oldest -= 1
    return range(oldest, MANIFEST_VERSION + 1)


def check_manifest_format(name: str, found: Any) -> int:
    """The version of a manifest's ``format`` when this engine reads it, else UnreadableCheckpointError.

    Refused, each with what to do: a newer version (upgrade the engine), a version older
    than the upgrade chain reaches, and anything without SAT's ``ckpt_engine/<n>`` marker.
    """
    readable = readable_manifest_versions()
    reads = (f"{manifest_format(readable[0])!r} to {manifest_format(readable[-1])!r}" if len(readable) > 1
             else repr(manifest_format(readable[-1])))
    family, _, version = found.partition("/") if isinstance(found, str) else ("", "", "")
    if family != MANIFEST_FAMILY or not version.isdigit():
        raise UnreadableCheckpointError(
            f"{name}: unknown checkpoint format {found!r} (this engine reads {reads}); it was not written by "
            "SAT's engine. What to do: check the path, or resume from a checkpoint SAT wrote.")
    if int(version) > readable[-1]:
        raise UnreadableCheckpointError(
            f"{name}: written by a newer SAT (checkpoint format {found!r}; this engine reads {reads}). "
            "What to do: upgrade the engine: run the job with the newer SAT's engine (refresh CHECKPOINT_VENDOR "
            "with `sat vendor`), or resume from a checkpoint this version wrote.")
    if int(version) < readable[0]:
        raise UnreadableCheckpointError(
            f"{name}: checkpoint format {found!r} is older than this engine reads ({reads}). What to do: load it "
            "with the SAT release that wrote it, or resume from a newer checkpoint.")
    return int(version)


def upgrade_manifest(data: dict[str, Any], name: str = MANIFEST_NAME) -> dict[str, Any]:
    """A parsed manifest in the current version, upgraded one version at a time if older (``data`` is kept).

    Raises UnreadableCheckpointError as :func:`check_manifest_format` does.
    """
    version = check_manifest_format(name, data.get("format"))
    while version < MANIFEST_VERSION:
        try:
            data = {**MANIFEST_UPGRADES[version](dict(data)), "format": manifest_format(version + 1)}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable manifest ({manifest_format(version)}, upgrading it to "
                                         f"{manifest_format(version + 1)}): {exc!r}") from exc
        version += 1
    return data


def check_file_name(name: str) -> str:
    """``name`` when it is a relative path inside a checkpoint directory; else CorruptCheckpointError.

    The rule: ``/``-separated non-empty parts, none of them ``.`` or ``..``, not absolute, no
    backslash or NUL (a manifest names files *inside* its checkpoint, nothing else).
    """
    parts = name.split("/")
    if (not name or "\\" in name or "\x00" in name or name.startswith("/")
            or any(part in ("", ".", "..") for part in parts)):
        raise CorruptCheckpointError(
            f"manifest names the file {name!r}: a file name must be a relative path inside the checkpoint "
            "(no '..', '.', empty parts, leading '/', backslash or NUL)")
    return name


@dataclass
class FileEntry:
    """One file of a checkpoint as committed."""

    size: int
    checksum: str


@dataclass
class Manifest:
    """What a committed checkpoint contains (``manifest.json``); its presence means the checkpoint is complete."""

    step: int
    files: dict[str, FileEntry]
    layout: str = "state"
    created_at: str = field(default_factory=utc_now)
    format: str = MANIFEST_FORMAT
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Bytes of every file the manifest names."""
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> bytes:
        """Serialized form."""
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """The manifest in ``data`` (a parsed manifest.json); fields it does not know are ignored.

        An older format version is upgraded first (:func:`upgrade_manifest`); the result
        says MANIFEST_FORMAT. Raises UnreadableCheckpointError for a format this engine
        does not read (newer, too old, not SAT's), CorruptCheckpointError when
        ``step`` or ``files`` is missing or malformed.
        """
        if not isinstance(data, dict):
            raise CorruptCheckpointError(f"unreadable manifest: not an object ({type(data).__name__})")
        data = upgrade_manifest(data)  # an older version: upgraded to this one's shape (or refused)
        try:
            files = {check_file_name(str(name)): FileEntry(size=int(entry["size"]), checksum=str(entry["checksum"]))
                     for name, entry in data["files"].items()}
            return cls(step=int(data["step"]), files=files, layout=data.get("layout", "state"),
                       created_at=data.get("created_at", ""), format=data["format"],
                       metadata=data.get("metadata") or {})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable manifest: {exc!r}") from exc

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        """Parse a manifest's bytes; raises CorruptCheckpointError on bad content."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CorruptCheckpointError(f"unreadable manifest: {exc}") from exc
        return cls.from_dict(data)
