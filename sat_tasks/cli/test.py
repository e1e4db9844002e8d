"""`sat test [PATHS]`: test Training Job specs (DAG integrity, a short run, failure rehearsals) through pytest.

The same tests as SAT's pytest plugin (`sat_tasks.testing.plugin`) generates in a
repository that sets `sat_specs`, for people who do not run pytest themselves. The plugin
is loaded by name (`-p`), so this module imports neither it nor pytest until it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ckpt_engine.contract import MAX_STEPS_ENV, SAVE_STEPS_ENV

PLUGIN = "sat_tasks.testing.plugin"
SPEC_SUFFIXES = (".yaml", ".yml")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "test", help="test job specs: DAG integrity, a short local run, failure rehearsals (pytest)",
        description="For every spec under PATHS (folders or files; default: the pytest configuration's "
                    "sat_specs): a DAG integrity test, a smoke run on the local backend made short by the "
                    "spec's `test:` section, and one run per `test.rehearse` scenario. Exit status: pytest's "
                    "(0 all passed, 1 some failed, 2 interrupted, 4 usage error, 5 nothing collected).")
    p.add_argument("paths", nargs="*", metavar="PATHS", help="spec folders or files (and test files)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR (pytest -k), "
                                                               "e.g. 'smoke' or 'not rehearse'")
    p.add_argument("-m", dest="markexpr", metavar="MARKEXPR",
                   help="only tests with these markers: sat_integrity, sat_smoke, sat_rehearsal")
    p.add_argument("--junitxml", metavar="FILE", help="write a JUnit XML report for CI")
    p.add_argument("--max-steps", type=int, metavar="N", help=f"{MAX_STEPS_ENV} for every run (wins over test.max_steps)")
    p.add_argument("--save-steps", type=int, metavar="K", help=f"a checkpoint every K steps ({SAVE_STEPS_ENV})")
    p.add_argument("--data-sample", type=int, metavar="N", help="runs read only the first N data objects")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("-q", "--quiet", action="store_true", help="less output")
    p.set_defaults(func=cmd_test)


def pytest_args(args: argparse.Namespace) -> list[str]:
    """The pytest command line that `sat test` runs."""
    argv = ["-p", PLUGIN, "-p", "no:cacheprovider", "-rfE"]
    for path in args.paths:
        if Path(path).is_dir() or Path(path).suffix in SPEC_SUFFIXES:
            argv += ["--sat-specs", path]
    for option, value in (("-k", args.keyword), ("-m", args.markexpr), ("--junitxml", args.junitxml),
                          ("--sat-max-steps", args.max_steps), ("--sat-save-steps", args.save_steps),
                          ("--sat-data-sample", args.data_sample)):
        if value is not None:
            argv += [option, str(value)]
    if args.exitfirst:
        argv.append("-x")
    if args.quiet:
        argv.append("-q")
    return argv + list(args.paths)


def cmd_test(args: argparse.Namespace) -> int:
    """Run the generated tests (and any test files named) with pytest; return pytest's exit status."""
    import pytest

    return int(pytest.main(pytest_args(args)))
