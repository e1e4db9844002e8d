"""Universal views (ADR 0029) go with their checkpoint, and the results upload carries each file once.

A universal view ``<root>/universal/checkpoint-<step>/`` is DeepSpeed's ``ds_to_universal`` of one
committed checkpoint, made for a resume on another world size. The engine's retention deletes it
with the checkpoint (and sweeps one whose checkpoint went otherwise); it holds only the
conversion's own files, so uploading the outputs (``sat_tasks.io.staging upload``, the local
backend's ``upload_dir``) does not carry the checkpoint's weights a second time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ckpt_engine import CheckpointEngine
from ckpt_engine.integrations.elastic import universal_view


def committed_zero_checkpoint(root: Path, step: int) -> Path:
    """A committed-looking DeepSpeed checkpoint saved by 2 ranks (its manifest present: retention counts it)."""
    folder = root / f"checkpoint-{step}"
    tag = folder / f"global_step{step}"
    tag.mkdir(parents=True)
    (folder / "latest").write_text(tag.name)
    for rank in range(2):
        (tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"shard")
    for name in ("model.safetensors", "scheduler.pt", "trainer_state.json", "rng_state_0.pth", "manifest.json"):
        (folder / name).write_bytes(f"{step}:{name}".encode())
    return folder


def fake_convert(input_folder: str, output_folder: str) -> None:
    """Stands in for ds_to_universal (tested for real in test_elastic_resume.py, slow): the files it makes."""
    Path(output_folder, "zero", "w").mkdir(parents=True)
    Path(output_folder, "zero", "w", "fp32.pt").write_bytes(b"universal")
    Path(output_folder, "mp_rank_00_model_states.pt").write_bytes(b"model")


def test_retention_deletes_a_universal_view_with_its_checkpoint(tmp_path):
    root = tmp_path / "concurrent_checkpoint"
    old = committed_zero_checkpoint(root, 3)
    assert universal_view(str(old), str(root), 1, is_writer=True, convert=fake_convert)
    (root / "universal" / "checkpoint-1.tmp").mkdir()  # a build a crash left, of a checkpoint already gone
    engine = CheckpointEngine(root, keep_last=1)
    engine.save(4, {"model": {"w": torch.ones(8)}}, lazy=True)
    engine.wait()
    new = committed_zero_checkpoint(root, 5)  # kept by the next retention, with its view
    assert universal_view(str(new), str(root), 1, is_writer=True, convert=fake_convert)
    engine.save(6, {"model": {"w": torch.ones(8)}}, lazy=True)
    engine.close()
    assert not old.exists()
    assert sorted(p.name for p in (root / "universal").iterdir()) == []  # checkpoint-5 went too (keep_last=1)

    engine = CheckpointEngine(root, keep_last=2)
    kept = committed_zero_checkpoint(root, 7)
    assert universal_view(str(kept), str(root), 1, is_writer=True, convert=fake_convert)
    engine.save(8, {"model": {"w": torch.ones(8)}}, lazy=True)
    engine.close()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-7",
                                                                                           "checkpoint-8"]
    assert sorted(p.name for p in (root / "universal").iterdir()) == ["checkpoint-7"]  # its checkpoint is kept


class RecordingHook:
    """The one S3Hook call ``upload_dir`` makes, recorded: which local file went to which key."""

    def __init__(self) -> None:
        self.uploads: dict[str, Path] = {}

    def load_file(self, filename: Path, key: str, bucket_name: str, replace: bool) -> None:
        self.uploads[key] = Path(filename)


def test_the_results_upload_carries_each_file_once_with_a_universal_view(tmp_path):
    """``python -m sat_tasks.io.staging upload`` (the upload pod) over an output dir that holds a universal view."""
    from sat_tasks.io import staging

    output = tmp_path / "output"
    root = output / "concurrent_checkpoint"
    checkpoint = committed_zero_checkpoint(root, 3)
    view = Path(universal_view(str(checkpoint), str(root), 1, is_writer=True, convert=fake_convert))
    hook = RecordingHook()
    staging._upload(argparse.Namespace(source=str(output), dest="s3://results/job/run/output/"), hook)

    real = [path.resolve() for path in hook.uploads.values()]
    assert len(real) == len(set(real)), "a file was uploaded under two keys"
    assert "job/run/output/concurrent_checkpoint/checkpoint-3/model.safetensors" in hook.uploads
    view_keys = {key.split("universal/checkpoint-3/", 1)[1] for key in hook.uploads if "/universal/" in key}
    assert view_keys == {"manifest.json", "latest_universal", "global_step3_universal/zero/w/fp32.pt",
                         "global_step3_universal/mp_rank_00_model_states.pt"}  # the conversion's own files
    assert all(path.resolve().is_relative_to(view) for key, path in hook.uploads.items() if "/universal/" in key)
