"""One rank of the DeepSpeed ``datastates_ckpt`` test: ZeRO 1, 2, 3 in one launch (torchrun, gloo, CPU).

Per stage: two identical engines train two steps, one with DeepSpeed's default checkpoint
engine, one with ``datastates_ckpt`` (SAT's alias); each saves; a save is loaded back by
its own engine right away (a tag still in flight in this process); the datastates engine
is destroyed (its commit: manifest, then ``latest``); fresh engines load each directory
*without a tag*; model partition, optimizer and scheduler state must be bit-equal. Prints
one ``RESULT {json}`` line per stage on rank 0.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import deepspeed
import torch
import torch.distributed as dist


def build(stage: int, datastates: bool) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}},
        "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
    }
    if datastates:
        config["datastates_ckpt"] = {"host_cache_size": 0.05, "parser_threads": 2}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def train(engine: Any, steps: int) -> None:
    generator = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(2, 16, generator=generator)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}/"))
        return out
    if isinstance(value, (list, tuple)):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}{index}/"))
        return out
    return {prefix: value}


def snapshot(engine: Any) -> dict[str, Any]:
    params = {name: getattr(p, "ds_tensor", p).detach().clone() for name, p in engine.module.named_parameters()}
    return flatten({"model": params, "optimizer": engine.optimizer.state_dict(),
                    "scheduler": engine.lr_scheduler.state_dict(), "global_steps": engine.global_steps})


def differences(left: dict[str, Any], right: dict[str, Any]) -> list[str]:
    found = [f"only one side: {key}" for key in sorted(set(left) ^ set(right))]
    for key in sorted(set(left) & set(right)):
        a, b = left[key], right[key]
        if torch.is_tensor(a):
            if not (torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)):
                found.append(f"differs: {key}")
        elif a != b and repr(a) != repr(b):
            found.append(f"differs: {key} ({a!r} != {b!r})")
    return found


def run_stage(stage: int, root: str) -> dict[str, Any]:
    plain_dir, ds_dir = os.path.join(root, f"plain-{stage}"), os.path.join(root, f"datastates-{stage}")
    plain, datastates = build(stage, False), build(stage, True)
    engine_name = type(datastates.checkpoint_engine.ckpt_engine).__module__
    train(plain, 2)
    train(datastates, 2)
    saved = snapshot(datastates)
    plain.save_checkpoint(plain_dir)
    datastates.save_checkpoint(ds_dir)
    datastates.load_checkpoint(ds_dir, tag="global_step2")  # in flight in this process: waits for the commit
    in_flight_ok = differences(snapshot(datastates), saved)
    datastates.destroy()  # DeepSpeed's cleanup: wait(persist=True), rank 0 commits
    dist.barrier()
    with open(os.path.join(ds_dir, "latest")) as handle:
        latest = handle.read()
    manifest = os.path.exists(os.path.join(ds_dir, "global_step2", "manifest.json"))
    fresh_plain, fresh_datastates = build(stage, False), build(stage, True)
    untrained = snapshot(fresh_datastates)
    fresh_plain.load_checkpoint(plain_dir)  # no tag: DeepSpeed reads `latest`
    fresh_datastates.load_checkpoint(ds_dir)
    loaded_plain, loaded_ds = snapshot(fresh_plain), snapshot(fresh_datastates)
    return {"stage": stage, "world_size": dist.get_world_size(), "rank": dist.get_rank(), "engine": engine_name,
            "latest": latest, "manifest": manifest, "in_flight_load_equal": in_flight_ok,
            "differences": differences(loaded_ds, loaded_plain), "vs_saved": differences(loaded_ds, saved),
            "changed_from_untrained": len(differences(loaded_ds, untrained)), "tensors": len(loaded_ds)}


def main() -> None:
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as run_seed.py: no JIT build of the shm op
    deepspeed.init_distributed(dist_backend="gloo")
    root = sys.argv[1]
    for stage in (1, 2, 3):
        result = run_stage(stage, root)
        results: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(results, result)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(results), flush=True)
    # Run bare under torchrun (not through ckpt_engine.launch, which does this for users' scripts): left to the
    # interpreter's finalization, gloo's threads can abort a rank after the RESULT line (SIGABRT, "terminate called
    # without an active exception", pytorch/pytorch#190489), as one CI run saw, and a fresh-clone run on
    # 2026-12-07 saw again after destroy_process_group. Every rank's results are in (gathered above): once all
    # ranks are here, each leaves without the finalization where gloo's threads are torn down.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
