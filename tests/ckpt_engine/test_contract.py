"""ckpt_engine.contract: the records round-trip, tolerate what they do not know, and the module stays stdlib-only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckpt_engine.contract import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    ProgressRecord,
    attempt_record_name,
    checkpoint_dir,
    parse_step,
    series_path,
    verdict_name,
)
from ckpt_engine.errors import CorruptCheckpointError, UnreadableCheckpointError


def test_progress_round_trips_and_ignores_what_a_newer_engine_adds():
    record = ProgressRecord(step=12, last_committed_step=10, committed_steps=[10, 5], last_mirrored_step=5,
                            updated_at="2026-12-02T04:00:00+00:00", timings={"stage_s": 0.5},
                            resumed_from_step=5, attempt=2)
    assert ProgressRecord.from_json(record.to_json()) == record
    newer = {**json.loads(record.to_json()), "throughput": 3.5}
    assert ProgressRecord.from_dict(newer) == record


@pytest.mark.parametrize(("data", "expected"), [
    pytest.param({"step": 7, "attempt": 1}, ProgressRecord(step=7, attempt=1, updated_at=""), id="only-some-fields"),
    pytest.param({}, ProgressRecord(updated_at="", attempt=None), id="empty-object"),
    pytest.param(None, ProgressRecord(updated_at="", attempt=None), id="nothing-written-yet"),
    pytest.param(["not", "an", "object"], ProgressRecord(updated_at="", attempt=None), id="not-an-object"),
])
def test_progress_from_a_partial_or_odd_file_is_an_empty_record_not_an_error(data, expected):
    assert ProgressRecord.from_dict(data) == expected


def test_progress_from_a_half_written_file_reads_as_empty(monkeypatch):
    monkeypatch.setenv("SAT_ATTEMPT", "3")  # a record the engine makes is stamped; one read from a file is not
    assert ProgressRecord().attempt == 3
    assert ProgressRecord.from_json(b'{"step": 4, "last_co') == ProgressRecord(updated_at="", attempt=None)


def test_the_manifest_round_trips_and_ignores_unknown_fields():
    manifest = Manifest(step=30, files={"model.safetensors": FileEntry(size=10, checksum="xxh3_64/16MiB:ab"),
                                        "optimizer.pt": FileEntry(size=5, checksum="xxh3_64/16MiB:cd")},
                        layout="hf", created_at="2026-12-02T04:00:00+00:00", metadata={"world_size": 1})
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.total_bytes == 15
    data = json.loads(manifest.to_json())
    data["signed_by"] = "a newer engine"
    data["files"]["optimizer.pt"]["compression"] = "none"
    assert Manifest.from_dict(data) == manifest


@pytest.mark.parametrize(("raw", "error", "match"), [
    pytest.param(b'{"format": "ckpt_engine/1", "files": {}}', CorruptCheckpointError, "step", id="no-step"),
    pytest.param(b'{"format": "ckpt_engine/1", "step": 1}', CorruptCheckpointError, "files", id="no-files"),
    pytest.param(b'{"format": "ckpt_engine/1", "step": 1, "files": {"a": {"size": 1}}}', CorruptCheckpointError,
                 "checksum", id="file-without-checksum"),
    pytest.param(b'{"format": "ckpt_engine/1", "step": 1, "fil', CorruptCheckpointError, "unreadable manifest",
                 id="truncated"),
    pytest.param(b'{"format": "ckpt_engine/9", "step": 1, "files": {}}', UnreadableCheckpointError, "newer SAT",
                 id="newer-format"),
    pytest.param(b'{"step": 1, "files": {}}', UnreadableCheckpointError, "unknown checkpoint format",
                 id="no-format"),
])
def test_a_manifest_without_what_it_must_have_is_no_manifest(raw, error, match):
    with pytest.raises(error, match=match):
        Manifest.from_json(raw)


def test_names_are_what_the_readers_expect():
    assert (checkpoint_dir(40), parse_step("checkpoint-40"), parse_step(".tmp-checkpoint-40-x")) == \
        ("checkpoint-40", 40, None)
    assert (attempt_record_name(2), verdict_name(2)) == ("attempts/attempt-2.json", "attempts/attempt-2.verdict.json")
    assert f"{checkpoint_dir(5)}/{MANIFEST_NAME}" == "checkpoint-5/manifest.json"
    assert series_path(None, "n1", "system", node_rank=1) == "attempt-0/n1-r1/system.jsonl"


def test_the_contract_imports_only_the_standard_library():
    """The job model and the core import it (pyproject.toml's ignore_imports): it must stay that light."""
    code = ("import sys; import ckpt_engine.contract; "
            "print(sorted({m.split('.')[0] for m in sys.modules if not m.startswith('_')} - set(sys.stdlib_module_names)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert json.loads(out.stdout.replace("'", '"')) == ["ckpt_engine"]
