"""A checkpoint manifest names files inside its checkpoint only; a mirrored one that does not is skipped on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_engine import CheckpointEngine
from ckpt_engine.contract import Manifest
from ckpt_engine.errors import CorruptCheckpointError
from ckpt_engine.mirror import restore_from_mirror
from ckpt_engine.storage.file import FileStorage


def manifest_with(name: str) -> dict[str, object]:
    return {"format": Manifest(step=1, files={}).format, "step": 1,
            "files": {name: {"size": 1, "checksum": "sha256:00"}}}


@pytest.mark.parametrize("name", [
    pytest.param("../x", id="parent"),
    pytest.param("a/../../x", id="parent-inside"),
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("..\\x", id="backslash"),
    pytest.param("a//b", id="empty-part"),
    pytest.param("./a", id="dot"),
    pytest.param("", id="empty"),
    pytest.param("a\x00b", id="nul"),
])
def test_a_manifest_naming_a_file_outside_its_checkpoint_is_corrupt(name: str) -> None:
    with pytest.raises(CorruptCheckpointError, match="relative path inside the checkpoint"):
        Manifest.from_dict(manifest_with(name))


@pytest.mark.parametrize("name", [pytest.param("model.safetensors", id="flat"),
                                  pytest.param("global_step1/mp_rank_00.pt", id="subdirectory")])
def test_relative_names_inside_the_checkpoint_are_kept(name: str) -> None:
    assert list(Manifest.from_dict(manifest_with(name)).files) == [name]


def test_a_mirrored_manifest_with_dotdot_is_skipped_for_the_previous_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    mirror = FileStorage(tmp_path / "mirror" / "checkpoints")
    engine = CheckpointEngine(mirror)
    for step in (1, 2):
        engine.save(step, {"w": torch.full((4,), float(step))})
        engine.wait()
    engine.close()
    (tmp_path / "mirror" / "secret").write_bytes(b"not a checkpoint file")
    manifest = json.loads(mirror.read_bytes("checkpoint-2/manifest.json"))
    _name, entry = next(iter(manifest["files"].items()))
    manifest["files"] = {"../../secret": entry}  # points outside the mirror root
    mirror.write_atomic("checkpoint-2/manifest.json", json.dumps(manifest).encode())
    local = FileStorage(tmp_path / "node")
    assert restore_from_mirror(local, mirror) == 1
    assert local.list_dir("") == ["checkpoint-1"]
    assert torch.equal(CheckpointEngine(local).load()["w"], torch.full((4,), 1.0))


def test_a_local_manifest_with_dotdot_is_skipped_when_resuming_the_newest(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    root = FileStorage(tmp_path / "checkpoints")
    engine = CheckpointEngine(root)
    for step in (1, 2):
        engine.save(step, {"w": torch.full((4,), float(step))})
        engine.wait()
    engine.close()
    manifest = json.loads(root.read_bytes("checkpoint-2/manifest.json"))
    manifest["files"] = {f"../checkpoint-1/{name}": entry for name, entry in manifest["files"].items()}
    root.write_atomic("checkpoint-2/manifest.json", json.dumps(manifest).encode())
    assert torch.equal(CheckpointEngine(root).load()["w"], torch.full((4,), 1.0))
    assert "skipping corrupt checkpoint-2" in caplog.text  # not step 2 served from checkpoint-1's files
