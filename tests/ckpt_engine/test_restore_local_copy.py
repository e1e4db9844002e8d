"""A failover whose new node shares the old node's disk resumes from the node-local copy, not a download (issue 32.4).

On the local backend every attempt of a run has the same checkpoint root (`JobRun.output_dir`
is per run, not per node: the local "nodes" are one host), so the next attempt finds the
checkpoint the killed one committed. `restore_from_mirror` then downloads nothing and the log
says which copy the resume uses; the checksums are verified where the resume chooses its
checkpoint, as for any restore. Every download goes through `mirror.restore_checkpoint`, which
the tests wrap to record it; the control (a local copy whose file sizes do not match its
manifest) shows that the same check sees a download when one happens.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from transformers import TrainerCallback

from ckpt_engine import CheckpointEngine, DecoratedCheckpointing
from ckpt_engine import mirror as mirror_module
from ckpt_engine.mirror import restore_from_mirror
from tests.ckpt_engine.test_ckpt_mirror import (  # noqa: F401 - fixtures, used by name
    mirror_url,
    object_keys,
    s3_env,
    save_steps,
    tiny_trainer,
)

LOCAL_COPY = "the node-local copy is the newest wanted"
DOWNLOADED = "from the mirror"


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps of every checkpoint downloaded from the mirror to a node, recorded; the downloads still happen."""
    steps: list[int] = []
    real = mirror_module.restore_checkpoint

    def recording(remote, local, step):  # type: ignore[no-untyped-def]
        steps.append(step)
        return real(remote, local, step)

    monkeypatch.setattr(mirror_module, "restore_checkpoint", recording)
    return steps


def test_a_failover_on_the_same_host_resumes_from_the_local_copy_without_downloading_it(
        tmp_path: Path, mirror_url: str, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
        caplog: pytest.LogCaptureFixture, downloads: list[int]) -> None:
    monkeypatch.setenv("CKPT_MIRROR_URL", mirror_url)  # as SAT's launcher sets it
    output = tmp_path / "output"  # the run's output directory: the same for the attempt on the next node
    first = tiny_trainer(output, max_steps=4)
    hooked = DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "parser_threads": 1, "trainer": first,
                                                    "handle_sigterm": False}, rank=-1)
    first.train()
    assert hooked.engine.mirror is not None and hooked.engine.mirror.last_mirrored_step == 4
    assert "checkpoint-4/manifest.json" in object_keys(mirror_url)  # a download was possible

    monkeypatch.setenv("CKPT_LAST_STEP", "-1")  # the failover attempt's environment
    again = tiny_trainer(output, max_steps=6)
    DecoratedCheckpointing(runtime_config={"host_cache_size": 1, "trainer": again, "handle_sigterm": False}, rank=-1)
    steps_run: list[int] = []

    class CountSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            steps_run.append(state.global_step)

    again.add_callback(CountSteps())
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        again.train(resume_from_checkpoint=True)
    assert downloads == []
    assert f"checkpoint-4: {LOCAL_COPY}" in caplog.text and DOWNLOADED not in caplog.text
    assert "Resuming from checkpoint-4" in caplog.text
    assert steps_run == [5, 6]


def test_a_local_copy_that_does_not_match_its_manifest_is_downloaded_again(
        tmp_path: Path, mirror_url: str, caplog: pytest.LogCaptureFixture,  # noqa: F811 - the fixture
        downloads: list[int]) -> None:
    engine = CheckpointEngine(tmp_path / "node-a", mirror_url=mirror_url)
    save_steps(engine, [1, 2])
    engine.close()
    local = CheckpointEngine(tmp_path / "node-a").storage
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        assert restore_from_mirror(local, mirror_url) is None  # the same disk: nothing to download
    assert downloads == [] and f"checkpoint-2: {LOCAL_COPY}" in caplog.text

    damaged = tmp_path / "node-a" / "checkpoint-2" / "model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-1])  # a size the manifest does not name
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        assert restore_from_mirror(local, mirror_url) == 2
    assert downloads == [2]
    assert f"Restored checkpoint-2 {DOWNLOADED}" in caplog.text and LOCAL_COPY not in caplog.text


def test_the_local_copy_of_the_step_asked_for_is_used_without_asking_the_mirror(
        tmp_path: Path, mirror_url: str, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
        caplog: pytest.LogCaptureFixture) -> None:
    engine = CheckpointEngine(tmp_path / "node-a", mirror_url=mirror_url)
    save_steps(engine, [1, 2])
    engine.close()
    opened: list[object] = []
    real = mirror_module.open_storage
    monkeypatch.setattr(mirror_module, "open_storage", lambda url: opened.append(url) or real(url))
    local = CheckpointEngine(tmp_path / "node-a").storage
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        assert restore_from_mirror(local, mirror_url, step=2) is None  # CKPT_LAST_STEP=2, as a failover sets it
    assert opened == [] and f"checkpoint-2: {LOCAL_COPY}" in caplog.text
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        assert restore_from_mirror(local, mirror_url) is None  # the newest (-1): the mirror may hold a newer one
    assert opened == [mirror_url]
