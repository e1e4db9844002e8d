"""Benchmark: the demo job under the running service (`make up`) against `dag.test()` (`make demo`), in one run.

Run: .venv/bin/python tests/benchmarks/bench_service.py [--rounds 1] [--service-only]
     .venv/bin/python tests/benchmarks/bench_service.py --burst 50 [--threads 16]

For each round, in this order:
- service: a `ServiceStack` as `make up` starts it (free loopback ports, a temporary
  Airflow home, its own work dir); `first answer` is the time from `start()` to the API's
  first health answer. The demo job is triggered through the REST API with the official
  client; `first step` is trigger -> the first `progress.json` with step >= 1 under the
  work dir; `wall` is trigger -> the run's end_date;
- dag.test: `sat run include/jobs/tiny-llama-demo.yaml` in a subprocess with its own
  (pre-migrated) Airflow home and work dir; `first step` and `wall` count from the
  moment it starts the DAG (its "seeded" line, which `-q` would leave out; before it only
  its S3 server starts).

Where the time goes, for both: the union of the task instances' run intervals ("in
tasks") and the rest of the wall ("between tasks": scheduling, task start-up), and the
two `launch` tasks (the training itself). Ratios service / dag.test are printed. Then the
demo's failover as its job report measured it (`report.json` `recovery`: the fault -> the
next attempt's first step, by phase), for each run: under the scheduler `detect` and
`schedule` hold the task hops (launch -> classify -> cleanup -> decide -> the next launch)
that `dag.test` makes in one process. Last, the DAG processor's CPU (its file parses, forked, included)
per second of the demo's wall. `--service-only` leaves `dag.test` out: an A/B of a change to the
service (ADR 0011's addendum on the preload ran the service side alone, alternating the two trees).

`--burst N` measures something else (issue 48): N runs of the generic DAG, each the smallest job
(tests/e2e/scripts/fake_train.py), triggered at once through the REST API from `--threads` threads against a
`ServiceStack` on `make up`'s metadata DB (PostgreSQL), as tests/e2e/test_service_burst.py does (without its kill of
the DAG processor): the HTTP statuses, the submission latency's p50 and p95, the 5xx count, and the time from the
first submission until every run is final.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "include" / "jobs" / "tiny-llama-demo.yaml"


def first_step_watch(work: Path) -> tuple[threading.Event, dict]:
    """A thread that notes (monotonic) when a progress.json under `work` first shows step >= 1."""
    stop, seen = threading.Event(), {}

    def look() -> None:
        while not stop.is_set() and "at" not in seen:
            for path in work.rglob("progress.json"):
                try:
                    if json.loads(path.read_text()).get("step", 0) >= 1:
                        seen["at"] = time.monotonic()
                        break
                except (OSError, ValueError):
                    pass
            time.sleep(0.2)

    threading.Thread(target=look, daemon=True).start()
    return stop, seen


def _parse(value) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()  # 3.11 reads a trailing "Z" as UTC


def _utc(text: str) -> float:
    """A timestamp as SQLite holds Airflow's (UTC, without an offset)."""
    return _parse(text if "+" in text else text + "+00:00")


def split_time(intervals: list[tuple[str, float, float]], wall: float) -> dict:
    """Seconds in tasks (union of intervals), between tasks, and in the launch tasks."""
    spans = sorted((s, e) for _, s, e in intervals)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    launch = sum(e - s for task, s, e in intervals if task.endswith(".launch"))
    return {"in_tasks": busy, "between_tasks": max(0.0, wall - busy), "launch": launch, "tasks": len(intervals)}


def run_service(keep: Path | None = None) -> dict:
    import airflow_client.client as af
    import requests
    from airflow_client.client.api.dag_run_api import DagRunApi
    from airflow_client.client.api.task_instance_api import TaskInstanceApi

    from sat_tasks.io.local_s3 import free_port
    from sat_tasks.service.stack import ServiceStack

    root = Path(tempfile.mkdtemp(prefix="sat-bench-service-"))
    jobs = root / "jobs"
    jobs.mkdir()
    shutil.copy(DEMO, jobs)
    stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=root / "object-storage", jobs_dir=jobs, work_dir=root / "work",
                         log=lambda _line: None)
    try:
        stack.start()
        password = json.loads((stack.home / "sat-secrets.json").read_text())["admin_password"]
        token = requests.post(f"{stack.url}/auth/token", json={"username": "admin", "password": password},
                              timeout=30).json()["access_token"]
        with af.ApiClient(af.Configuration(host=stack.url, access_token=token)) as api:
            runs = DagRunApi(api)
            deadline = time.monotonic() + 300  # the DAG processor's first parse
            while time.monotonic() < deadline:
                try:
                    runs.get_dag_runs("tiny-llama-demo", limit=1)
                    break
                except af.exceptions.NotFoundException:
                    time.sleep(1)
            stop, seen = first_step_watch(root / "work")
            parse_cpu = tree_cpu(stack.processes["dag-processor"].pid)
            triggered_wall, triggered = time.time(), time.monotonic()
            run = runs.trigger_dag_run("tiny-llama-demo", af.TriggerDAGRunPostBody(logical_date=None))
            while run.state not in ("success", "failed"):
                time.sleep(1)
                run = runs.get_dag_run("tiny-llama-demo", run.dag_run_id)
            stop.set()
            parse_cpu = (tree_cpu(stack.processes["dag-processor"].pid) - parse_cpu) / (time.monotonic() - triggered)
            wall = _parse(run.end_date) - triggered_wall
            tis = TaskInstanceApi(api).get_task_instances("tiny-llama-demo", run.dag_run_id, limit=100).task_instances
            intervals = [(t.task_id, _parse(t.start_date), _parse(t.end_date)) for t in tis
                         if t.start_date and t.end_date]
        report = _service_report(stack, "tiny-llama-demo", run.dag_run_id)
        return {"state": str(getattr(run.state, "value", run.state)), "first_answer": stack.first_answer_s,
                "first_step": seen.get("at", float("nan")) - triggered, "wall": wall,
                **split_time(intervals, wall), "recovery": recovery_lines(report), "parse_cpu": parse_cpu}
    finally:
        stack.stop()
        if keep is not None:  # the components' and the tasks' logs, to read where a run's time went
            shutil.copytree(stack.home / "logs", keep / f"service-{int(time.time())}", dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)


def run_burst(count: int, threads: int) -> dict:
    """`--burst N`: the figures of `count` submissions at once and of their runs (see the module's docstring)."""
    import airflow_client.client as af

    from sat_tasks.airflow.params import params_from_spec
    from sat_tasks.io.local_s3 import DEMO_BUCKET, free_port, state_file_name
    from sat_tasks.service.database import SERVICE_DEFAULT
    from sat_tasks.service.postgres import cluster_dir
    from sat_tasks.service.secrets import load_or_create
    from sat_tasks.service.stack import ServiceStack
    from sat_tasks.spec import parse_spec
    from tests.e2e.test_service import _fast_spec, _token, _wait_for_dags
    from tests.e2e.test_service_burst import burst, figures, states_of

    root = Path(tempfile.mkdtemp(prefix="sat-bench-burst-"))
    kept = root / "object-storage" / DEMO_BUCKET  # the job's script, restored by the storage at start
    kept.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "e2e" / "scripts" / "fake_train.py", kept / state_file_name("scripts/fake_train.py"))
    stack = ServiceStack(home=root / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=root / "object-storage", work_dir=root / "work", default_db=SERVICE_DEFAULT,
                         log=lambda _line: None)
    try:
        stack.start()
        config = af.Configuration(host=stack.url, access_token=_token(stack.url,
                                                                      load_or_create(stack.home).admin_password))
        config.connection_pool_maxsize = threads
        with af.ApiClient(config) as api:
            _wait_for_dags(api, ["sat_training_job"], deadline=time.monotonic() + 300)
            conf = params_from_spec(parse_spec(_fast_spec("bench-burst")))
            began = time.monotonic()
            answers = burst(api, conf, runs=count, threads=threads)
            answered_s = time.monotonic() - began
            accepted = {a["run_id"] for a in answers if a["status"] == 200}
            polls: list[int] = []
            while True:
                states = states_of(api, polls)
                if accepted <= {run for run, state in states.items() if state in ("success", "failed")}:
                    break
                if time.monotonic() - began > 3600:
                    raise SystemExit(f"not all final within an hour: {states}")
                time.sleep(2)
            final_s = time.monotonic() - began
        return {**figures(answers), "answered_s": answered_s, "final_s": final_s,
                "succeeded": sum(1 for run in accepted if states[run] == "success"), "accepted": len(accepted),
                "poll_server_errors": sum(1 for status in polls if status == 0 or status >= 500),
                "load": os.getloadavg()}
    finally:
        stack.stop()
        shutil.rmtree(cluster_dir(stack.home), ignore_errors=True)  # outside the temporary home when run as root
        shutil.rmtree(root, ignore_errors=True)


def tree_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and its live descendants, with what their reaped children used."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)  # ppid; u+s+cu+cs
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += stats.get(current, (0, 0.0))[1]
        todo.extend(child for child, (parent, _) in stats.items() if parent == current)
    return total


def _service_report(stack, dag_id: str, run_id: str) -> dict:
    """The demo run's `report.json`, read from the service's Object Storage ({} when it has none)."""
    from sat_tasks.io.run_layout import JobRun
    from sat_tasks.spec import load_spec

    bucket, _, key = JobRun.of(load_spec(DEMO), dag_id, run_id).report_uri[len("s3://"):].partition("/")
    try:
        return json.loads(stack.storage.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception as exc:  # noqa: BLE001 - the timings stand without it
        print(f"no report.json for {run_id}: {exc}", flush=True)
        return {}


def recovery_lines(report: dict) -> list[str]:
    """Each fault's recovery from a job report, as the report's summary prints it."""
    from sat_tasks.pipeline.report import format_recovery

    return [format_recovery(fault) for fault in report.get("recovery") or []]


def run_dag_test() -> dict:
    root = Path(tempfile.mkdtemp(prefix="sat-bench-dagtest-"))
    env = {**os.environ, "AIRFLOW_HOME": str(root / "home"), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg"),
           "AIRFLOW__SAT__WORK_DIR": str(root / "work"), "GX_ANALYTICS_ENABLED": "false"}
    env.pop("AIRFLOW_CONN_SAT_OBJECT_STORAGE", None)
    (root / "home").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (root / "home" / ".migrated").touch()
    sat = str(Path(sys.executable).with_name("sat"))
    try:
        stop, seen = first_step_watch(root / "work")
        proc = subprocess.Popen([sat, "run", str(DEMO)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        started = None
        output = []
        for line in proc.stdout:
            output.append(line)
            if started is None and "[sat] seeded" in line:
                started = time.monotonic()
        proc.wait()
        ended = time.monotonic()
        stop.set()
        if started is None:
            raise SystemExit("dag.test run did not start:\n" + "".join(output[-30:]))
        wall = ended - started
        with sqlite3.connect(root / "home" / "airflow.db") as db:
            rows = db.execute("SELECT task_id, start_date, end_date FROM task_instance "
                              "WHERE start_date IS NOT NULL AND end_date IS NOT NULL").fetchall()
        intervals = [(task, _utc(start), _utc(end)) for task, start, end in rows]
        state = "success" if proc.returncode == 0 else f"exit {proc.returncode}"
        recovery = [line.strip() for line in output if line.strip().startswith("recovery after attempt")]
        return {"state": state, "first_answer": float("nan"), "first_step": seen.get("at", float("nan")) - started,
                "wall": wall, **split_time(intervals, wall), "recovery": recovery}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep-logs", type=Path, help="copy each service run's logs (Airflow's home) here")
    parser.add_argument("--service-only", action="store_true",
                        help="run only the service side (an A/B of a change to the service, not to dag.test)")
    parser.add_argument("--burst", type=int, metavar="N", help="N submissions at once (issue 48) instead of the demo")
    parser.add_argument("--threads", type=int, default=16, help="--burst: the submitting threads")
    args = parser.parse_args()
    if args.burst:
        row = run_burst(args.burst, args.threads)
        print(f"burst of {args.burst} from {args.threads} threads (metadata DB: PostgreSQL): HTTP statuses "
              f"{row['statuses']}, 5xx or no answer {row['server_errors']}, submission latency p50 "
              f"{row['p50_s']:.2f} s p95 {row['p95_s']:.2f} s, all answered {row['answered_s']:.1f} s, all final "
              f"{row['final_s']:.0f} s, {row['succeeded']}/{row['accepted']} succeeded, polls 5xx "
              f"{row['poll_server_errors']}, load average {' '.join(f'{x:.1f}' for x in row['load'])}")
        return
    results: dict[str, list[dict]] = {"service": [], "dag.test": []}
    for number in range(1, args.rounds + 1):
        for name, fn in (("service", lambda: run_service(args.keep_logs)),
                         ("dag.test", run_dag_test))[:1 if args.service_only else 2]:
            print(f"round {number}: {name} ...", flush=True)
            results[name].append(fn())
    keys = ("first_answer", "first_step", "wall", "in_tasks", "between_tasks", "launch")
    print(f"{'':10} {'state':8} " + " ".join(f"{k:>14}" for k in keys))
    for name, rows in results.items():
        for row in rows:
            print(f"{name:10} {row['state']:8} " + " ".join(f"{row[k]:14.1f}" for k in keys))
    import statistics

    svc = {k: statistics.median(r[k] for r in results["service"]) for k in keys[1:]}
    ref = {k: statistics.median(r[k] for r in results["dag.test"]) for k in keys[1:]} if results["dag.test"] else {}
    if ref:
        print("ratio service / dag.test (medians): "
              + ", ".join(f"{k} {svc[k] / ref[k]:.2f}x" for k in keys[1:] if ref[k]))
    print("the DAG processor's CPU while the demo ran (its file parses included), CPU s per s of wall: "
          + ", ".join(f"{row['parse_cpu']:.3f}" for row in results["service"]))
    for name, rows in results.items():
        for number, row in enumerate(rows, 1):
            for line in row["recovery"] or ["no recovery measured (no failover in the report)"]:
                print(f"{name} round {number}: {line}")


if __name__ == "__main__":
    main()
