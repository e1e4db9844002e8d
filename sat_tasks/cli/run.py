"""`sat run SPEC` and `sat demo`: run a Training Job end to end here, through its DAG (`dag.test()`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sat_tasks.cli.common import EXIT_FAILED, EXIT_INVALID, EXIT_OK, configure_airflow_env, ensure_metadata_db
from sat_tasks.config import PROJECT_ROOT


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one job spec end to end on the local backend")
    p.add_argument("file")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_run)
    p = subparsers.add_parser("demo", help="run the demo Training Job end to end")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)


def cmd_run(args: argparse.Namespace) -> int:
    """Run one job spec end to end on the local backend; exit 0 only for Completed."""
    from sat_tasks.spec import SpecError, load_spec

    try:
        job = load_spec(args.file)
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{args.file}: {problem.field}: {problem.rule}")
        return EXIT_INVALID
    report = run_job(job, Path(args.file), quiet=args.quiet)
    return EXIT_OK if report and report.get("status") == "Completed" else EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    """The on-demand example job, end to end, with an injected GPU fault."""
    args.file = str(PROJECT_ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
    return cmd_run(args)


def run_job(job, spec_path: Path | None, *, quiet: bool = False) -> dict | None:
    """Run `job` through its DAG with dag.test(), on an embedded S3 server unless one is configured.

    `quiet` keeps the task logs off the console (only warnings, errors and the summary).
    """
    configure_airflow_env()
    if quiet and "airflow" not in sys.modules:
        os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"  # read when Airflow configures logging
    os.environ.setdefault("AIRFLOW__SAT__BACKEND", "local")
    ensure_metadata_db()
    from sat_tasks.io.local_s3 import LocalS3Server, seed_demo_bucket

    server = None
    if "AIRFLOW_CONN_SAT_OBJECT_STORAGE" not in os.environ:
        server = LocalS3Server().start()
        os.environ.update(server.connection_env())
        print(f"[sat] embedded Object Storage (moto S3) on {server.endpoint_url}", flush=True)
    try:
        from sat_tasks.io.object_storage import object_storage_hook, read_json
        from sat_tasks.io.run_layout import JobRun

        hook = object_storage_hook()
        seeded = seed_demo_bucket(hook)
        print(f"[sat] seeded s3://sat-demo with {len(seeded)} objects (corpus and scripts)", flush=True)
        dag, conf = _dag_for(job, spec_path)
        started = time.monotonic()
        dag_run = dag.test(run_conf=conf)
        report = read_json(hook, JobRun(job, dag_run.run_id).report_uri)
        _print_summary(report, dag_run.run_id, time.monotonic() - started)
        return report
    finally:
        if server is not None:
            server.stop()


def _dag_for(job, spec_path: Path | None):
    """The job's own DAG when its spec is one of include/jobs, else the generic DAG with the form filled."""
    from airflow.dag_processing.dagbag import DagBag

    from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.config import sat_setting
    from sat_tasks.spec import dag_id_for

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    jobs_dir = Path(sat_setting("jobs_dir")).resolve()
    if spec_path is not None and spec_path.resolve().parent == jobs_dir and dag_id_for(job) in bag.dags:
        return bag.dags[dag_id_for(job)], None
    return bag.dags[GENERIC_DAG_ID], params_from_spec(job)


def _print_summary(report: dict | None, run_id: str, seconds: float) -> None:
    from sat_tasks.pipeline.report import format_report

    print("")
    print("=" * 78)
    if report is None:
        print(f"run {run_id}: no job report was written (the spec or Object Storage failed early)")
        print("=" * 78)
        return
    for line in format_report(report):
        print(line)
    print(f"  wall time: {seconds:.0f}s")
    print("=" * 78)
