"""Benchmark: trigger -> first training step of the second consecutive run of the demo job, warm pool off vs on.

Run: PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_warm_pool.py [--max-steps 3] [--pairs 1]

In one process, on one embedded S3 server and one Airflow metadata DB: the demo job
(include/jobs/tiny-llama-demo.yaml without its injected fault, `--max_steps` short) runs
with the warm pool off and on (`warm_pool.keep_alive_seconds: 600`), each mode under a
job name of its own, alternating (off 1, on 1, off 2, on 2, ...) so that a change in the
machine's load hits both; the warm state is released at the end. For each run:
"trigger" is the DAG run's creation (its run id's timestamp: what a schedule or an Asset
event sets; `sat run`'s own set-up before `dag.test()`, seeding the bucket and parsing
the DAGs, is left out), "launch" the attempt's header in its job log, "first step" the first time
the engine's progress.json in the run's output directory names a step >= 1 (polled every
20 ms). Printed: each run's phases (trigger -> launch, launch -> first step) and the line
to read, `ratio=<on/off>` of the second runs (target <= 0.5). `--pairs N` runs N
consecutive runs after the first per mode and reports their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class FirstStepWatch:
    """Polls `<work>/<job>/*/output/concurrent_checkpoint/progress.json` for new runs' first step and launch."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir, self.seen = job_dir, {p.name for p in job_dir.glob("*")} if job_dir.exists() else set()
        self.first_step: float | None = None
        self.run: Path | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> FirstStepWatch:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def triggered(self) -> float:
        """The run's creation: `manual__2026-12-01T18_24_09.129997_00_00` -> its UTC timestamp."""
        stamp = self.run.name.split("__", 1)[1][:26].replace("_", ":")
        return datetime.fromisoformat(stamp[:10] + "T" + stamp[11:19] + "." + stamp[20:26] + "+00:00").timestamp()

    @property
    def launched(self) -> float:
        """The attempt's header line in the job log (`<iso time> [sat] attempt 1 of job ...`)."""
        return datetime.fromisoformat((self.run / "job.log").read_text().split(" ", 1)[0]).timestamp()

    def _poll(self) -> None:
        while not self._stop.is_set() and self.first_step is None:
            for run in self.job_dir.glob("*") if self.job_dir.exists() else []:
                if run.name in self.seen:
                    continue
                progress = run / "output" / "concurrent_checkpoint" / "progress.json"
                try:
                    step = json.loads(progress.read_text()).get("step") or 0
                except (OSError, ValueError):
                    continue
                if step >= 1:
                    self.first_step, self.run = time.time(), run
            time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1, help="second runs per mode (medians reported)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    home = Path(tempfile.mkdtemp(prefix="sat-bench-warm-"))
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__SAT__WORK_DIR": str(home / "work"),
        "AIRFLOW__SAT__BACKEND": "local", "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "GX_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    })
    import yaml

    from sat_tasks.cli.run import run_job
    from sat_tasks.io.local_s3 import LocalS3Server
    from sat_tasks.spec import parse_spec

    demo = yaml.safe_load((ROOT / "include" / "jobs" / "tiny-llama-demo.yaml").read_text())
    demo.pop("faults", None)
    demo["command"] = demo["command"].replace("--max_steps 160", f"--max_steps {args.max_steps}")
    results: dict[str, list[dict]] = {"off": [], "on": []}
    jobs = {}
    for mode in ("off", "on"):
        spec = {**demo, "name": f"bench-warm-{mode}"}
        if mode == "on":
            spec["warm_pool"] = {"keep_alive_seconds": 600}
        jobs[mode] = parse_spec(spec, source=f"bench-{mode}")
    with LocalS3Server() as server:
        os.environ.update(server.connection_env())
        # off 1, on 1, then (off n, on n): alternating, so a change in the machine's load hits both modes
        for n in range(1 + args.pairs):
            for mode in ("off", "on"):
                job = jobs[mode]
                with FirstStepWatch(home / "work" / job.name) as watch:
                    report = run_job(job, None, quiet=True)
                status = (report or {}).get("status")
                attempts = len((report or {}).get("attempts") or [])
                if watch.first_step is None or status != "Completed" or attempts != 1:
                    raise SystemExit(f"{mode} run {n + 1}: ended {status} after {attempts} attempt(s)"
                                     + ("" if watch.first_step else " without a first step"))
                trigger = watch.triggered
                row = {"run": n + 1, "to_first_step": watch.first_step - trigger,
                       "to_launch": watch.launched - trigger, "launch_to_step": watch.first_step - watch.launched,
                       "warm": ((report or {}).get("warm") or {}).get("lines", [])}
                print(f"[{mode}] run {n + 1}: trigger -> first step {row['to_first_step']:.1f}s "
                      f"(trigger -> launch {row['to_launch']:.1f}s, launch -> first step {row['launch_to_step']:.1f}s)",
                      flush=True)
                for line in row["warm"]:
                    print(f"[{mode}]   {line}", flush=True)
                results[mode].append(row)
        # leave nothing behind: the staged directory, the warm interpreter
        from sat_tasks.io.object_storage import object_storage_hook
        from sat_tasks.io.warm_pool import release_job
        from sat_tasks.pipeline.warm_pool import release_state

        for name in release_job(jobs["on"].with_backend("local"), object_storage_hook(), release_state,
                                lambda _: None):
            print(f"[on] released {name}", flush=True)
    off = statistics.median(r["to_first_step"] for r in results["off"][1:])
    on = statistics.median(r["to_first_step"] for r in results["on"][1:])
    print(f"second run, trigger -> first training step: warm pool off {off:.1f}s, on {on:.1f}s; "
          f"ratio={on / off:.2f} (target <= 0.50)")


if __name__ == "__main__":
    main()
