"""`sat run SPEC` and `sat demo`: run a Training Job end to end here, through its DAG (`dag.test()`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from sat_tasks.cli.common import EXIT_FAILED, EXIT_INVALID, EXIT_OK, configure_airflow_env, ensure_metadata_db
from sat_tasks.config import PROJECT_ROOT

LOG_TAIL_LINES = 30
LOG_TAIL_BYTES = 256 << 10  # the end of a log that carries the training's output, however long it grew


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run one job spec end to end on the local backend")
    p.add_argument("file")
    _output_options(p)
    p.set_defaults(func=cmd_run)
    p = subparsers.add_parser("demo", help="run the demo Training Job end to end")
    _output_options(p)
    p.set_defaults(func=cmd_demo)


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", choices=("host", "container"), default=None,
                        help="where the local backend runs each attempt: `container` (in the job's image, podman; "
                             "`make image` builds SAT's) or `host` (this host's environment; the image is not used). "
                             "Default: [sat] local_runtime, `host` unless configured")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true",
                          help="print only the summary (Airflow's logs still go to their file)")
    loudness.add_argument("-v", "--verbose", action="store_true",
                          help="show Airflow's logs here too, instead of in a file")


def cmd_run(args: argparse.Namespace) -> int:
    """Run one job spec end to end on the local backend; exit 0 only for Completed."""
    from sat_tasks.spec import SpecError, load_spec

    try:
        job = load_spec(args.file)
    except SpecError as exc:
        for problem in exc.problems:
            print(f"{args.file}: {problem.field}: {problem.rule}")
        return EXIT_INVALID
    if getattr(args, "runtime", None):
        os.environ["AIRFLOW__SAT__LOCAL_RUNTIME"] = args.runtime  # the launch task reads it (chosen_runtime)
    report = run_job(job, Path(args.file), quiet=args.quiet, verbose=args.verbose)
    return EXIT_OK if report and report.get("status") == "Completed" else EXIT_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    """The on-demand example job, end to end, with an injected GPU fault."""
    args.file = str(PROJECT_ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
    return cmd_run(args)


def default_log_path(job) -> Path:
    """Where a run's Airflow logs go: `logs/<job>-<UTC time>.log` beside the work dir (`.sat/logs/` here)."""
    from sat_tasks.config import work_dir

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return work_dir().resolve().parent / "logs" / f"{job.name}-{stamp}.log"


def run_job(job, spec_path: Path | None, *, quiet: bool = False, verbose: bool = False,
            airflow_log: Path | None = None) -> dict | None:
    """Run `job` through its DAG with dag.test(), on an embedded S3 server unless one is configured.

    Prints one line per DAG step and status change and the training progress
    (`sat_tasks.cli.progress`), then the summary; Airflow's logs (and everything else written
    to stdout and stderr meanwhile) go to `airflow_log` (default: `default_log_path`), which
    the summary names. `quiet`: the summary only. `verbose`: Airflow's logs on the console
    as they come, and no file.
    """
    from sat_tasks.cli.console import Console, output_to_file

    configure_airflow_env()
    os.environ.setdefault("AIRFLOW__SAT__BACKEND", "local")
    # here, on the host unless `--runtime container` (or the environment) says otherwise: the deployment's
    # `local_runtime = auto` is for the service (`make up`), a `sat run`/`sat demo`/`sat test` is quick on the host
    os.environ.setdefault("AIRFLOW__SAT__LOCAL_RUNTIME", "host")
    log_path = None if verbose else (airflow_log or default_log_path(job))
    output = contextlib.nullcontext(sys.stdout) if log_path is None else output_to_file(log_path)
    with output as stream:
        console = Console(stream, quiet=quiet, live=False if verbose else None)
        try:
            return _run_job(job, spec_path, console, log_path)
        except BaseException:
            if log_path is not None:
                console.summary(f"[sat] the run stopped with an error; Airflow's logs: {log_path}")
            raise


def _run_job(job, spec_path: Path | None, console, log_path: Path | None) -> dict | None:
    ensure_metadata_db(say=console.line)
    from sat_tasks.cli.progress import RunWatcher
    from sat_tasks.io.local_s3 import LocalS3Server, seed_demo_bucket

    server = None
    if "AIRFLOW_CONN_SAT_OBJECT_STORAGE" not in os.environ:
        server = LocalS3Server().start()
        os.environ.update(server.connection_env())
        console.line(f"[sat] embedded Object Storage (moto S3) on {server.endpoint_url}")
    try:
        from sat_tasks.io.object_storage import object_storage_hook, read_json
        from sat_tasks.io.run_layout import JobRun

        hook = object_storage_hook()
        seeded = seed_demo_bucket(hook)
        console.line(f"[sat] seeded s3://sat-demo with {len(seeded)} objects (corpus and scripts)")
        dag, conf = _dag_for(job, spec_path)
        console.line(f"[sat] job {job.name}: running DAG {dag.dag_id} with dag.test()"
                     + (f"; Airflow's logs: {log_path}" if log_path else ""))
        hook.get_conn()  # made here: the watcher's thread shares the client (boto3 clients are thread-safe)
        started = time.monotonic()
        with RunWatcher(job, hook, console, dag_id=dag.dag_id).watching():
            dag_run = dag.test(run_conf=conf)
        report = read_json(hook, JobRun.of(job, dag.dag_id, dag_run.run_id).report_uri)  # as validate_spec recorded
        _print_summary(console, report, dag_run.run_id, time.monotonic() - started, log_path)
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


def _print_summary(console, report: dict | None, run_id: str, seconds: float, log_path: Path | None) -> None:
    from sat_tasks.pipeline.report import format_report

    console.summary("")
    console.summary("=" * 78)
    if report is None:
        console.summary(f"run {run_id}: no job report was written (the spec or Object Storage failed early)")
        tail = _log_tail(log_path)
        if tail:
            console.summary(f"  the last {len(tail)} lines of Airflow's logs:")
        for line in tail:
            console.summary(f"    | {line}")
    else:
        for line in format_report(report):
            console.summary(line)
        console.summary(f"  wall time: {seconds:.0f}s")
    if log_path is not None:
        console.summary(f"  Airflow's logs: {log_path}")
    console.summary("=" * 78)


def _log_tail(log_path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The end of Airflow's logs (a run without a report: where it broke)."""
    from sat_tasks.core.bounded import tail_lines

    if log_path is None or not log_path.is_file():
        return []
    return tail_lines(log_path, LOG_TAIL_BYTES)[0][-lines:]
