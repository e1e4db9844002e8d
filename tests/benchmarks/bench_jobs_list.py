"""Benchmark: the Training Jobs list (`GET /sat/api/jobs`) beside Airflow's own run list, at 10, 100 and 1,000 runs.

Run: make bench-jobs-list
  or PYTHONPATH=. .venv/bin/python tests/benchmarks/bench_jobs_list.py [--sizes 10,100,1000] [--rounds 15]
     [--specs 2000]

`--specs N` (issue 48.5): after the last size, N spec files are put in the jobs directory (copies
of the demo spec under other names: N more Training Job DAGs, none of them run); once the DAG
processor has serialized their DAGs (`--specs-wait` seconds at most; the bench says how many it
found: on a busy machine a DAG file's pass may run out of its parse budget and leave some out),
the same paired rounds again at the largest size, both lists now answering over about N + 1 SAT
DAGs. The list's cost must not grow with them (a stat per spec file, an `IN` of every DAG id were
its cost before). The runs are seeded before the specs are added: with 2,000 DAGs being parsed,
seeding on a 2-core machine took about 5 s a run.

One run, in this order: a `ServiceStack` starts as `make up` starts it (API server,
scheduler, DAG processor, triggerer; free loopback ports, a temporary home); once the
generic DAG `sat_training_job` is serialized it is paused (the seeded runs are history:
nothing schedules them). Then, for each size, runs are added as the service writes them
(in a subprocess with the deployment's environment):

- the DAG run, started as the Create form starts it (`dag_runs.start_run`: its task
  instances too), by one of five people, some in a workspace, with tags;
- its status history in Object Storage (`status.json`: Pending, Running, for every third
  run a failover and a second attempt, then Completed or Failed);
- the summary XCom the pipeline pushes at each status change (`sat_summary`, ADR 0022);
- the DAG run's end state and times.

Then one list call that brings the index in step with the new runs (timed apart: "first
list"; the view itself was built by a call before any seeding), and paired
rounds, alternating, of `GET /sat/api/jobs` and Airflow's `GET /api/v2/dags/~/dagRuns`
(both one page of 50 runs, as the admin, over HTTP with a bearer token); medians.
The machine may be shared with other work: the numbers say what they are on it.

Last line: ratio_1000_vs_10=<x> p50_ms_1000=<y> airflow_p50_ms_1000=<z> sat_vs_airflow_1000=<y/z>
and with `--specs N`: specs=<N> p50_ms_1000_specs=<a> airflow_p50_ms_1000_specs=<b>
sat_vs_airflow_1000_specs=<a/b> specs_vs_none=<a/y> (sat's p50 with the specs over without)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
GENERIC = "sat_training_job"
PAGE = 50
SPEC_PREFIX = "bench-spec-"


def write_specs(jobs_dir: Path, count: int) -> None:
    """`count` spec files in `jobs_dir`: the demo spec under other names (`bench-spec-00000` ...)."""
    text = (ROOT / "include" / "jobs" / "tiny-llama-demo.yaml").read_text()
    assert "\nname: tiny-llama-demo\n" in text
    for n in range(count):
        name = f"{SPEC_PREFIX}{n:05d}"
        (jobs_dir / f"{name}.yaml").write_text(text.replace("\nname: tiny-llama-demo\n", f"\nname: {name}\n"))


def wait_for_dags(http, url: str, count: int, wait_s: float) -> int:
    """Wait until Airflow has `count` DAGs tagged `training-job` (the generic one too); how many it has then."""
    deadline = time.monotonic() + wait_s
    while True:
        found = http.get(f"{url}/api/v2/dags", params={"tags": "training-job", "limit": 1}, timeout=120).json()
        total = int(found.get("total_entries", 0))
        if total >= count or time.monotonic() > deadline:
            return total
        time.sleep(5)


def seed(first: int, last: int) -> None:
    """Add runs `first`..`last - 1` to this deployment as the service writes them (run in its environment)."""
    from airflow.models.dagbag import DBDagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.core.run_summary import SUMMARY_KEY, summarize_history
    from sat_tasks.io.object_storage import object_storage_hook, write_json
    from sat_tasks.io.run_layout import RunLayout
    from sat_tasks.ui import dag_runs
    from sat_tasks.ui.create import validate_form

    hook = object_storage_hook()
    base = datetime(2026, 11, 1, tzinfo=UTC)
    bag = DBDagBag()
    for start in range(first, last, 50):
        with create_session() as session:
            for n in range(start, min(start + 50, last)):
                form = {"name": f"bench-{n:05d}", "learning_type": "on-demand", "framework": "pytorch",
                        "nodes": str(1 + n % 2), "resources.server_type": "g2", "resources.gpus_per_node": "8",
                        "data.source": "s3://sat-demo/datasets/tiny-corpus/", "results.destination": "s3://sat-demo/bench/",
                        "image.url": "registry.sat.local/sat/training:0.1.0", "command": "python train.py",
                        "storage.script_url": "s3://sat-demo/scripts/seed_train.py", "job_failover": "on",
                        "tags": f"team=t{n % 7}\nproject=bench"}
                result = validate_form(form, exists=lambda _uri: True)
                assert result.job is not None, result.problems
                run = dag_runs.start_run(bag, session, GENERIC, params_from_spec(result.job),
                                         user_name=f"user-{n % 5}", note="seeded by bench_jobs_list")
                t0 = base + timedelta(minutes=n)
                history = [{"status": "Pending", "at": t0.isoformat(), "reason": "spec validated", "attempt": None,
                            "task": "validate_spec"},
                           {"status": "Running", "at": (t0 + timedelta(minutes=1)).isoformat(),
                            "reason": "attempt 1 started", "attempt": 1, "task": "launch"}]
                if n % 3 == 0:
                    history += [{"status": "Pending - failoverinprogress", "at": (t0 + timedelta(minutes=20)).isoformat(),
                                 "reason": "Xid 79", "attempt": 1, "task": "decide"},
                                {"status": "Running", "at": (t0 + timedelta(minutes=22)).isoformat(),
                                 "reason": "attempt 2 started", "attempt": 2, "task": "launch"}]
                failed = n % 10 == 9
                end = t0 + timedelta(minutes=40)
                history.append({"status": "Failed" if failed else "Completed", "at": end.isoformat(),
                                "reason": "bench", "attempt": None, "task": "finalize"})
                write_json(hook, RunLayout.of(result.job, GENERIC, run.run_id).status_uri, history)
                XComModel.set(SUMMARY_KEY, summarize_history(history).to_dict(), dag_id=GENERIC, task_id="finalize",
                              run_id=run.run_id, session=session)
                run.state = "failed" if failed else "success"
                run.queued_at, run.start_date, run.end_date = t0 - timedelta(seconds=30), t0, end


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


def _timed_get(session, url: str, params: dict) -> float:
    started = time.perf_counter()
    response = session.get(url, params=params, timeout=300)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def _rounds(http, url: str, size: int, rounds: int) -> tuple[float, tuple[float, float]]:
    """The first list call's time (it brings the index, and the spec cache, in step), then `rounds` paired
    rounds of the two lists: (first, (sat p50 ms, airflow p50 ms))."""
    first = _timed_get(http, f"{url}/sat/api/jobs", {"per_page": PAGE})
    listed = http.get(f"{url}/sat/api/jobs", params={"per_page": PAGE}, timeout=300).json()
    assert listed["total"] == size, (listed["total"], size)
    sat, airflow = [], []
    for _ in range(rounds):
        sat.append(_timed_get(http, f"{url}/sat/api/jobs", {"per_page": PAGE}))
        airflow.append(_timed_get(http, f"{url}/api/v2/dags/~/dagRuns", {"limit": PAGE, "order_by": "-run_after"}))
    return first, (_median_ms(sat), _median_ms(airflow))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--specs", type=int, default=0, help="spec files (job DAGs) to add besides the generic DAG")
    parser.add_argument("--specs-wait", type=float, default=600.0,
                        help="seconds to wait at most for the DAG processor to serialize their DAGs")
    parser.add_argument("--seed", nargs=2, type=int, help=argparse.SUPPRESS)  # first last: the seeding subprocess
    args = parser.parse_args()
    if args.seed:
        seed(*args.seed)
        return 0

    import requests

    from sat_tasks.io.local_s3 import free_port
    from sat_tasks.service.secrets import SECRETS_FILE
    from sat_tasks.service.stack import ServiceStack

    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-jobs-list-") as tmp:
        root = Path(tmp)
        (root / "jobs").mkdir()
        stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(), jobs_dir=root / "jobs",
                             work_dir=root / "work", extra_env={"AIRFLOW__SAT__WORKSPACES_DIR": str(root / "ws")},
                             log=lambda _line: None)
        stack.start()
        try:
            password = json.loads((stack.home / SECRETS_FILE).read_text())["admin_password"]
            token = requests.post(f"{stack.url}/auth/token", json={"username": "admin", "password": password},
                                  timeout=60).json()["access_token"]
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {token}"
            deadline = time.monotonic() + 300
            while http.get(f"{stack.url}/api/v2/dags/{GENERIC}", timeout=60).status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{GENERIC} was not serialized within 300 s")
                time.sleep(2)
            http.patch(f"{stack.url}/api/v2/dags/{GENERIC}", json={"is_paused": True}, timeout=60).raise_for_status()
            env = {**stack.environment(), "PYTHONPATH": str(ROOT)}
            http.get(f"{stack.url}/sat/api/jobs", timeout=300).raise_for_status()  # the view builds on first use
            seeded, results = 0, {}
            print(f"{'runs':>6} {'seed s':>8} {'first list ms':>14} {'sat p50 ms':>11} {'airflow p50 ms':>15}")
            for size in sizes:
                started = time.monotonic()
                with open(root / "seed.log", "ab") as out:
                    subprocess.run([sys.executable, __file__, "--seed", str(seeded), str(size)], env=env, check=True,
                                   stdout=out, stderr=subprocess.STDOUT)
                seed_s, seeded = time.monotonic() - started, size
                first, results[size] = _rounds(http, stack.url, size, args.rounds)
                print(f"{size:>6} {seed_s:>8.1f} {first * 1000:>14.1f} {results[size][0]:>11.1f} "
                      f"{results[size][1]:>15.1f}", flush=True)
            small, large = min(sizes), max(sizes)
            if args.specs:
                write_specs(root / "jobs", args.specs)
                started = time.monotonic()
                dags = wait_for_dags(http, stack.url, args.specs + 1, args.specs_wait)
                print(f"{dags} SAT DAGs serialized ({args.specs} spec files + the generic DAG) after "
                      f"{time.monotonic() - started:.0f} s", flush=True)
                first, with_specs = _rounds(http, stack.url, large, args.rounds)
                print(f"{large:>6} {'+' + str(args.specs) + ' specs':>8} {first * 1000:>14.1f} {with_specs[0]:>11.1f} "
                      f"{with_specs[1]:>15.1f}", flush=True)
            filtered = [_timed_get(http, f"{stack.url}/sat/api/jobs", {"status": "Failed", "q": "bench", "tag": "team=t3",
                                                                        "sort": "gpu_hours", "page": 2, "per_page": 10})
                        for _ in range(args.rounds)]
            print(f"filtered and sorted at {large} runs (status, name, tag, sort by GPU-hours, page 2): "
                  f"p50 {_median_ms(filtered)} ms")
            print(f"(cpus: {os.cpu_count()}; the machine may be shared with other work)")
            print(f"(load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
            print(f"ratio_{large}_vs_{small}={results[large][0] / results[small][0]:.2f} "
                  f"p50_ms_{large}={results[large][0]} airflow_p50_ms_{large}={results[large][1]} "
                  f"sat_vs_airflow_{large}={results[large][0] / results[large][1]:.2f}"
                  + (f" specs={args.specs} p50_ms_{large}_specs={with_specs[0]} "
                     f"airflow_p50_ms_{large}_specs={with_specs[1]} "
                     f"sat_vs_airflow_{large}_specs={with_specs[0] / with_specs[1]:.2f} "
                     f"specs_vs_none={with_specs[0] / results[large][0]:.2f}" if args.specs else ""))
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
