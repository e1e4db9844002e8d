"""Checkpoint mirror to Object Storage: manifest-last uploads, retention, verified restore, the Trainer resume path.

Runs against moto's S3 server on 127.0.0.1 (the session's ``s3_server``); the engine
reaches it the way a training container does, through ``CKPT_S3_ENDPOINT_URL`` and the
standard AWS credential variables.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from ckpt_engine import CheckpointEngine, ConfigError, DecoratedCheckpointing, MemoryStorage
from ckpt_engine.mirror import CheckpointMirror, restore_from_mirror
from ckpt_engine.storage.s3 import S3Storage
from sat_tasks.io.local_s3 import LOCAL_ACCESS_KEY

DATA_FILES = ["extra.pt", "model.safetensors", "optimizer.pt"]
ALL_FILES = sorted([*DATA_FILES, "manifest.json"])


@pytest.fixture
def s3_env(s3_server, monkeypatch: pytest.MonkeyPatch):
    """A training container's view of the S3 server: endpoint and keys in the environment."""
    monkeypatch.setenv("CKPT_S3_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.delenv("CKPT_MIRROR_URL", raising=False)
    monkeypatch.delenv("CKPT_LAST_STEP", raising=False)
    return s3_server


@pytest.fixture
def mirror_url(s3_env) -> str:
    """A fresh bucket; the mirror prefix inside it."""
    bucket = f"ckpt-{uuid.uuid4().hex[:10]}"
    S3Storage(f"s3://{bucket}/").client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/jobs/demo/run-1/checkpoints/"


def state_at(step: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(64, 32, generator=generator), "b": torch.full((32,), float(step))},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(64, generator=generator)}}, "lr": 0.1 * step},
            "extra": {"step": step, "note": "x" * step}}


def assert_state_equal(loaded: dict[str, object], expected: dict[str, object]) -> None:
    assert torch.equal(loaded["model"]["w"], expected["model"]["w"])
    assert torch.equal(loaded["model"]["b"], expected["model"]["b"])
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], expected["optimizer"]["state"][0]["exp_avg"])
    assert loaded["optimizer"]["lr"] == expected["optimizer"]["lr"] and loaded["extra"] == expected["extra"]


def object_keys(url: str) -> list[str]:
    storage = S3Storage(url)
    pages = storage.client.get_paginator("list_objects_v2").paginate(Bucket=storage.bucket, Prefix=storage.prefix)
    return sorted(o["Key"][len(storage.prefix):] for page in pages for o in page.get("Contents", []))


def record_puts(storage: S3Storage) -> list[str]:
    """Keys of completed PutObject / CompleteMultipartUpload requests, in the order the server got them."""
    order: list[str] = []

    def note(params: dict, **_: object) -> None:
        order.append(params["Key"][len(storage.prefix):])

    for operation in ("PutObject", "CompleteMultipartUpload"):
        storage.client.meta.events.register(f"before-parameter-build.s3.{operation}", note)
    return order


def save_steps(engine: CheckpointEngine, steps: list[int]) -> None:
    for step in steps:
        engine.save(step, state_at(step))
        engine.wait()


def test_mirror_uploads_manifest_last_keeps_newest_and_restores(tmp_path: Path, mirror_url: str) -> None:
    engine = CheckpointEngine(tmp_path / "node-a", keep_last=2, mirror_url=mirror_url)
    order = record_puts(engine.mirror.remote)
    save_steps(engine, [1, 2, 3])
    engine.close()

    assert object_keys(mirror_url) == [f"checkpoint-{s}/{n}" for s in (2, 3) for n in ALL_FILES] + ["progress.json"]
    for step in (1, 2, 3):
        uploads = [key.split("/", 1)[1] for key in order if key.startswith(f"checkpoint-{step}/")]
        assert sorted(uploads[:-1]) == DATA_FILES and uploads[-1] == "manifest.json"  # manifest last
    progress = json.loads((tmp_path / "node-a" / "progress.json").read_text())
    assert progress["last_mirrored_step"] == 3 and progress["last_committed_step"] == 3
    # The orchestrator's copy of the progress: in the mirror, after every checkpoint it describes.
    mirrored = json.loads(S3Storage(mirror_url).read_bytes("progress.json"))
    assert mirrored["last_committed_step"] == 3 and mirrored["committed_steps"] == progress["committed_steps"]
    last_progress = len(order) - 1 - order[::-1].index("progress.json")
    assert last_progress > order.index("checkpoint-3/manifest.json")

    fresh = tmp_path / "node-b" / "concurrent_checkpoint"  # a new node: nothing local, not even the directory
    assert restore_from_mirror(CheckpointEngine(fresh).storage, mirror_url) == 3
    assert sorted(p.name for p in fresh.iterdir()) == ["checkpoint-3"]  # no temp directory left behind
    assert_state_equal(CheckpointEngine(fresh).load(), state_at(3))

    older = tmp_path / "node-c"
    assert restore_from_mirror(CheckpointEngine(older).storage, mirror_url, step=2) == 2
    assert_state_equal(CheckpointEngine(older).load(step=2), state_at(2))
    assert restore_from_mirror(CheckpointEngine(fresh).storage, mirror_url) is None  # newest already local


class KilledMidUpload(BaseException):
    """Stands for the training process dying (SIGKILL, node loss) during a mirror upload."""


class DyingS3Storage(S3Storage):
    """Dies right before the manifest of ``die_at_step`` is put; a dead process cleans nothing up."""

    def __init__(self, url: str, die_at_step: int) -> None:
        super().__init__(url)
        self.die_at_step, self.dead = die_at_step, False

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        if key == f"checkpoint-{self.die_at_step}/manifest.json":
            self.dead = True
            raise KilledMidUpload(key)
        super().write_atomic(key, data, durable=durable)

    def delete_tree(self, prefix: str) -> None:
        if not self.dead:
            super().delete_tree(prefix)


def test_interrupted_upload_is_never_restored(tmp_path: Path, mirror_url: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    local = CheckpointEngine(tmp_path / "node-a", keep_last=0).storage
    mirror = CheckpointMirror(local, DyingS3Storage(mirror_url, die_at_step=3), keep_last=0)
    engine = CheckpointEngine(local, keep_last=0)
    save_steps(engine, [2, 3])
    mirror.mirror_checkpoint(2)
    with pytest.raises(KilledMidUpload):
        mirror.mirror_checkpoint(3)
    assert [k for k in object_keys(mirror_url) if k.startswith("checkpoint-3/")] == \
        [f"checkpoint-3/{name}" for name in DATA_FILES]  # every data file is there, the manifest is not

    fresh = CheckpointEngine(tmp_path / "node-b").storage
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        assert restore_from_mirror(fresh, mirror_url) == 2
        assert restore_from_mirror(CheckpointEngine(tmp_path / "node-c").storage, mirror_url, step=3) == 2
    assert "skipping mirrored checkpoint-3: checkpoint-3: no manifest" in caplog.text
    assert_state_equal(CheckpointEngine(fresh).load(), state_at(2))

    # the next successful mirror (a restarted process) clears the leftover
    CheckpointMirror(local, mirror_url, keep_last=2).mirror_checkpoint(2)
    assert not [k for k in object_keys(mirror_url) if k.startswith("checkpoint-3/")]


def test_failed_manifest_put_leaves_no_partial_checkpoint(tmp_path: Path, mirror_url: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    class NoManifest(S3Storage):
        def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
            raise OSError(5, "Input/output error")

    engine = CheckpointEngine(tmp_path, mirror_url=NoManifest(mirror_url))
    save_steps(engine, [1])
    assert engine.mirror.last_mirrored_step is None  # logged; saving went on
    assert object_keys(mirror_url) == []
    assert "mirroring checkpoint-1" in caplog.text and "failed" in caplog.text
    assert restore_from_mirror(CheckpointEngine(tmp_path / "fresh").storage, mirror_url) is None


def test_corrupt_mirrored_checkpoint_falls_back_to_the_one_before(tmp_path: Path, mirror_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    engine = CheckpointEngine(tmp_path / "node-a", mirror_url=mirror_url)
    save_steps(engine, [1, 2])
    engine.close()
    remote = S3Storage(mirror_url)
    original = remote.read_bytes("checkpoint-2/optimizer.pt")
    middle = len(original) // 2
    flipped = original[:middle] + bytes([original[middle] ^ 0xFF]) + original[middle + 1:]
    remote.write_atomic("checkpoint-2/optimizer.pt", flipped)  # same size, one byte flipped
    fresh = CheckpointEngine(tmp_path / "node-b").storage
    assert restore_from_mirror(fresh, mirror_url) == 1
    assert "skipping mirrored checkpoint-2" in caplog.text and "manifest says" in caplog.text
    assert sorted(fresh.list_dir("")) == ["checkpoint-1"]
    assert_state_equal(CheckpointEngine(fresh).load(), state_at(1))


class SlowMirror(MemoryStorage):
    """An in-memory mirror whose file writes take 0.25 s each."""

    def open_writer(self, key: str):  # type: ignore[no-untyped-def]
        time.sleep(0.25)
        return super().open_writer(key)


def test_newer_commits_coalesce_and_training_is_not_blocked(tmp_path: Path) -> None:
    slow = SlowMirror(f"slow-{uuid.uuid4().hex[:6]}")
    engine = CheckpointEngine(tmp_path, keep_last=2, mirror_url=slow)
    mirror = engine.mirror
    uploads: list[int] = []
    active, peak = [0], [0]
    original = mirror.mirror_checkpoint

    def counted(step: int):  # type: ignore[no-untyped-def]
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        uploads.append(step)
        try:
            return original(step)
        finally:
            active[0] -= 1

    mirror.mirror_checkpoint = counted  # type: ignore[method-assign]
    for step in range(1, 6):
        engine.save(step, state_at(step)).wait()  # committed locally; the mirror runs behind
    assert mirror.last_mirrored_step != 5  # uploading 5 takes >= 0.75 s: save() never waited for it
    engine.wait()
    assert mirror.last_mirrored_step == 5 and peak[0] == 1  # one upload at a time, the newest last
    assert len(uploads) < 5 and uploads[-1] == 5  # queued commits were superseded by newer ones
    names = slow.list_dir("")
    mirrored = sorted(n for n in names if n.startswith("checkpoint-"))
    # checkpoint-4 too when its upload started before 5 was committed (a busy machine): keep_last=2 holds
    assert mirrored[-1:] == ["checkpoint-5"] and len(mirrored) <= 2, names
    engine.close()


def test_s3_storage_as_an_engine_root(tmp_path: Path, mirror_url: str) -> None:
    engine = CheckpointEngine(mirror_url, keep_last=1)  # the storage contract holds on S3 too
    save_steps(engine, [5, 6])
    assert_state_equal(engine.load(), state_at(6))
    assert [k for k in object_keys(mirror_url) if k.startswith("checkpoint")] == \
        [f"checkpoint-6/{n}" for n in ALL_FILES]
    engine.close()


def test_large_files_go_multipart_both_ways(tmp_path: Path, mirror_url: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ckpt_engine.storage.s3.PART_BYTES", 5 << 20)  # S3's smallest part size
    engine = CheckpointEngine(tmp_path / "node-a", mirror_url=mirror_url)
    calls: list[str] = []
    engine.mirror.remote.client.meta.events.register(
        "before-parameter-build.s3.UploadPart", lambda **kwargs: calls.append("UploadPart"))
    state = {"model": {"w": torch.randn(3 << 20)}}  # 12 MiB: three parts
    engine.save(1, state)
    engine.close()
    assert calls.count("UploadPart") == 3
    fresh = CheckpointEngine(tmp_path / "node-b").storage
    assert restore_from_mirror(fresh, mirror_url) == 1
    assert torch.equal(CheckpointEngine(fresh).load()["model"]["w"], state["model"]["w"])


def test_mirror_url_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_engine.config import RuntimeConfig

    monkeypatch.setenv("CKPT_MIRROR_URL", "s3://env-bucket/ckpt/")
    assert RuntimeConfig.from_mapping({}).effective_mirror_url() == "s3://env-bucket/ckpt/"
    assert RuntimeConfig.from_mapping({"mirror_url": "s3://b/p/"}).effective_mirror_url() == "s3://b/p/"
    monkeypatch.setenv("CKPT_MIRROR_URL", "")
    assert RuntimeConfig.from_mapping({}).effective_mirror_url() is None
    with pytest.raises(ConfigError, match="mirror_url"):
        RuntimeConfig.from_mapping({"mirror_url": "bucket/prefix"})


# ---- Hugging Face Trainer ----------------------------------------------------------------------


class Blocks(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(16) * (index + 1) % 64
        return {"input_ids": ids, "labels": ids}


def tiny_trainer(output_dir: Path, max_steps: int) -> Trainer:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, save_steps=2, logging_steps=1,
                             per_device_train_batch_size=4, report_to="none", disable_tqdm=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=Blocks())


def test_trainer_resumes_on_a_fresh_node_from_the_mirror(tmp_path: Path, mirror_url: str,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CKPT_MIRROR_URL", mirror_url)  # as SAT's launcher sets it
    output = tmp_path / "output"
    trainer = tiny_trainer(output, max_steps=4)
    hooked = DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "parser_threads": 1,
                                                    "pin_host_cache": True, "trainer": trainer,
                                                    "handle_sigterm": False}, rank=-1)
    trainer.train()
    assert hooked.engine.mirror is not None and hooked.engine.mirror.last_mirrored_step == 4  # train() waited
    assert "checkpoint-4/manifest.json" in object_keys(mirror_url)

    shutil.rmtree(output)  # the next attempt lands on a fresh node
    monkeypatch.setenv("CKPT_LAST_STEP", "-1")
    again = tiny_trainer(output, max_steps=6)
    DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "trainer": again, "handle_sigterm": False}, rank=-1)
    steps_run: list[int] = []

    class CountSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            steps_run.append(state.global_step)

    again.add_callback(CountSteps())
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        again.train(resume_from_checkpoint=True)  # what the seed script passes when CKPT_LAST_STEP is set
    assert "Restored checkpoint-4 from the mirror" in caplog.text
    assert "Resuming from checkpoint-4" in caplog.text
    assert steps_run == [5, 6]  # continued from the restored step
    assert again.state.global_step == 6
    assert "checkpoint-6/manifest.json" in object_keys(mirror_url)


def test_mirror_wait_is_bounded_by_the_sigterm_grace_period(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, max_steps=1)
    hooked = DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "trainer": trainer,
                                                    "handle_sigterm": False, "grace_seconds": 30}, rank=-1)
    assert hooked.mirror_deadline() is None  # no SIGTERM: the default bound
    hooked.termination.requested, hooked.termination.requested_at = True, 1000.0
    assert hooked.mirror_deadline() == 1000.0 + 30 - 2  # the grace period less 2 s to exit cleanly


def test_sigterm_final_checkpoint_is_mirrored_before_exit(tmp_path: Path, mirror_url: str) -> None:
    trainer = tiny_trainer(tmp_path, max_steps=50)
    trainer.args.save_steps = 10
    hooked = DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "trainer": trainer, "grace_seconds": 60,
                                                    "mirror_url": mirror_url}, rank=-1)

    class SpotNotice(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer.add_callback(SpotNotice())
    try:
        with pytest.raises(SystemExit) as exited:
            trainer.train()
    finally:
        hooked.termination._finished.set()  # never let the watchdog end the test process
        hooked.termination.uninstall()
    final = hooked.termination.final_step
    assert exited.value.code == 143 and final is not None and final < 10  # a final, not a periodic, checkpoint
    assert f"checkpoint-{final}/manifest.json" in object_keys(mirror_url)
    assert json.loads((tmp_path / "concurrent_checkpoint" / "progress.json").read_text())["last_mirrored_step"] == final
