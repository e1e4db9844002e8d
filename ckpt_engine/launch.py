"""Run a training script under torchrun the way the ``deepspeed`` launcher runs it: ``--local_rank=<n>`` first.

SAT launches multi-node DeepSpeed jobs with torchrun, not with the ``deepspeed``
launcher: after SIGTERM (a Spot notice) torchrun waits ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
for its workers, which SAT sizes to the final checkpoint's grace period, while
``deepspeed.launcher.launch`` SIGKILLs them after a hard-coded 30 s (ADR 0007). Scripts
written for the ``deepspeed`` launcher read ``--local_rank`` from their arguments
(``DecoratedCheckpointing(..., rank=args.local_rank)``); torchrun only sets
``LOCAL_RANK`` in the environment, so this module puts the argument where the
``deepspeed`` launcher puts it, before the script's own arguments, and runs the script
as ``__main__``::

    torchrun --nnodes=... -m ckpt_engine.launch train.py --deepspeed ds.json
    torchrun --nnodes=... -m ckpt_engine.launch -m pkg.train --deepspeed ds.json

It ships in the CHECKPOINT_VENDOR directory with the engine (``PYTHONPATH`` alone finds it).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from ckpt_engine.signals import finish_process_group

USAGE = "usage: python -m ckpt_engine.launch (SCRIPT | -m MODULE) [ARGS ...]"


def script_argv(argv: Sequence[str], local_rank: str | None) -> tuple[str, bool, list[str]]:
    """(script or module, whether a module, its ``sys.argv``) for ``argv``, ``--local_rank`` first when known."""
    args = list(argv)
    module = bool(args) and args[0] == "-m"
    if module:
        args = args[1:]
    if not args or (not module and args[0].startswith("-")):
        raise SystemExit(USAGE)
    target, rest = args[0], args[1:]
    rank = [f"--local_rank={local_rank}"] if local_rank not in (None, "") else []
    return target, module, [target, *rank, *rest]


def main(argv: Sequence[str] | None = None) -> None:
    """Set ``sys.argv`` as the ``deepspeed`` launcher would and run the script or module as ``__main__``."""
    target, module, sys.argv = script_argv(sys.argv[1:] if argv is None else argv, os.environ.get("LOCAL_RANK"))
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python script.py` does
        runpy.run_path(target, run_name="__main__")
    finish_process_group()


if __name__ == "__main__":
    main()
