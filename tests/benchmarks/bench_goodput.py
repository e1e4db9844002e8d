"""Benchmark: goodput and recovery time of a local Training Job with hardware faults at a fixed rate.

Run: .venv/bin/python tests/benchmarks/bench_goodput.py [--steps 2400] [--fault-every 120] [--faults 2]

Side by side in one process, through the real DAG (dag.test, local backend, embedded S3):
1. the tiny-Llama job with no fault;
2. the same job with a GPU fault (Xid 79) every `--fault-every` seconds of training.
goodput = training wall time without faults / with faults (both from the first launch to
the end of training), i.e. the share of the faulty run's time that was productive;
recovery per fault = fault (the killed attempt's end) -> training resumed (the engine's
"Resuming from checkpoint-N" line of the next attempt). Target: goodput >= 0.90 with one
fault per 2 minutes of training.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESUME_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Resuming from checkpoint-(\d+)")


def _setup_env(home: Path) -> None:
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__SAT__WORK_DIR": str(home / "work"), "AIRFLOW__SAT__JOBS_DIR": str(ROOT / "include" / "jobs"),
        "AIRFLOW__SAT__BACKEND": "local", "GX_ANALYTICS_ENABLED": "false",
    })
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    (home / ".migrated").touch()


def _job(name: str, steps: int, faults: list[dict]):
    from sat_tasks.spec import parse_spec

    return parse_spec({
        "name": name, "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "storage": {"script_url": "s3://sat-demo/scripts/train_tiny_llama.py"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": f'python train_tiny_llama.py --data_dir "$SAT_DATA_DIR" --output_dir "$SAT_OUTPUT_DIR" '
                   f"--max_steps {steps} --save_steps 20",
        "faults": faults, "max_failovers": 3, "heartbeat_timeout_seconds": 300,
    })


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--fault-every", type=float, default=120.0)
    parser.add_argument("--faults", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="sat-goodput-"))
    sys.path.insert(0, str(ROOT))
    _setup_env(home)
    from sat_tasks.cli import run_job
    from sat_tasks.local_s3 import LocalS3Server

    with LocalS3Server(process=True) as server:
        os.environ.update(server.connection_env())
        from sat_tasks.storage import object_storage_hook

        hook = object_storage_hook()
        results = {}
        faults = [{"kind": "hardware", "attempt": n, "after_seconds": args.fault_every, "xid": 79}
                  for n in range(1, args.faults + 1)]
        for label, job in (("clean", _job("goodput-clean", args.steps, [])),
                           ("faulty", _job("goodput-faulty", args.steps, faults))):
            report = run_job(job, None, quiet=True)
            assert report and report["status"] == "Completed", report and report["history"]
            attempts = report["attempts"]
            wall = (_ts(attempts[-1]["finished_at"]) - _ts(attempts[0]["started_at"])).total_seconds()
            bucket, _, key = (report["results"] + "job.log")[len("s3://"):].partition("/")
            log = hook.read_key(key, bucket_name=bucket).splitlines()
            resumes = [m for m in (RESUME_LINE.match(line) for line in log) if m]
            recoveries = []
            for prev, match in zip(attempts, resumes):
                resumed = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone(timezone.utc)
                recoveries.append((resumed - _ts(prev["finished_at"])).total_seconds())
            results[label] = {"wall": wall, "attempts": len(attempts), "recoveries": recoveries,
                              "resumed_from": [a.get("resumed_from") for a in attempts[1:]]}
            print(f"{label}: {len(attempts)} attempt(s), training wall {wall:.1f}s, "
                  f"resumed from {results[label]['resumed_from']}", flush=True)
    clean, faulty = results["clean"], results["faulty"]
    goodput = clean["wall"] / faulty["wall"]
    per_fault = ", ".join(f"{r:.1f}s" for r in faulty["recoveries"])
    print(f"faults: {len(faulty['recoveries'])} (one per {args.fault_every:.0f}s of training)")
    print(f"recovery per fault (fault -> training resumed): {per_fault}")
    print(f"goodput={goodput:.3f} recovery_mean_s="
          f"{sum(faulty['recoveries']) / max(1, len(faulty['recoveries'])):.1f}")


if __name__ == "__main__":
    main()
