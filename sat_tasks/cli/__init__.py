"""The `sat` command: one module per command group; each registers its subcommands with `register(subparsers)`.

Building the parser imports no Airflow and no torch: every command imports what it needs
when it runs, so `sat validate`, `sat render`, `sat classify`, `sat schema` and
`sat ckpt ls` start in well under a second (tested with `python -X importtime`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sat_tasks.cli.common import EXIT_INVALID, configure_airflow_env

# Modules that add their own subcommands, and the function that does it.
COMMAND_GROUPS = (
    ("sat_tasks.cli.validate", "register"),
    ("sat_tasks.cli.run", "register"),
    ("sat_tasks.cli.classify", "register"),
    ("sat_tasks.cli.render", "register"),
    ("sat_tasks.cli.report", "register"),
    ("sat_tasks.cli.up", "register"),
    ("sat_tasks.cli.test", "register"),
    ("sat_tasks.cli.workspace", "register"),
    ("sat_tasks.cli.warm_pool", "register"),
    ("sat_tasks.cli.nodes", "register"),
    ("ckpt_engine.cli", "register_cli"),
    ("ckpt_engine.cli", "register_vendor_cli"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="sat", description="SAT: Training Jobs as Airflow DAGs")
    sub = parser.add_subparsers(dest="command", required=True)
    for module, register in COMMAND_GROUPS:
        getattr(importlib.import_module(module), register)(sub)
    return parser


# Commands that refuse to start on an unknown or mistyped `[sat]` key (`sat_tasks.settings`).
CHECK_SETTINGS = frozenset({"up", "validate"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sat` console script."""
    configure_airflow_env()
    args = build_parser().parse_args(argv)
    if args.command in CHECK_SETTINGS:
        from sat_tasks.config import config_file, settings_problems

        problems = settings_problems()
        if problems:
            for line in problems:
                print(line, file=sys.stderr)
            print(f"[sat] fix the [sat] settings above ({config_file()} or AIRFLOW__SAT__* in the environment); "
                  "every setting is in docs/configuration.md", file=sys.stderr)
            return EXIT_INVALID
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
