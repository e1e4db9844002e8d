"""Multi-rank commit: fake ranks (engines in one process) for the protocol, 2 gloo ranks for DeepSpeed ZeRO."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import flip_byte, read_progress, seed_env, write_ds_config

from ckpt_engine import CheckpointEngine, FaultyStorage
from ckpt_engine.contract import FileEntry
from ckpt_engine.formats import BytesFile, plan_torch_file
from ckpt_engine.manifest import CHECKSUM_PREFIX, split_for_ranks
from ckpt_engine.multirank import MARKER_DIR, RankCoordinator, RankMarker, marker_key
from sat_tasks.io.local_s3 import free_port

TOKEN = "0123abcd"


class DataFault(FaultyStorage):
    """Fails only the data files: the small failure marker still gets through."""

    def write_atomic(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self.inner.write_atomic(key, data, durable=durable)


def fake_ranks(root: Path, world_size: int = 2, timeout_s: float = 1.0) -> list[CheckpointEngine]:
    """One engine per rank over a shared root, as DecoratedCheckpointing sets them up."""
    engines = []
    for rank in range(world_size):
        engine = CheckpointEngine(str(root), rank=rank, clean_stale=rank == 0, keep_last=2, host_cache_size=0.01)
        engine.coordinator = RankCoordinator(rank, world_size, TOKEN, timeout_s=timeout_s, poll_s=0.02)
        engines.append(engine)
    return engines


def rank_files(rank: int, step: int) -> list:
    return [plan_torch_file(f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                            {"shard": torch.full((1000,), float(rank + step))}),
            BytesFile(name=f"rng_state_{rank}.pth", data=f"rng {rank}".encode())]


def save_all(engines: list[CheckpointEngine], step: int, ranks: list[int] | None = None) -> list:
    handles = []
    for rank, engine in enumerate(engines):
        engine.coordinator.next_save()  # every rank counts every save, as the Trainer hook does
        if ranks is None or rank in ranks:
            handles.append(engine.save_files(step, rank_files(rank, step), layout="hf"))
    return handles


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_all_ranks_commit_one_checkpoint(tmp_path: Path) -> None:
    engines = fake_ranks(tmp_path)
    for step in (2, 4, 6):
        save_all(engines, step)
        for engine in reversed(engines):  # rank 1 first: rank 0's commit thread waits for its marker
            engine.wait()
    assert names(tmp_path) == ["checkpoint-4", "checkpoint-6", "progress.json"]  # retention: rank 0, keep 2
    manifest = json.loads((tmp_path / "checkpoint-6" / "manifest.json").read_text())
    assert set(manifest["files"]) == {f"global_step6/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)} \
        | {"rng_state_0.pth", "rng_state_1.pth"}
    assert manifest["metadata"]["world_size"] == 2
    assert manifest["metadata"]["ranks"]["1"] == ["global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                                 "rng_state_1.pth"]
    assert not (tmp_path / "checkpoint-6" / MARKER_DIR).exists()
    loaded = engines[0].find_checkpoint()  # verifies every file's checksum
    assert loaded.step == 6
    assert read_progress(tmp_path)["last_committed_step"] == 6
    for engine in engines:
        engine.close()


@pytest.mark.parametrize("fault", ["missing", "corrupt", "foreign-run", "rank-failed"])
def test_incomplete_rank_set_is_never_promoted(tmp_path: Path, fault: str, caplog: pytest.LogCaptureFixture) -> None:
    engines = fake_ranks(tmp_path, timeout_s=1.0 if fault == "missing" else 30.0)
    save_all(engines, 2)
    for engine in reversed(engines):
        engine.wait()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="ckpt_engine"):
        if fault == "missing":  # rank 1 died before its marker
            save_all(engines, 4, ranks=[0])
        elif fault == "rank-failed":  # rank 1's disk fills up: it reports the failure, rank 0 stops waiting
            engines[1].storage = DataFault(engines[1].storage)
            engines[1].storage.arm()
            save_all(engines, 4)
            engines[1].wait()
        else:
            engines[1].coordinator.next_save()
            engines[1].save_files(4, rank_files(1, 4), layout="hf").wait()
            key = tmp_path / marker_key(engines[1].coordinator.temp_dir(4), 1)
            if fault == "corrupt":
                key.write_bytes(key.read_bytes().replace(b'"size": ', b'"size": 1'))
            else:  # a marker left by another run with the same step
                marker = RankMarker.from_json(key.read_bytes())
                marker.token = "ffff0000"
                key.write_bytes(marker.to_json())
            engines[0].coordinator.next_save()
            engines[0].save_files(4, rank_files(0, 4), layout="hf")
        engines[0].wait()
    elapsed = time.monotonic() - started
    assert names(tmp_path) == ["checkpoint-2", "progress.json"]  # not promoted; the temp dir discarded
    assert engines[0].find_checkpoint().step == 2  # the previous one stays usable
    assert read_progress(tmp_path)["last_committed_step"] == 2
    expected = {"missing": "no marker from rank(s) [1] within 1s", "corrupt": "marker is corrupt",
                "foreign-run": "run ffff0000", "rank-failed": "rank 1 failed to write its part"}[fault]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("checkpoint-4 failed and was discarded" in m and expected in m for m in errors), errors
    if fault != "missing":
        assert elapsed < 10  # no waiting for the timeout
    # the next checkpoint of the same run commits again
    if fault == "rank-failed":
        engines[1].storage.disarm()
    save_all(engines, 6)
    for engine in reversed(engines):
        engine.wait()
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-6", "progress.json"]
    for engine in engines:
        engine.close()


def test_non_zero_rank_deletes_promotes_and_reports_nothing(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-1").mkdir()  # retention and stale cleanup are rank 0's
    (tmp_path / ".tmp-checkpoint-0-old").mkdir()
    engine = CheckpointEngine(str(tmp_path), rank=1, clean_stale=False, keep_last=1, host_cache_size=0.01)
    engine.coordinator = RankCoordinator(1, 2, TOKEN)
    engine.coordinator.next_save()
    assert engine.save_files(3, rank_files(1, 3)).wait() is None
    engine.record_step(3)
    tmp = engine.coordinator.temp_dir(3)
    assert names(tmp_path) == [".tmp-checkpoint-0-old", tmp, "checkpoint-1"]
    assert (tmp_path / marker_key(tmp, 1)).exists()
    engine.close()


# ---- DeepSpeed ZeRO on 2 CPU ranks (gloo) through the unchanged seed script -----------------------


def losses(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def torchrun_command(out: Path, config: Path | None, vendor_dir: Path, corpus_dir: Path, *args: str,
                     env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The seed script on 2 CPU ranks: DeepSpeed with ``config``, plain DDP (gloo) without.

    DeepSpeed ranks start as SAT's Kubernetes backend starts them (``k8s_supervisor.launch_command``):
    through ``ckpt_engine.launch``, which passes ``--local_rank`` as the ``deepspeed`` launcher does.
    """
    entry = ["-m", "ckpt_engine.launch"] if config is not None else []
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), *entry, str(Path(__file__).with_name("run_seed.py")),
               "--data_dir", str(corpus_dir), "--output_dir", str(out), *args]
    if config is not None:
        command += ["--deepspeed", str(config)]
    return command, seed_env(vendor_dir, DS_ACCELERATOR="cpu", SEED_CPU_DIST="1", **(env or {}))


def torchrun(out: Path, config: Path | None, vendor_dir: Path, corpus_dir: Path, *args: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command, environment = torchrun_command(out, config, vendor_dir, corpus_dir, *args, env=env)
    return subprocess.run(command, env=environment, cwd=str(out.parent), stdout=subprocess.PIPE, check=False,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def assert_gathered_weights(folder: Path, step: int) -> None:
    """model.safetensors of a ZeRO-3 checkpoint: the full weights, equal to those DeepSpeed's shards hold."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    saved = load_file(str(folder / "model.safetensors"))
    from_shards = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=f"global_step{step}")
    assert len(saved) > 10 and set(saved) == set(from_shards)
    for name, tensor in saved.items():
        assert tensor.numel() > 0 and tensor.shape == from_shards[name].shape, name  # not ZeRO-3's empty placeholders
        assert torch.equal(tensor.float(), from_shards[name].float()), name


# The three stages at two ranks run with `make test-slow` (ZeRO-3 alone took 100 s of a 25-minute suite):
# `make test` saves and resumes ZeRO 1, 2 and 3 at two ranks in test_ckpt_deepspeed_datastates.py, and each
# stage at one rank in test_ckpt_hf.py.
@pytest.mark.parametrize("stage", [pytest.param(1, id="zero1", marks=pytest.mark.slow),
                                   pytest.param(2, id="zero2", marks=pytest.mark.slow),
                                   pytest.param(3, id="zero3", marks=pytest.mark.slow)])
def test_deepspeed_two_ranks_concurrent_save_and_resume(tmp_path: Path, vendor_dir: Path, corpus_dir: Path,
                                                        stage: int) -> None:
    pytest.importorskip("deepspeed")
    out = tmp_path / "ds2"
    out.mkdir()
    # ZeRO-3's partitioned weights: model.safetensors needs the gather the Trainer also uses
    gather = {"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {}
    config = write_ds_config(tmp_path / "ds.json", stage, gather)
    root = out / "concurrent_checkpoint"
    args = ("--max_steps", "6", "--save_steps", "3")
    first = torchrun(out, config, vendor_dir, corpus_dir, *args)
    assert first.returncode == 0, first.stdout[-5000:]
    assert "rank 1 of 2 writes its part of each checkpoint" in first.stdout
    assert "synchronous checkpoints" not in first.stdout
    assert not [p for p in out.iterdir() if p.name.startswith("checkpoint-")]  # no Trainer-own saves
    for step in (3, 6):
        folder = root / f"checkpoint-{step}"
        manifest = json.loads((folder / "manifest.json").read_text())
        files = manifest["files"]
        for rank in (0, 1):
            shards = [f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"]
            if stage == 3:  # ZeRO-3: every rank also owns its partition of the model states
                shards.append(f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
            for shard in shards:
                assert shard in files and files[shard]["checksum"].startswith(CHECKSUM_PREFIX)
                assert files[shard]["size"] > 0 and shard in manifest["metadata"]["ranks"][str(rank)]
            assert f"rng_state_{rank}.pth" in files
        assert {"model.safetensors", "trainer_state.json", "latest"} <= set(files)
        if stage < 3:
            assert f"global_step{step}/mp_rank_00_model_states.pt" in files
        else:
            assert_gathered_weights(folder, step)
        assert (folder / "latest").read_text() == f"global_step{step}"
        assert not (folder / MARKER_DIR).exists()
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-3", "checkpoint-6", "progress.json"]
    assert read_progress(root)["last_committed_step"] == 6
    straight = losses(root / "checkpoint-6")
    if stage < 3:
        shutil.rmtree(root / "checkpoint-6")  # as if the run had died after checkpoint-3
        second = torchrun(out, config, vendor_dir, corpus_dir, *args, env={"CKPT_LAST_STEP": "3"})
    else:  # a flipped byte in a file only rank 1 hashes: both ranks must still skip checkpoint-6
        files = {name: FileEntry(**entry) for name, entry in
                 json.loads((root / "checkpoint-6" / "manifest.json").read_text())["files"].items()}
        victim = split_for_ranks(files, 2)[1][0]
        flip_byte(root / "checkpoint-6" / victim)
        second = torchrun(out, config, vendor_dir, corpus_dir, *args, env={"CKPT_LAST_STEP": "-1"})  # newest
        shares = re.findall(r"checkpoint-6: rank (\d) of 2 checked the checksums of (\d+) of (\d+) files",
                            second.stdout)
        assert sorted(rank for rank, _, _ in shares) == ["0", "1"], second.stdout[-5000:]
        assert sum(int(count) for _, count, _ in shares) == len(files) and all(int(c) for _, c, _ in shares)
        skipped = [line for line in second.stdout.splitlines() if "checkpoint-6 at" in line and "skipping" in line]
        assert len(skipped) == 2 and all(f"rank 1: {victim}: checksum" in line for line in skipped)
    assert second.returncode == 0, second.stdout[-5000:]
    assert second.stdout.count("Resuming from checkpoint-3") == 2  # both ranks
    final = root / "checkpoint-6"
    manifest = json.loads((final / "manifest.json").read_text())  # saved again, by both ranks
    assert {f"global_step6/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)} <= set(manifest["files"])
    assert json.loads((final / "trainer_state.json").read_text())["global_step"] == 6
    resumed = losses(final)
    assert all(math.isfinite(resumed[step]) for step in (4, 5, 6))
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-4), (step, resumed, straight)


def test_ddp_two_ranks_save_every_ranks_rng_state_and_resume(tmp_path: Path, vendor_dir: Path,
                                                              corpus_dir: Path) -> None:
    """DDP: rank 0 writes the model and optimizer, each rank its own rng_state_<rank>.pth, as the Trainer does."""
    out = tmp_path / "ddp"
    out.mkdir()
    root = out / "concurrent_checkpoint"
    args = ("--max_steps", "6", "--save_steps", "3")
    first = torchrun(out, None, vendor_dir, corpus_dir, *args)
    assert first.returncode == 0, first.stdout[-5000:]
    assert "rank 1 of 2 writes its part of each checkpoint" in first.stdout
    for step in (3, 6):
        manifest = json.loads((root / f"checkpoint-{step}" / "manifest.json").read_text())
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"} \
            <= set(manifest["files"])
        assert manifest["metadata"]["ranks"]["1"] == ["rng_state_1.pth"]
        rng = torch.load(root / f"checkpoint-{step}" / "rng_state_1.pth", weights_only=False)
        assert {"python", "numpy", "cpu"} <= set(rng)  # what the Trainer's _load_rng_state reads on rank 1
    straight = losses(root / "checkpoint-6")
    shutil.rmtree(root / "checkpoint-6")
    second = torchrun(out, None, vendor_dir, corpus_dir, *args, env={"CKPT_LAST_STEP": "3"})
    assert second.returncode == 0, second.stdout[-5000:]
    assert second.stdout.count("Resuming from checkpoint-3") == 2
    resumed = losses(root / "checkpoint-6")
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-4), (step, resumed, straight)


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_a_final_checkpoint(
        tmp_path: Path, vendor_dir: Path, corpus_dir: Path) -> None:
    """A Spot notice may reach the ranks steps apart (here: rank 1 only); they must still stop together.

    A rank that stopped alone would leave the others blocked in the next step's all-reduce,
    and its part of the final checkpoint would never be committed.
    """
    import psutil

    out = tmp_path / "spot2"
    out.mkdir()
    root = out / "concurrent_checkpoint"
    command, environment = torchrun_command(out, None, vendor_dir, corpus_dir, "--max_steps", "400", "--save_steps",
                                            "5", env={"SEED_STEP_SLEEP": "0.1", "CKPT_GRACE_SECONDS": "60"})
    proc = subprocess.Popen(command, env=environment, cwd=str(out), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while (read_progress(root).get("last_committed_step") or 0) < 5 and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.25)  # between periodic saves
        ranks = {child.environ().get("LOCAL_RANK"): child for child in psutil.Process(proc.pid).children(recursive=True)
                 if "run_seed.py" in " ".join(child.cmdline())}
        ranks["1"].send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert output.count("final checkpoint checkpoint-") == 2, output[-6000:]  # both ranks, the same step
    final = int(re.search(r"final checkpoint checkpoint-(\d+) committed", output).group(1))  # type: ignore[union-attr]
    assert f"final checkpoint checkpoint-{final} committed" in output.replace(
        f"final checkpoint checkpoint-{final} committed", "", 1)  # the other rank names the same step
    assert "another rank received SIGTERM" in output  # rank 0 learned it from the vote, not from a signal
    manifest = json.loads((root / f"checkpoint-{final}" / "manifest.json").read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(manifest["files"])
    assert read_progress(root)["last_committed_step"] == final and final > 5


def test_spot_notice_to_one_pod_of_a_rendered_two_node_deepspeed_job(tmp_path: Path, vendor_dir: Path,
                                                                     corpus_dir: Path) -> None:
    """The whole Kubernetes stop path, run here: two "pods" of a 2-node ZeRO-1 job as SAT renders them.

    Each pod is the rendered supervisor (PID 1's script) running the rendered torchrun command
    (`-m ckpt_engine.launch` in front of the seed script); a Spot notice (SIGTERM) reaches
    pod 1 only. Both ranks must stop at the same step and commit one final checkpoint together.
    """
    pytest.importorskip("deepspeed")
    from sat_tasks.backends.kubernetes import pods as k8s_pods
    from sat_tasks.backends.kubernetes import settings as k8s_settings
    from sat_tasks.core.handoffs import Plan
    from sat_tasks.spec import parse_spec

    out = tmp_path / "shared"  # the run's volume, shared by both pods
    out.mkdir()
    root = out / "concurrent_checkpoint"
    config = write_ds_config(tmp_path / "ds.json", 1)
    job = parse_spec({
        "name": "ds-spot", "learning_type": "spot", "framework": "deepspeed", "nodes": 2,
        "resources": {"server_type": "cpu", "gpus_per_node": 0, "memory": "8Gi"},
        "image": {"url": "registry.example.com/sat/training:0.1.0"},
        "data": {"source": "s3://data/corpus/"}, "results": {"destination": "s3://results/out/"},
        "command": f"python run_seed.py --data_dir {corpus_dir} --output_dir {out} --max_steps 400 "
                   f"--save_steps 5 --deepspeed {config}",
        "env": {"CKPT_GRACE_SECONDS": "60"},
    }, source="ds-spot")
    pods = k8s_pods.build_attempt_pods(job, run_id="manual__spot", plan=Plan(attempt=1),
                                       settings=k8s_settings.KubernetesSettings())
    script, launched = pods[0].spec.containers[0].command[2], pods[0].spec.containers[0].command[4]
    assert "-m ckpt_engine.launch run_seed.py" in launched
    pod_env = {var.name: var.value for var in pods[0].spec.containers[0].env if var.value is not None}
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = seed_env(vendor_dir, DS_ACCELERATOR="cpu", SEED_CPU_DIST="1", SEED_STEP_SLEEP="0.1",
                       CKPT_GRACE_SECONDS=pod_env["CKPT_GRACE_SECONDS"],
                       TORCH_ELASTIC_SHUTDOWN_TIMEOUT=pod_env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"],
                       NNODES="2", NODE_RANK=str(rank), NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=port, SAT_CODE_DIR=str(Path(__file__).parent), SAT_ATTEMPT="1",
                       SAT_JOB_NAME=job.name, SAT_NODE=f"node-{rank}")
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        procs.append(subprocess.Popen(["bash", "-c", script.replace("getent", "true"), "sat-launch", launched],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.monotonic() + 180
        while (read_progress(root).get("last_committed_step") or 0) < 5 and time.monotonic() < deadline \
                and all(p.poll() is None for p in procs):
            time.sleep(0.05)
        time.sleep(0.25)  # between periodic saves
        procs[1].send_signal(signal.SIGTERM)  # the kubelet, to pod 1's PID 1
        outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    final = read_progress(root)["last_committed_step"]
    assert final is not None and final > 5, outputs[1][-4000:]
    for output in outputs:
        assert f"final checkpoint checkpoint-{final} committed" in output, output[-4000:]
    # Both ranks exited 143 after the final checkpoint; each torchrun exits 1 (as it does), and
    # its log says why: pod 1's torchrun got the signal, pod 0's rank got none and learned of
    # the stop from the vote. The classifier must read that as a stop from outside, not as an
    # internal error that would end a Spot job instead of resuming it.
    from sat_tasks.classify import VerdictKind, classify, combine_rank_records
    from sat_tasks.core.attempt import AttemptRecord

    assert [p.returncode for p in procs] == [1, 1]
    assert "another rank received SIGTERM" in outputs[0]
    records = [AttemptRecord(job=job.name, attempt=1, backend="kubernetes", node=f"node-{rank}", exit_code=1,
                             log_tail=output.splitlines()[-200:]) for rank, output in enumerate(outputs)]
    verdicts = [classify(record) for record in records]
    # a stop from outside, not a bug, and no fault: an interruption resumed without blame (issue 43, ADR 0004)
    assert all(verdict.kind is VerdictKind.PREEMPTED for verdict in verdicts), verdicts
    assert all(verdict.reason.startswith("interrupted:") for verdict in verdicts), verdicts
    assert "after another rank received SIGTERM" in verdicts[0].reason
    assert "killed by SIGTERM from outside" in verdicts[1].reason
    combined = combine_rank_records(records, log=lambda _: None)
    assert combined.node == "node-1"  # the pod that got the notice speaks for the attempt
    manifest = json.loads((root / f"checkpoint-{final}" / "manifest.json").read_text())
    assert any(name.startswith(f"global_step{final}/") for name in manifest["files"])
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(manifest["files"])
