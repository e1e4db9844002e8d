"""``sat ckpt ls|verify DIR`` and ``sat vendor DIR``: argparse subcommands the ``sat`` CLI mounts.

``DIR`` may be a checkpoint root (``.../concurrent_checkpoint``), a training
``output_dir`` containing one, or a single ``checkpoint-<step>`` directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt_engine.contract import (
    CONCURRENT_DIR,
    PROGRESS_NAME,
    VENDOR_ENV,
    ProgressRecord,
    checkpoint_dir,
    parse_step,
)

if TYPE_CHECKING:  # pragma: no cover
    from ckpt_engine.storage.file import FileStorage

EXIT_OK, EXIT_CORRUPT, EXIT_NOTHING = 0, 1, 2


def _locate(directory: str) -> tuple[FileStorage, list[str]]:
    # numpy and xxhash come with the manifest: imported when a command runs, not when `sat` builds its parser.
    from ckpt_engine.manifest import list_checkpoint_steps
    from ckpt_engine.storage.file import FileStorage

    path = Path(directory).resolve()
    if parse_step(path.name) is not None:
        return FileStorage(path.parent), [path.name]
    if (path / CONCURRENT_DIR).is_dir() and not list_checkpoint_steps(FileStorage(path)):
        path = path / CONCURRENT_DIR
    storage = FileStorage(path)
    return storage, [checkpoint_dir(step) for step in list_checkpoint_steps(storage)]


def list_checkpoints(args: argparse.Namespace) -> int:
    """Print every checkpoint with its state, size and date (manifest and sizes only, fast)."""
    from ckpt_engine.manifest import verify_checkpoint

    storage, names = _locate(args.dir)
    rows: list[dict[str, Any]] = []
    for name in names:
        report = verify_checkpoint(storage, name, deep=False)
        manifest = report.manifest
        rows.append({"name": name, "step": report.step, "status": "complete" if report.ok else "incomplete",
                     "bytes": manifest.total_bytes if manifest else None,
                     "files": len(manifest.files) if manifest else None,
                     "created_at": manifest.created_at if manifest else None, "problems": report.problems})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'CHECKPOINT':<22} {'STATUS':<11} {'SIZE_MB':>9} {'FILES':>5}  CREATED")
        for row in rows:
            size = f"{row['bytes'] / 1e6:.1f}" if row["bytes"] is not None else "-"
            print(f"{row['name']:<22} {row['status']:<11} {size:>9} {row['files'] or '-':>5}  {row['created_at'] or '-'}")
        progress = Path(storage.root) / PROGRESS_NAME
        if progress.exists():
            data = ProgressRecord.from_json(progress.read_bytes())
            print(f"progress: step={data.step} last_committed_step={data.last_committed_step} "
                  f"updated_at={data.updated_at}")
    return EXIT_OK if rows else EXIT_NOTHING


def verify_checkpoints(args: argparse.Namespace) -> int:
    """Check every file of every checkpoint against its manifest (sizes and checksums)."""
    from ckpt_engine.manifest import verify_checkpoint

    storage, names = _locate(args.dir)
    if not names:
        print(f"no checkpoint-<step> directories under {args.dir}", file=sys.stderr)
        return EXIT_NOTHING
    status = EXIT_OK
    for name in names:
        report = verify_checkpoint(storage, name)
        if report.ok:
            print(f"OK       {name} ({len(report.manifest.files) if report.manifest else 0} files)")
        else:
            status = EXIT_CORRUPT
            print(f"CORRUPT  {name}: {'; '.join(report.problems)}")
    return status


def write_vendor(args: argparse.Namespace) -> int:
    """Lay out a CHECKPOINT_VENDOR directory."""
    from ckpt_engine.vendor import write_vendor_dir

    path = write_vendor_dir(args.dir)
    print(f"vendor directory ready: {path} (use PYTHONPATH={path}); contains ckpt_engine/ and datastates/")
    return EXIT_OK


def register_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``ckpt ls DIR`` and ``ckpt verify DIR``; each sets ``func(args) -> exit code``."""
    ckpt = subparsers.add_parser("ckpt", help="list and verify concurrent checkpoints")
    commands = ckpt.add_subparsers(dest="ckpt_command", required=True)
    ls = commands.add_parser("ls", help="list checkpoints (manifest and sizes)")
    ls.add_argument("dir", help="checkpoint root, output_dir, or one checkpoint-<step> directory")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=list_checkpoints)
    verify = commands.add_parser("verify", help="verify sizes and checksums against each manifest")
    verify.add_argument("dir", help="checkpoint root, output_dir, or one checkpoint-<step> directory")
    verify.set_defaults(func=verify_checkpoints)
    return ckpt


def register_vendor_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``vendor DIR``, which lays out a CHECKPOINT_VENDOR directory."""
    vendor = subparsers.add_parser("vendor", help=f"lay out a {VENDOR_ENV} directory (PYTHONPATH=DIR)")
    vendor.add_argument("dir", help="destination directory")
    vendor.set_defaults(func=write_vendor)
    return vendor


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m ckpt_engine.cli ckpt ls DIR``."""
    parser = argparse.ArgumentParser(prog="ckpt_engine", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    register_cli(subparsers)
    register_vendor_cli(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
