"""`sat validate FILE...` and `sat schema`: check job specs; print the Training Job's JSON Schema."""

from __future__ import annotations

import argparse
import json

from sat_tasks.cli.common import EXIT_INVALID, EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="validate job spec files",
                              description="Exit 0 when every spec is valid, 2 otherwise; "
                                          "one `<file>: <field>: <rule>` line per problem.")
    p.add_argument("files", nargs="+")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    p.set_defaults(func=cmd_validate)
    p = subparsers.add_parser("schema", help="print the Training Job JSON Schema (for editors and CI)",
                              description="The JSON Schema (draft 2020-12) every job spec follows; point an "
                                          "editor's YAML language server at it to check specs as you type.")
    p.add_argument("--indent", type=int, default=2)
    p.set_defaults(func=cmd_schema)


def cmd_validate(args: argparse.Namespace) -> int:
    """0 when every spec is valid, 2 otherwise; one line per problem."""
    from sat_tasks.spec import SpecError, load_spec

    status = EXIT_OK
    for path in args.files:
        try:
            job = load_spec(path)
        except SpecError as exc:
            for problem in exc.problems:
                print(f"{path}: {problem.field}: {problem.rule}")
            status = EXIT_INVALID
        else:
            refused = _backend_problems(job) + _workspace_problems(job)
            for problem in refused:
                print(f"{path}: {problem.field}: {problem.rule}")
            if refused:
                status = EXIT_INVALID
            elif not args.quiet:
                print(f"{path}: ok ({job.name}, {job.learning_type.value}, {job.framework.value})")
    return status


def _backend_problems(job) -> list:
    """The spec's backend when this deployment does not allow it (`[sat] allowed_backends`, ADR 0019)."""
    from sat_tasks.config import allowed_backends
    from sat_tasks.spec import SpecProblem
    from sat_tasks.spec.model import backend_problem

    problem = backend_problem(job, allowed_backends())
    return [] if problem is None else [SpecProblem(field="backend", rule=problem.split(": ", 1)[1])]


def _workspace_problems(job) -> list:
    """What the job's workspace refuses (nodes, allocation, contract dates today); none without a workspace."""
    if job.workspace is None:
        return []
    import datetime as dt

    from sat_tasks.core.workspaces import job_problems
    from sat_tasks.io.workspaces import WorkspaceStore

    store = WorkspaceStore()
    return job_problems(job, store.find(job.workspace), dt.datetime.now(dt.UTC).date(),
                        [w.name for w in store.list()])


def cmd_schema(args: argparse.Namespace) -> int:
    from sat_tasks.spec import job_schema

    print(json.dumps(job_schema(), indent=args.indent))
    return EXIT_OK
