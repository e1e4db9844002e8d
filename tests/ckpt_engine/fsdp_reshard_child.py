"""One rank of the FSDP resharding check (tests/ckpt_engine/test_fsdp_reshard.py), run under torchrun on CPU (gloo).

    fsdp_reshard_child.py save <dir>   # N ranks: 3 steps, then DCP's sharded save and a full copy for comparison
    fsdp_reshard_child.py load <dir>   # any world size: DCP's load into this layout, then two more steps

The model is sharded with FSDP2 (`fully_shard`, one shard per rank); the state dicts are
`torch.distributed.checkpoint.state_dict`'s (sharded DTensors), which is what the HF Trainer's
FSDP saves with `SHARDED_STATE_DICT` write through DCP. Every rank trains on the same batch, so
the loss and the update do not depend on the world size. Rank 0 prints one line:
``RESULT {...}`` (JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

STEPS = 3


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> float:
    generator = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(32, 16, generator=generator), torch.randn(32, 4, generator=generator)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole model and optimizer state, gathered (every rank takes part; rank 0 keeps it)."""
    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_sd, "optim": optim_sd}


def flat(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        elif isinstance(value, torch.Tensor):
            out[name] = value
    return out


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build()
    result: dict = {"mode": mode, "world": world}
    if mode == "save":
        result["losses"] = [train_step(model, optimizer, step) for step in range(1, STEPS + 1)]
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder / "sharded"))
        whole = full_state(model, optimizer)
        if rank == 0:  # before the next step: a gathered state may share tensors (AdamW's step) with the live one
            torch.save(whole, folder / "full.pt")
        # what an uninterrupted run does next; the second step's loss depends on the first's AdamW update
        result["next_losses"] = [train_step(model, optimizer, step) for step in (STEPS + 1, STEPS + 2)]
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)  # this layout's shards (optimizer state initialised)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(folder / "sharded"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        whole = full_state(model, optimizer)
        if rank == 0:
            saved = flat(torch.load(folder / "full.pt", weights_only=True))
            loaded = flat(whole)
            result["keys_match"] = sorted(saved) == sorted(loaded)
            result["tensors"] = len(saved)
            diffs = {k: float((saved[k].float() - loaded[k].float()).abs().max()) for k in saved if k in loaded}
            result["max_abs_diff"] = max(diffs.values(), default=float("inf"))
            result["differing"] = sorted(k for k, d in diffs.items() if d)
        result["next_losses"] = [train_step(model, optimizer, step) for step in (STEPS + 1, STEPS + 2)]
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()  # gloo's threads must not outlive the interpreter (pytorch#190489)


if __name__ == "__main__":
    main()
