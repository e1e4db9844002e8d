"""Benchmark: parse time of the whole dags/ folder with 50 generated job specs.

Run: .venv/bin/python tests/benchmarks/bench_dag_parse.py [--specs 50] [--repeat 5]

Side by side in one process: the folder with only the shipped specs (2 jobs + the generic
DAG) against the same folder with N generated specs, so the per-spec cost shows as a
difference, not an absolute time. Airflow's default dagbag_import_timeout is 30 s and a
file is re-parsed every 30 s: the budget that matters.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--specs", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="sat-bench-"))
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    })
    sys.path.insert(0, str(ROOT))
    import yaml
    from airflow.dag_processing.dagbag import DagBag

    base = ROOT / "include" / "jobs"
    many = home / "jobs"
    many.mkdir()
    template = yaml.safe_load((base / "tiny-llama-demo.yaml").read_text())
    for path in base.glob("*.yaml"):
        shutil.copy(path, many / path.name)
    for i in range(args.specs):
        (many / f"gen-{i:03d}.yaml").write_text(yaml.safe_dump({**template, "name": f"generated-job-{i:03d}"}))

    def parse(jobs_dir: Path) -> tuple[float, int]:
        os.environ["AIRFLOW__SAT__JOBS_DIR"] = str(jobs_dir)
        start = time.perf_counter()
        bag = DagBag(dag_folder=str(ROOT / "dags"))
        elapsed = time.perf_counter() - start
        assert not bag.import_errors, bag.import_errors
        return elapsed, len(bag.dags)

    parse(base)  # warm imports
    small, large = [], []
    for _ in range(args.repeat):
        t, n_small = parse(base)
        small.append(t)
        t, n_large = parse(many)
        large.append(t)
    s, l = statistics.median(small), statistics.median(large)
    print(f"shipped specs: {n_small} DAGs parsed in {s:.3f}s (median of {args.repeat})")
    print(f"+{args.specs} specs: {n_large} DAGs parsed in {l:.3f}s (median of {args.repeat})")
    print(f"per generated spec: {(l - s) / args.specs * 1000:.1f} ms; ratio={l / s:.2f}")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
