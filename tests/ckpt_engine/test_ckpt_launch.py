"""ckpt_engine.launch: a script started by torchrun gets the arguments the `deepspeed` launcher gives it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_engine.launch import USAGE, script_argv

REPO = Path(__file__).resolve().parents[2]
SHOW = "import sys, os\nprint('argv', sys.argv[1:], 'name', __name__, 'file', os.path.basename(sys.argv[0]))\n"


@pytest.mark.parametrize(("argv", "local_rank", "expected"), [
    pytest.param(["train.py", "--deepspeed", "ds.json"], "3",
                 ("train.py", False, ["train.py", "--local_rank=3", "--deepspeed", "ds.json"]), id="script"),
    pytest.param(["-m", "pkg.train", "--x", "1"], "0",
                 ("pkg.train", True, ["pkg.train", "--local_rank=0", "--x", "1"]), id="module"),
    pytest.param(["train.py"], None, ("train.py", False, ["train.py"]), id="not-under-a-launcher"),
])
def test_local_rank_goes_first_as_the_deepspeed_launcher_puts_it(argv, local_rank, expected) -> None:
    assert script_argv(argv, local_rank) == expected


@pytest.mark.parametrize("argv", [[], ["-m"], ["--deepspeed", "ds.json"]], ids=["nothing", "module-missing", "flag"])
def test_no_script_is_a_usage_error(argv) -> None:
    with pytest.raises(SystemExit, match="usage: python -m ckpt_engine.launch"):
        script_argv(argv, "0")
    assert "SCRIPT" in USAGE


def test_runs_a_script_and_a_module_as_main(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SHOW)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(SHOW)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}", LOCAL_RANK="1")
    for args, name in ((["train.py", "--a", "1"], "train.py"), (["-m", "pkg.train", "--a", "1"], "train.py")):
        result = subprocess.run([sys.executable, "-m", "ckpt_engine.launch", *args], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert f"argv ['--local_rank=1', '--a', '1'] name __main__ file {name}" in result.stdout


def test_process_group_destroyed_at_exit_after_training_ended(tmp_path: Path) -> None:
    """A script that never calls destroy_process_group: the engine destroys the group before finalization.

    Left to the interpreter's teardown, gloo's worker threads can abort the process (SIGABRT,
    "terminate called without an active exception") after a successful training.
    """
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, sys
        import torch.distributed as dist
        from ckpt_engine.integrations.hf import release_process_group_at_exit
        # registered first, so it runs last: it sees what the engine's handler left
        atexit.register(lambda: print("initialized at the end:", dist.is_initialized(), flush=True))
        dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
        release_process_group_at_exit()
        release_process_group_at_exit()  # a second trainer in the same script: still one handler
        print("initialized after training:", dist.is_initialized(), flush=True)
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "rendezvous")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "initialized after training: True" in done.stdout
    assert "initialized at the end: False" in done.stdout


def test_the_launcher_destroys_the_group_a_script_left_behind(tmp_path: Path) -> None:
    """A script for the `deepspeed` launcher that joins a gloo group and returns: the group is gone before exit."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import atexit, sys
        import torch.distributed as dist
        atexit.register(lambda: print("initialized at the end:", dist.is_initialized(), flush=True))
        dist.init_process_group("gloo", init_method="file://" + sys.argv[-1], rank=0, world_size=1)
    """))
    done = subprocess.run([sys.executable, "-m", "ckpt_engine.launch", "train.py", str(tmp_path / "rendezvous")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "LOCAL_RANK": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "initialized at the end: False" in done.stdout
