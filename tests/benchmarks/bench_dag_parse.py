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
pass_cpu_s=<sum>` for the largest size. The machine may be shared: read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--specs", default="0,500,2000,5000", help="comma-separated numbers of generated specs")
    parser.add_argument("--root", type=Path, default=ROOT, help="tree whose dags/, sat_tasks/, airflow.cfg to parse")
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
    import structlog
    from airflow.configuration import conf
    from airflow.dag_processing.processor import (
        _pre_import_airflow_modules,  # the manager has this module
    )

    import_limit = conf.getfloat("core", "dagbag_import_timeout")
    kill_limit = conf.getfloat("dag_processor", "dag_file_processor_timeout")
    print(f"tree: {root}; [core] dagbag_import_timeout={import_limit:g}s, "
          f"[dag_processor] dag_file_processor_timeout={kill_limit:g}s; {os.cpu_count()} CPUs "
          f"(shared with other work: compare sizes and trees, not absolutes)")
    summary = ""
    for count in [int(n) for n in args.specs.split(",")]:
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
              f"{'wall_s':>7}  verdict")
        for row in rows:
            verdict = ("KILLED: nothing recorded" if row.killed else
                       f"import error: {_gist(row.error)}" if row.import_errors else "ok")
            print(f"  {row.file:28} {row.dags:5d} {row.import_errors:6d} {row.import_s:9.2f} {row.serialize_s:11.2f} "
                  f"{row.message_s:9.2f} {row.wall_s:7.2f}  {verdict}")
        built = sum(row.dags for row in rows)
        slowest = max(rows, key=lambda row: row.wall_s)
        summary = (f"specs={count} files={len(rows)} dags={built}/{expected} killed={sum(r.killed for r in rows)} "
                   f"slowest_s={slowest.wall_s:.2f} limit_s={kill_limit:g} "
                   f"pass_cpu_s={sum(row.wall_s for row in rows):.1f}")
        print(f"  {summary} (slowest: {slowest.file})")
    shutil.rmtree(home, ignore_errors=True)
    print(summary)


if __name__ == "__main__":
    main()
