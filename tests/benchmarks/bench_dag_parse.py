"""Benchmark: each DAG file parsed as the DAG processor parses it, against its real time limits, up to 5,000 specs.

Run: .venv/bin/python tests/benchmarks/bench_dag_parse.py [--specs 0,500,2000,5000] [--root DIR]

For each size, a jobs directory holds the shipped specs plus N generated ones (on-demand and
Spot alternately). Each file of the DAGs folder is then parsed one at a time in a child forked
from a parent that has imported Airflow (as the processor's manager forks its children): the
same steps as `airflow.dag_processing.processor._parse_file` (stability check, BundleDagBag
import under `[core] dagbag_import_timeout`, serialization of every DAG, the result message),
timed apart, and the child is killed at `[dag_processor] dag_file_processor_timeout` as the
manager kills it. A killed file counts none of its DAGs and no import error: what the
processor records. `--root` takes `dags/`, `sat_tasks/` and `airflow.cfg` from another tree
(e.g. an older commit unpacked with `git archive`), for a before/after in one run.

The last line: `specs=<N> files=<n> dags=<built>/<expected> killed=<k> slowest_s=<x> limit_s=<y>
pass_wall_s=<sum> pass_cpu_s=<sum> cpu_ms_per_dag=<ms>` for the largest size (`cpu_s`: each child's own
CPU time, user and system, which a shared machine's load inflates far less than its wall time). The machine may be shared: read ratios, not absolutes.

`--processor` runs the real `airflow dag-processor` instead, as `make up` would (a fresh
AIRFLOW_HOME migrated on SQLite in write-ahead mode, the tree's airflow.cfg, its `dags/` as the
DAGs folder, `[dag_processor] parsing_processes` as configured): `--runs` passes of
`airflow dag-processor --num-runs 1`, each a new manager that queues every file at once. After
each pass it reads what a person would find: the DAGs serialized and active in the metadata DB,
the import errors recorded (first line of each), the files the manager killed (its "Killing it!"
log line), the pass's wall time from the manager's log (first file queued to "Exiting dag
parsing loop"; `start_s` is the start-up before it), the parse budget's skip reports, and the
load average. A second pass shows what `sat_job_spec_errors.py` says about the first one's
skips (it may parse before the job files within a pass): each pass is a new manager, so what it
says comes from the reports kept in the metadata DB, as a restarted processor's would. The last line:
`specs=<N> passes=<r> dags=<serialized>/<expected> active=<n> import_errors=<e> killed=<k>
skipped=<s> slowest_s=<f> pass_s=<x> start_s=<y> cpu_s=<c> load1=<l>` for the largest size's last pass
(`slowest_s`: the longest "Last Duration" of the manager's last stats table, against the
processor timeout; `--keep` keeps the logs to read).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FileParse:
    """One DAG file's parse: seconds per step, DAGs serialized, import errors, and whether it was killed."""

    file: str
    import_s: float = 0.0
    serialize_s: float = 0.0
    message_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the child's own CPU (user + system): what a loaded machine does not inflate
    dags: int = 0
    import_errors: int = 0
    killed: bool = False
    error: str = ""


def _parse_in_child(file: str, dags_folder: str, conn) -> None:
    """The processor child's work on one file (same calls as processor._parse_file), timed step by step."""
    import structlog
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.dag_processing.processor import DagFileParsingResult, _serialize_dags
    from airflow.utils.dag_version_inflation_checker import check_dag_file_stability

    quiet = os.open(os.devnull, os.O_WRONLY)  # the processor sends a child's output to the file's log
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    log = structlog.get_logger(logger_name="bench")
    out = {}
    cpu = time.process_time()
    start = time.perf_counter()
    check_dag_file_stability(file)
    bag = BundleDagBag(dag_folder=file, bundle_path=Path(dags_folder), bundle_name="dags-folder",
                       load_op_links=False)
    out["import_s"] = time.perf_counter() - start
    start = time.perf_counter()
    serialized, errors = _serialize_dags(bag, log)
    bag.import_errors.update(errors)
    out["serialize_s"] = time.perf_counter() - start
    start = time.perf_counter()
    message = DagFileParsingResult(fileloc=file, serialized_dags=serialized, import_errors=bag.import_errors)
    message.model_dump_json()
    out["message_s"] = time.perf_counter() - start
    out["cpu_s"] = time.process_time() - cpu
    out["dags"] = len(serialized)
    out["import_errors"] = len(bag.import_errors)
    out["error"] = "\n".join(bag.import_errors.values())[-3000:]
    conn.send(out)
    conn.close()


def parse_file(file: Path, dags_folder: Path, kill_after: float) -> FileParse:
    """Parse one file in a forked child; kill it after `kill_after` seconds as the manager does."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    proc = ctx.Process(target=_parse_in_child, args=(str(file), str(dags_folder), child))
    proc.start()
    child.close()
    result = FileParse(file.name)
    if parent.poll(kill_after):
        try:
            for key, value in parent.recv().items():
                setattr(result, key, value)
        except EOFError:
            result.error = "the child died without a result"
    else:
        proc.kill()
        result.killed = True
    proc.join()
    result.wall_s = time.perf_counter() - start
    return result


def write_specs(jobs: Path, count: int, shipped: Path) -> None:
    """The shipped specs plus `count` generated ones, on-demand and Spot alternately."""
    import yaml

    jobs.mkdir(parents=True, exist_ok=True)
    templates = [yaml.safe_load(path.read_text()) for path in sorted(shipped.glob("*.yaml"))]
    for path in shipped.glob("*.yaml"):
        shutil.copy(path, jobs / path.name)
    for i in range(count):
        spec = {**templates[i % len(templates)], "name": f"generated-job-{i:05d}"}
        (jobs / f"generated-job-{i:05d}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def _gist(error: str) -> str:
    """The line of an import error (or its traceback) that says what happened."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    said = [line for line in lines if "stopped after" in line or "are invalid" in line or "Error" in line[:40]]
    return (said or lines or ["?"])[0][:90]


def run_forked(count: int, dags_folder: Path, home: Path, kill_limit: float) -> str:
    """Each file of `dags_folder` parsed in a forked child over `count` generated specs; prints the table."""
    import structlog
    from airflow.dag_processing.processor import (
        _pre_import_airflow_modules,  # the manager has this module
    )

    jobs = home / f"jobs-{count}"
    write_specs(jobs, count, ROOT / "include" / "jobs")
    os.environ["AIRFLOW__SAT__JOBS_DIR"] = str(jobs)
    expected = count + len(list((ROOT / "include" / "jobs").glob("*.yaml"))) + 1  # + the generic DAG
    rows = []
    for file in sorted(dags_folder.glob("*.py")):
        _pre_import_airflow_modules(str(file), structlog.get_logger())  # as the manager does before it forks
        rows.append(parse_file(file, dags_folder, kill_limit))
    print(f"\n{count} generated specs ({expected} DAGs expected):")
    print(f"  {'file':28} {'dags':>5} {'errors':>6} {'import_s':>9} {'serialize_s':>11} {'message_s':>9} "
          f"{'wall_s':>7} {'cpu_s':>6}  verdict")
    for row in rows:
        verdict = ("KILLED: nothing recorded" if row.killed else
                   f"import error: {_gist(row.error)}" if row.import_errors else "ok")
        print(f"  {row.file:28} {row.dags:5d} {row.import_errors:6d} {row.import_s:9.2f} {row.serialize_s:11.2f} "
              f"{row.message_s:9.2f} {row.wall_s:7.2f} {row.cpu_s:6.2f}  {verdict}")
    built = sum(row.dags for row in rows)
    slowest = max(rows, key=lambda row: row.wall_s)
    summary = (f"specs={count} files={len(rows)} dags={built}/{expected} killed={sum(r.killed for r in rows)} "
               f"slowest_s={slowest.wall_s:.2f} limit_s={kill_limit:g} "
               f"pass_wall_s={sum(row.wall_s for row in rows):.1f} pass_cpu_s={sum(row.cpu_s for row in rows):.1f} "
               f"cpu_ms_per_dag={1000 * sum(row.cpu_s for row in rows) / max(built, 1):.1f}")
    print(f"  {summary} (slowest: {slowest.file})")
    return summary


# The DAG processor manager's log lines that bound a pass, and the one it writes when it kills a file's parse.
_QUEUED = re.compile(r"^(\S+) .*Adding \d+ new files to the front of the queue", re.MULTILINE)
_EXITED = re.compile(r"^(\S+) .*Exiting dag parsing loop", re.MULTILINE)
_KILLED = re.compile(r"Processor for (.+?) with PID \d+ has been running for [\d.]+ seconds, exceeding the timeout")
# A row of the manager's "DAG File Processing Stats" table (every `print_stats_interval`): file, DAGs, errors,
# Last Duration.
_STATS_ROW = re.compile(r"^\S+\s+(\S+\.py)\s.*?\s(\d+)\s+(\d+)\s+([\d.]+)s\s+\d{4}-\d\d-\d\dT", re.MULTILINE)


@dataclass
class ProcessorPass:
    """What one `airflow dag-processor --num-runs 1` left: in its log, in the metadata DB, in the skip reports."""

    wall_s: float
    start_s: float
    pass_s: float
    serialized: int
    active: int
    import_errors: dict[str, str]  # DAG file -> the first line of what it raised
    killed: list[str]
    reports: list  # parse_budget.SkipReport of the job DAG files (and the errors file)
    load1: float
    durations: dict[str, float]  # DAG file -> its last parse's seconds, from the manager's last stats table
    cpu_s: float = 0.0  # CPU of the whole `airflow dag-processor` run: start-up, manager, every parsing child


def _children_cpu() -> float:
    """CPU seconds (user + system) of the child processes waited for so far: the processor, its manager's children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _log_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


# The skip reports the pass kept in the metadata DB (Airflow Variables), read as Airflow reads them (decrypted).
_READ_REPORTS = """
import json, sys
from airflow.models.variable import Variable
from airflow.utils.session import create_session
from sqlalchemy import select
from sat_tasks.airflow.parse_budget import VARIABLE_PREFIX
with create_session() as session:
    rows = session.scalars(select(Variable).where(Variable.key.startswith(VARIABLE_PREFIX)))
    print(json.dumps({row.key: row.val for row in rows}))
"""


def kept_reports(env: dict[str, str], jobs: Path) -> list:
    """The `parse_budget.SkipReport`s of `jobs` kept in the metadata DB that `env` names."""
    from sat_tasks.airflow.parse_budget import InProcess, read_reports

    done = subprocess.run([sys.executable, "-c", _READ_REPORTS], env=env, capture_output=True, text=True,
                          check=True, timeout=600)
    store = InProcess()
    store.values = json.loads(done.stdout.strip().splitlines()[-1])
    return read_reports(jobs, store=store)


def processor_pass(env: dict[str, str], jobs: Path, db: Path, log_path: Path) -> ProcessorPass:
    """Run one pass of the real DAG processor over every file, then read what it recorded."""
    started = time.time()
    cpu = _children_cpu()
    with log_path.open("w") as out:
        subprocess.run([sys.executable, "-m", "airflow", "dag-processor", "--num-runs", "1"], env=env,
                       stdout=out, stderr=subprocess.STDOUT, check=True, timeout=3600)
    wall = time.time() - started
    cpu = _children_cpu() - cpu
    text = log_path.read_text(errors="replace")
    queued, exited = _QUEUED.search(text), _EXITED.search(text)
    if queued is None or exited is None:
        raise RuntimeError(f"{log_path}: no queued-files or exit line from the DAG processor")
    killed = [(re.findall(r"[\w.-]+\.py", what) or [what])[-1] for what in _KILLED.findall(text)]
    last_table = text.rsplit("DAG File Processing Stats", 1)[-1].split("=" * 40, 1)[0]
    durations = {file: float(seconds) for file, _dags, _errors, seconds in _STATS_ROW.findall(last_table)}
    with sqlite3.connect(db) as connection:
        serialized = connection.execute("SELECT count(DISTINCT dag_id) FROM serialized_dag").fetchone()[0]
        active = connection.execute("SELECT count(*) FROM dag WHERE NOT is_stale").fetchone()[0]
        errors = {Path(name).name: _gist(trace or "") for name, trace in
                  connection.execute("SELECT filename, stacktrace FROM import_error ORDER BY filename")}
    return ProcessorPass(wall_s=wall, start_s=_log_time(queued.group(1)) - started,
                         pass_s=_log_time(exited.group(1)) - _log_time(queued.group(1)), serialized=serialized,
                         active=active, import_errors=errors, killed=killed, reports=kept_reports(env, jobs),
                         load1=os.getloadavg()[0], durations=durations, cpu_s=cpu)


def run_processor(count: int, root: Path, home: Path, runs: int) -> str:
    """`runs` passes of `airflow dag-processor` over `count` generated specs on a fresh metadata DB; prints each."""
    from sat_tasks.service.sqlite import use_wal

    jobs = home / f"jobs-{count}"
    write_specs(jobs, count, ROOT / "include" / "jobs")
    airflow_home = home / f"airflow-{count}"
    airflow_home.mkdir()
    db = airflow_home / "airflow.db"
    env = {**os.environ, "AIRFLOW_HOME": str(airflow_home), "AIRFLOW__SAT__JOBS_DIR": str(jobs),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    use_wal(db)
    expected = count + len(list((ROOT / "include" / "jobs").glob("*.yaml"))) + 1  # + the generic DAG
    print(f"\n{count} generated specs ({expected} DAGs expected), `airflow dag-processor --num-runs 1` x {runs}:")
    summary = ""
    for run in range(1, runs + 1):
        result = processor_pass(env, jobs, db, airflow_home / f"dag-processor-{run}.log")
        skipped = sum(report.left_out for report in result.reports)
        print(f"  pass {run}: wall {result.wall_s:.1f}s (start-up {result.start_s:.1f}s, pass {result.pass_s:.1f}s), "
              f"CPU {result.cpu_s:.1f}s (start-up, manager and children), load average {result.load1:.2f}")
        print(f"    metadata DB: {result.serialized} serialized DAGs, {result.active} active; "
              f"{len(result.import_errors)} import error(s)")
        for file, gist in result.import_errors.items():
            print(f"      {file}: {gist}")
        print(f"    killed by the manager: {', '.join(result.killed) or 'none'}")
        slowest = max(result.durations.items(), key=lambda item: item[1], default=("-", 0.0))
        print(f"    slowest file in the manager's last stats table: {slowest[0]} {slowest[1]:.1f}s "
              f"(of {len(result.durations)} files listed)")
        for report in result.reports:
            print(f"    skip report (metadata DB): {report.lines()[0][:200]}")
        summary = (f"specs={count} passes={run} dags={result.serialized}/{expected} active={result.active} "
                   f"import_errors={len(result.import_errors)} killed={len(result.killed)} skipped={skipped} "
                   f"slowest_s={slowest[1]:.1f} pass_s={result.pass_s:.1f} start_s={result.start_s:.1f} "
                   f"cpu_s={result.cpu_s:.1f} load1={result.load1:.2f}")
        print(f"    {summary}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--specs", default="0,500,2000,5000", help="comma-separated numbers of generated specs")
    parser.add_argument("--root", type=Path, default=ROOT, help="tree whose dags/, sat_tasks/, airflow.cfg to parse")
    parser.add_argument("--processor", action="store_true", help="run the real `airflow dag-processor` instead")
    parser.add_argument("--runs", type=int, default=2, help="with --processor: passes of the processor per size")
    parser.add_argument("--keep", action="store_true", help="keep the specs, AIRFLOW_HOME and logs (path printed)")
    args = parser.parse_args()
    root = args.root.resolve()
    home = Path(tempfile.mkdtemp(prefix="sat-bench-"))
    dags_folder = root / "dags"
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(root / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "GX_ANALYTICS_ENABLED": "false",
    })
    sys.path.insert(0, str(root))
    from airflow.configuration import conf

    import_limit = conf.getfloat("core", "dagbag_import_timeout")
    kill_limit = conf.getfloat("dag_processor", "dag_file_processor_timeout")
    print(f"tree: {root}; [core] dagbag_import_timeout={import_limit:g}s, "
          f"[dag_processor] dag_file_processor_timeout={kill_limit:g}s; {os.cpu_count()} CPUs "
          f"(shared with other work: compare sizes and trees, not absolutes)")
    summary = ""
    for count in [int(n) for n in args.specs.split(",")]:
        summary = (run_processor(count, root, home, args.runs) if args.processor else
                   run_forked(count, dags_folder, home, kill_limit))
    if args.keep:
        print(f"kept: {home} (the processor's log per pass and per DAG file under airflow-<N>/)")
    else:
        shutil.rmtree(home, ignore_errors=True)
    print(summary)


if __name__ == "__main__":
    main()
