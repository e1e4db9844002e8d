"""Run an Airflow component that forks its work (the scheduler, the DAG processor) with SAT's modules imported first.

    python -m sat_tasks.service.preload scheduler
    python -m sat_tasks.service.preload dag-processor

The scheduler's LocalExecutor forks its workers when it starts, and each worker forks a process per task;
the DAG processor forks a process per DAG file it parses. A forked process inherits its parent's modules.
Started by `airflow scheduler` alone, every SAT task process imported SAT's DAG-building and task modules,
boto3/botocore and the Amazon provider's S3 hook itself (about 0.3 s of a task's start on a quiet machine,
more under load), and every parse of a SAT DAG file imported the job model again, every 30 s per file.
With them imported once in the parent, a task or a parse starts with them loaded. A failover crosses four
task starts (launch -> classify -> decide -> the next launch): ADR 0011's addendum has the measurements.

What the parent does is import: no DAG file is parsed, no connection or client is made, no thread
started (a fork keeps only the forking thread). A change to SAT's code takes effect when the service
restarts (`make down && make up`), as a change to Airflow's does.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence

#: Imported before the component starts: what a SAT task process and a SAT DAG file import besides Airflow.
PRELOADED: tuple[str, ...] = (
    "sat_tasks.airflow.dag_factory",     # the generic DAG's file and every job DAG: the DAG's tasks
    "sat_tasks.airflow.params",          # the generic DAG's form
    "sat_tasks.airflow.job_dag_file",    # the job DAG shard files: the specs, the parse budget
    "sat_tasks.pipeline.steps",          # what the tasks run, and what their steps import when they run:
    "sat_tasks.classify",                # classify
    "sat_tasks.io.node_ledger",          # classify, decide
    "sat_tasks.io.metrics",              # decide, finalize
    "sat_tasks.io.registry",             # check_image
    "sat_tasks.io.staging",              # stage
    "sat_tasks.io.warm_pool",
    "sat_tasks.io.workspaces",
    "sat_tasks.io.object_storage",       # Object Storage through the provider's S3Hook
    "airflow.providers.amazon.aws.hooks.s3",
    "boto3",
)

#: The components whose forked processes inherit the preload (the API server and the triggerer fork nothing).
FORKING_COMPONENTS = ("scheduler", "dag-processor")


def preload(modules: Sequence[str] = PRELOADED) -> tuple[float, list[str]]:
    """Import `modules` and the configured backend (`[sat] backend`, with the installed backends' entry points)
    with the modules its tasks import; (the seconds it took, what could not be imported and why).

    What fails to import is left to the tasks that need it, which fail with the error where a person looks
    (their task log): the scheduler still starts, and so do the DAGs that do not need it.
    """
    started, failed = time.perf_counter(), []

    def load(name: str) -> None:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import error: the scheduler must start all the same
            failed.append(f"{name}: {type(exc).__name__}: {exc}")

    for name in modules:
        load(name)
    try:
        from sat_tasks.backends import backend_for

        backend = backend_for(None)  # the generic DAG's and most specs' backend, and the modules its tasks import
    except Exception as exc:  # noqa: BLE001 - a [sat] backend that is not installed: its tasks say so
        failed.append(f"the configured backend: {type(exc).__name__}: {exc}")
    else:
        for name in getattr(backend, "task_modules", ()):
            load(name)
    return time.perf_counter() - started, failed


def main(argv: Sequence[str] | None = None) -> None:
    """Import `PRELOADED`, then run `airflow <argv>` in this process (as `python -m airflow` does)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in FORKING_COMPONENTS:
        raise SystemExit(f"usage: python -m sat_tasks.service.preload {{{'|'.join(FORKING_COMPONENTS)}}} [ARGS ...]")
    seconds, failed = preload()
    print(f"[sat] {args[0]}: SAT's task modules imported in {seconds:.2f}s before Airflow forks its processes",
          file=sys.stderr, flush=True)
    for problem in failed:
        print(f"[sat] {args[0]}: not preloaded (its tasks import it themselves): {problem}", file=sys.stderr,
              flush=True)
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", *args]
    airflow_main()


if __name__ == "__main__":
    main()
