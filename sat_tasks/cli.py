"""The `sat` command: validate specs, run a Training Job end to end, and the engine/debug tools."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from sat_tasks.paths import PROJECT_ROOT

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
# Modules that add their own subcommands with register_cli(subparsers) (and friends).
PLUGGED_COMMANDS = (
    ("sat_tasks.classify", "register_cli"),
    ("sat_tasks.k8s", "register_cli"),
    ("ckpt_engine.cli", "register_cli"),
    ("ckpt_engine.cli", "register_vendor_cli"),
)


def configure_airflow_env() -> None:
    """Point Airflow at the project's config and a project-local AIRFLOW_HOME (unless already set)."""
    os.environ.setdefault("AIRFLOW_HOME", str(PROJECT_ROOT / ".airflow"))
    os.environ.setdefault("AIRFLOW_CONFIG", str(PROJECT_ROOT / "airflow.cfg"))
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)


def ensure_metadata_db() -> None:
    """Create or migrate the Airflow metadata DB (SQLite by default); quick when up to date."""
    db = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    stamp = Path(os.environ["AIRFLOW_HOME"]) / ".migrated"
    if db.exists() and stamp.exists():
        return
    print("[sat] preparing the Airflow metadata DB (first run only) ...", flush=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    stamp.touch()


# ---- validate --------------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    """`sat validate FILE...`: 0 when every spec is valid, 2 otherwise; one line per problem."""
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
            if not args.quiet:
                print(f"{path}: ok ({job.name}, {job.learning_type.value}, {job.framework.value})")
    return status


# ---- run -------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """`sat run FILE`: run one job spec end to end on the local backend; exit 0 only for Completed."""
    from sat_tasks.spec import SpecError, load_spec

    try:
        job = load_spec(args.file)
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{args.file}: {problem.field}: {problem.rule}")
        return EXIT_INVALID
    report = run_job(job, Path(args.file), quiet=args.quiet)
    return EXIT_OK if report and report.get("status") == "Completed" else EXIT_FAILED


def run_job(job, spec_path: Path | None, *, quiet: bool = False) -> dict | None:
    """Run `job` through its DAG with dag.test(), on an embedded S3 server unless one is configured.

    `quiet` keeps the task logs off the console (only warnings, errors and the summary).
    """
    configure_airflow_env()
    if quiet and "airflow" not in sys.modules:
        os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"  # read when Airflow configures logging
    os.environ.setdefault("AIRFLOW__SAT__BACKEND", "local")
    ensure_metadata_db()
    from sat_tasks.local_s3 import LocalS3Server, seed_demo_bucket

    server = None
    if "AIRFLOW_CONN_SAT_OBJECT_STORAGE" not in os.environ:
        server = LocalS3Server().start()
        os.environ.update(server.connection_env())
        print(f"[sat] embedded Object Storage (moto S3) on {server.endpoint_url}", flush=True)
    try:
        from sat_tasks.storage import object_storage_hook

        hook = object_storage_hook()
        seeded = seed_demo_bucket(hook)
        print(f"[sat] seeded s3://sat-demo with {len(seeded)} objects (corpus and scripts)", flush=True)
        dag, conf = _dag_for(job, spec_path)
        started = time.monotonic()
        dag_run = dag.test(run_conf=conf)
        report = _read_report(hook, job, dag_run.run_id)
        _print_summary(report, dag_run.run_id, time.monotonic() - started)
        return report
    finally:
        if server is not None:
            server.stop()


def _dag_for(job, spec_path: Path | None):
    """The job's own DAG when its spec is one of include/jobs, else the generic DAG with the form filled."""
    from airflow.dag_processing.dagbag import DagBag

    from sat_tasks.dag_factory import GENERIC_DAG_ID, params_from_spec
    from sat_tasks.paths import sat_setting
    from sat_tasks.spec import dag_id_for

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    jobs_dir = Path(sat_setting("jobs_dir")).resolve()
    if spec_path is not None and spec_path.resolve().parent == jobs_dir and dag_id_for(job) in bag.dags:
        return bag.dags[dag_id_for(job)], None
    return bag.dags[GENERIC_DAG_ID], params_from_spec(job)


def _read_report(hook, job, run_id: str) -> dict | None:
    from sat_tasks.pipeline import JobRun
    from sat_tasks.storage import read_json

    return read_json(hook, JobRun(job, run_id).results_uri + "report.json")


def _print_summary(report: dict | None, run_id: str, seconds: float) -> None:
    from sat_tasks.pipeline import format_report

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


def cmd_demo(args: argparse.Namespace) -> int:
    """`sat demo`: the on-demand example job, end to end, with an injected GPU fault."""
    args.file = str(PROJECT_ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
    return cmd_run(args)


# ---- main ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="sat", description="SAT: Training Jobs as Airflow DAGs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="validate job spec files")
    p.add_argument("files", nargs="+")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("run", help="run one job spec end to end on the local backend")
    p.add_argument("file")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("demo", help="run the demo Training Job end to end")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)
    for module, register in PLUGGED_COMMANDS:
        getattr(importlib.import_module(module), register)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sat` console script."""
    configure_airflow_env()
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
