"""DeepSpeed's ``datastates_ckpt`` engine (SAT's alias) against DeepSpeed's default engine, ZeRO 1/2/3, 1 and 2 ranks.

One torchrun launch per world size runs all three ZeRO stages (``ds_datastates_child.py``):
save, a load of the tag still in flight in the same process, then a fresh engine's
``load_checkpoint(dir)`` *without a tag* (through ``latest``, written on commit after the
manifest); model partition, optimizer and scheduler state bit-equal to DeepSpeed's default.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_helpers import seed_env
from test_ckpt_multirank import free_port

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("world_size", [pytest.param(1, id="1-rank"), pytest.param(2, id="2-ranks")])
def test_datastates_ckpt_resumes_without_a_tag_bit_equal_to_deepspeeds_default(tmp_path: Path, vendor_dir: Path,
                                                                                world_size: int) -> None:
    pytest.importorskip("deepspeed")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(HERE / "ds_datastates_child.py"), str(tmp_path)]
    done = subprocess.run(command, env=seed_env(vendor_dir, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0"),
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-6000:]
    stages = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert [ranks[0]["stage"] for ranks in stages] == [1, 2, 3], done.stdout[-3000:]
    for ranks in stages:
        assert len(ranks) == world_size
        for result in ranks:
            assert result["engine"] == "ckpt_engine.integrations.deepspeed"  # the alias, not a fallback
            assert result["latest"] == "global_step2" and result["manifest"]
            assert result["in_flight_load_equal"] == [], result
            assert result["differences"] == [], result  # bit-equal to DeepSpeed's default engine
            assert result["vs_saved"] == [], result
            assert result["changed_from_untrained"] > 0 and result["tensors"] > 10
    committed = json.loads((tmp_path / "datastates-3" / "global_step2" / "manifest.json").read_text())
    assert len(committed["metadata"]["ranks"]) == world_size
    assert not (tmp_path / "datastates-3" / "global_step2" / ".ranks").exists()
