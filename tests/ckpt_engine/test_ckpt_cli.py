"""``sat ckpt ls|verify`` and ``sat vendor`` subcommands, and the vendor directory layout."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_engine import CheckpointEngine
from ckpt_engine.cli import register_cli, register_vendor_cli
from ckpt_engine.vendor import write_vendor_dir


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sat")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register_cli(subparsers)
    register_vendor_cli(subparsers)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    checkpoints = tmp_path / "out" / "concurrent_checkpoint"
    engine = CheckpointEngine(checkpoints, keep_last=0)
    for step in (5, 10):
        engine.save(step, {"model": {"w": torch.randn(100)}})
    engine.close()
    return checkpoints


def test_ls_lists_checkpoints_from_output_dir(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("ckpt", "ls", str(root.parent), "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["status"]) for r in rows] == [("checkpoint-10", "complete"), ("checkpoint-5", "complete")]
    assert run_cli("ckpt", "ls", str(root)) == 0
    assert "last_committed_step=10" in capsys.readouterr().out


def test_verify_reports_corruption(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("ckpt", "verify", str(root)) == 0
    target = root / "checkpoint-10" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    assert run_cli("ckpt", "verify", str(root)) == 1
    out = capsys.readouterr().out
    assert "CORRUPT  checkpoint-10" in out and "OK       checkpoint-5" in out
    assert run_cli("ckpt", "verify", str(root / "checkpoint-5")) == 0


def test_verify_empty_dir(tmp_path: Path) -> None:
    assert run_cli("ckpt", "verify", str(tmp_path)) == 2


def test_vendor_dir_is_idempotent_and_self_contained(tmp_path: Path) -> None:
    dest = tmp_path / "vendor"
    assert run_cli("vendor", str(dest)) == 0
    assert write_vendor_dir(dest) == dest.resolve()
    assert {p.name for p in dest.iterdir()} == {"ckpt_engine", "datastates", ".sat-engine"}
    probe = ("import ckpt_engine, datastates, datastates.llm;"
             "from datastates.llm import DecoratedCheckpointing; from datastates import CheckpointEngine;"
             "print(ckpt_engine.__file__)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(dest)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(dest.resolve()))


def test_a_vendor_dir_with_this_engine_is_kept_and_a_warm_runs_is_linked_not_copied(tmp_path: Path) -> None:
    from ckpt_engine.vendor import engine_hash, lay_out_vendor_dir, vendor_hash

    warm, fresh = tmp_path / "warm-run" / "checkpoint_vendor", tmp_path / "next-run" / "checkpoint_vendor"
    assert lay_out_vendor_dir(warm) == "written" and vendor_hash(warm) == engine_hash()
    engine_file = warm / "ckpt_engine" / "engine.py"
    inode = engine_file.stat().st_ino
    assert lay_out_vendor_dir(warm) == "present" and engine_file.stat().st_ino == inode  # not rewritten
    assert lay_out_vendor_dir(fresh, reuse_from=warm) == "linked"
    assert (fresh / "ckpt_engine" / "engine.py").stat().st_ino == inode  # the same file, no copy
    assert (fresh / "datastates" / "llm" / "__init__.py").read_text() == (warm / "datastates" / "llm" /
                                                                         "__init__.py").read_text()
    other = tmp_path / "other-engine"
    assert lay_out_vendor_dir(other) == "written"
    (other / ".sat-engine").write_text("0123456789abcdef\n")  # laid out by another version of the engine
    again = tmp_path / "again"
    assert lay_out_vendor_dir(again, reuse_from=other) == "written"  # not linked to a different engine
    assert (again / "ckpt_engine" / "engine.py").stat().st_ino != (other / "ckpt_engine" / "engine.py").stat().st_ino
    assert lay_out_vendor_dir(other) == "written"  # its stamp says another engine: refreshed
