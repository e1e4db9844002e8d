"""Checkpoint format versions (ADR 0003, "Format versions"; ``ckpt_engine.contract``).

The engine reads the manifest version it writes and every older one the upgrade chain
(``MANIFEST_UPGRADES``) leads from; a newer version is refused (upgrade the engine), and
so is anything without SAT's ``ckpt_engine/<n>`` marker. ``fixtures/manifest-v<N>/`` is a
small checkpoint a real engine of version N wrote (``fixtures/make_manifest_fixtures.py``).
Only version 1 has been written so far, so the bumps here are simulated: the module's
version and chain are patched, and the checkpoint of the previous format (the v1 fixture,
or a v0 made from it) is loaded through the engine's real read path.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

from ckpt_engine import contract
from ckpt_engine.contract import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    Manifest,
    check_manifest_format,
)
from ckpt_engine.engine import CheckpointEngine
from ckpt_engine.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnreadableCheckpointError,
)
from ckpt_engine.manifest import verify_checkpoint
from ckpt_engine.storage.file import FileStorage

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("make_manifest_fixtures", FIXTURES / "make_manifest_fixtures.py")
assert _spec is not None and _spec.loader is not None
make_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_fixtures)
STEP = make_fixtures.STEP


def checkpoint_root(tmp_path: Path, version: int) -> Path:
    """A copy of the checkpoint root engine ``version`` wrote (the engine writes progress.json into it)."""
    root = tmp_path / f"root-v{version}"
    shutil.copytree(FIXTURES / f"manifest-v{version}", root)
    return root


def manifest_path(root: Path) -> Path:
    return root / f"checkpoint-{STEP}" / "manifest.json"


def load(root: Path) -> dict[str, Any]:
    """The state in ``root`` as the engine resumes it (manifest read, every checksum checked)."""
    engine = CheckpointEngine(str(root), host_cache_size=0.0625, pin_host_cache=False, keep_last=0)
    try:
        return engine.load()
    finally:
        engine.close()


def assert_same(found: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(found, torch.Tensor) and found.dtype == expected.dtype and torch.equal(found, expected)
    elif isinstance(expected, dict):
        assert isinstance(found, dict) and found.keys() == expected.keys()
        for key, value in expected.items():
            assert_same(found[key], value)
    elif isinstance(expected, list | tuple):
        assert type(found) is type(expected) and len(found) == len(expected)
        for a, b in zip(found, expected):
            assert_same(a, b)
    else:
        assert found == expected


def test_every_version_written_so_far_has_a_fixture_checkpoint():
    """Bumping MANIFEST_VERSION without a fixture of each version (the old one first) fails here."""
    assert sorted(path.name for path in FIXTURES.glob("manifest-v*")) == \
        sorted(f"manifest-v{version}" for version in range(1, MANIFEST_VERSION + 1))
    for version in range(1, MANIFEST_VERSION + 1):
        raw = json.loads(manifest_path(FIXTURES / f"manifest-v{version}").read_text())
        assert raw["format"] == f"ckpt_engine/{version}"


@pytest.mark.parametrize("version", range(1, MANIFEST_VERSION + 1))
def test_a_checkpoint_each_version_wrote_loads(tmp_path: Path, version: int):
    root = checkpoint_root(tmp_path, version)
    report = verify_checkpoint(FileStorage(str(root)), f"checkpoint-{STEP}")
    assert report.ok, report.problems
    assert report.manifest is not None and report.manifest.format == MANIFEST_FORMAT
    assert sorted(report.manifest.files) == ["model.safetensors", "optimizer.pt"]
    assert_same(load(root), make_fixtures.fixture_state())


def test_a_checkpoint_of_the_previous_format_loads_through_the_chain(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    """Simulated: this engine is at version 3; the v1 fixture is upgraded 1 -> 2 -> 3, in that order."""
    seen: list[str] = []

    def one_to_two(data: dict[str, Any]) -> dict[str, Any]:
        assert data["format"] == "ckpt_engine/1"
        seen.append("1->2")
        return {**data, "metadata": {**data["metadata"], "upgraded": ["1->2"]}}

    def two_to_three(data: dict[str, Any]) -> dict[str, Any]:
        assert data["format"] == "ckpt_engine/2" and data["metadata"]["upgraded"] == ["1->2"]
        seen.append("2->3")
        return {**data, "metadata": {**data["metadata"], "upgraded": ["1->2", "2->3"]}}

    monkeypatch.setattr(contract, "MANIFEST_VERSION", 3)
    monkeypatch.setattr(contract, "MANIFEST_UPGRADES", {1: one_to_two, 2: two_to_three})
    root = checkpoint_root(tmp_path, 1)
    raw = manifest_path(root).read_bytes()
    manifest = Manifest.from_json(raw)
    assert manifest.format == "ckpt_engine/3" and manifest.metadata["upgraded"] == ["1->2", "2->3"]
    assert seen == ["1->2", "2->3"]
    assert_same(load(root), make_fixtures.fixture_state())
    assert manifest_path(root).read_bytes() == raw  # reading upgrades in memory; the file stays as written


def whole_file_checksum(path: Path) -> str:
    """The engine's first checksum, one xxh3-64 over the whole file (still verified today)."""
    return f"xxh3_64:{xxhash.xxh3_64(path.read_bytes()).hexdigest()}"


def to_version_zero(root: Path) -> None:
    """Rewrite the fixture's manifest in a simulated older shape: ``files`` a list, whole-file checksums."""
    path = manifest_path(root)
    data = json.loads(path.read_text())
    data["format"] = "ckpt_engine/0"
    data["files"] = [{"name": name, "size": entry["size"], "checksum": whole_file_checksum(path.parent / name)}
                     for name, entry in sorted(data["files"].items())]
    path.write_text(json.dumps(data))


def zero_to_one(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "files": {entry["name"]: {"size": entry["size"], "checksum": entry["checksum"]}
                              for entry in data["files"]}}


def test_an_older_manifest_shape_is_upgraded_to_the_current_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Simulated version 0 (files listed, not keyed by name) read by this engine through MANIFEST_UPGRADES[0]."""
    root = checkpoint_root(tmp_path, 1)
    to_version_zero(root)
    with pytest.raises(UnreadableCheckpointError, match=r"'ckpt_engine/0' is older than this engine reads"):
        Manifest.from_json(manifest_path(root).read_bytes())  # no chain from 0: refused, saying so
    monkeypatch.setattr(contract, "MANIFEST_UPGRADES", {0: zero_to_one})
    assert contract.readable_manifest_versions() == range(MANIFEST_VERSION + 1)
    manifest = Manifest.from_json(manifest_path(root).read_bytes())
    assert manifest.format == MANIFEST_FORMAT and manifest.step == STEP
    assert {name: entry.checksum.split(":")[0] for name, entry in manifest.files.items()} == \
        {"model.safetensors": "xxh3_64", "optimizer.pt": "xxh3_64"}
    report = verify_checkpoint(FileStorage(str(root)), f"checkpoint-{STEP}")
    assert report.ok, report.problems
    assert_same(load(root), make_fixtures.fixture_state())


def test_an_upgrade_that_cannot_read_its_input_is_a_corrupt_manifest(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(contract, "MANIFEST_UPGRADES", {0: zero_to_one})
    with pytest.raises(CorruptCheckpointError, match="ckpt_engine/0, upgrading it to ckpt_engine/1"):
        Manifest.from_dict({"format": "ckpt_engine/0", "step": 1, "files": [{"size": 1}]})


def test_a_newer_version_is_refused_naming_both_versions(tmp_path: Path):
    newer = f"ckpt_engine/{MANIFEST_VERSION + 1}"
    with pytest.raises(UnreadableCheckpointError) as refused:
        check_manifest_format("manifest.json", newer)
    message = str(refused.value)
    assert "newer SAT" in message and repr(newer) in message and repr(MANIFEST_FORMAT) in message
    assert "upgrade the engine" in message
    root = checkpoint_root(tmp_path, MANIFEST_VERSION)
    data = json.loads(manifest_path(root).read_text())
    manifest_path(root).write_text(json.dumps({**data, "format": newer}))
    with pytest.raises(CheckpointNotFoundError, match="written by a newer SAT"):
        load(root)  # a resume skips it, and says why


@pytest.mark.parametrize("found", [None, "", 1, "ckpt_engine", "ckpt_engine/", "ckpt_engine/v2", "ckpt_engine/-1",
                                   "datastates/1", "torch_dcp/1", ["ckpt_engine/1"]])
def test_a_manifest_without_sats_marker_is_not_sats(found: Any):
    with pytest.raises(UnreadableCheckpointError, match="not written by SAT's engine"):
        Manifest.from_dict({"format": found, "step": 1, "files": {}})


def test_a_foreign_manifest_json_is_not_loaded(tmp_path: Path):
    root = checkpoint_root(tmp_path, MANIFEST_VERSION)
    manifest_path(root).write_text(json.dumps({"step": STEP, "files": {}, "writer": "another engine"}))
    report = verify_checkpoint(FileStorage(str(root)), f"checkpoint-{STEP}")
    assert not report.ok and "not written by SAT's engine" in report.problems[0]
    with pytest.raises(CheckpointNotFoundError, match="not written by SAT's engine"):
        load(root)
