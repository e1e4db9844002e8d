"""Benchmark: goodput and recovery time, by phase, of a local Training Job with hardware faults at a fixed rate.

Run: .venv/bin/python tests/benchmarks/bench_goodput.py [--steps 4200] [--fault-every 120 | --fault-step N]
     [--faults 2] [--clean] [--elastic] [--standby [auto|true|false]] [--container]

Through the real DAG (dag.test, local backend, embedded S3), the tiny-Llama job with a GPU
fault (Xid 79) `--fault-every` seconds into each of the first `--faults` attempts.
goodput = productive training time / wall time. wall runs from the first launch to the end
of the last attempt. productive is the time each attempt spent training steps that were
kept: from its start of training (the engine's "Resuming from checkpoint-N" line; for the
first attempt its first commit minus the steps before it at that attempt's step time) to
its last committed checkpoint; steps after the last commit of a killed attempt are lost.
Start-up, recovery, lost steps and the final save count as badput. (A second estimate,
final steps x the run's median step time, is printed too: it treats steps slowed by a busy
machine as badput.) recovery per fault and its phases are the job report's (`report.json`
`recovery`, `sat_tasks.pipeline.report.recovery_per_fault`): the killed attempt's end ->
the next attempt's first step = detect (-> SAT's decision on the verdict) + schedule (-> the
next attempt's command starts) + start (-> the script hands over to the trainer: imports,
model, data) + restore (-> the checkpoint is loaded) + first step. `--clean` also runs the
job with no fault and reports its goodput the same way (start-up overhead only), side by side.

`--standby` sets the local backend's failover standby interpreter (`[sat]
failover_warm_interpreter`, ADR 0031) for every scenario: a failover's attempt then runs in an
interpreter that imported the framework while the attempt before it trained (from
`warm.STANDBY_DELAY_S` into it). `--standby` alone is `true`; without it the setting is the
service's default, `auto` (on while the host has `warm.STANDBY_MIN_AVAILABLE_BYTES` available:
the output says how much it had); `--standby false` turns it off.

`--container` runs the faulty job a second time with every attempt in the training image (the local
container runtime, ADR 0035; `make image` first): its recovery and start phase beside host mode's, in
one run (`container_start_minus_host_s`: how much longer a failover's start takes in a new container).

`--elastic` (issue 32: a failover with no spare node) runs a two-node job instead (`nodes: 2`,
`elastic: {min_nodes: 1, wait_seconds: 0}`, DDP over gloo, one rank per local node) twice with
its first fault only: `faulty` in a pool of three nodes, so the failover finds a spare and runs
on two nodes again, and `elastic` in a pool of exactly the job's two nodes, so attempt 2 resumes
on the one left (gradient accumulation x2 keeps the global batch) and stays there (the faulty
node is excluded, nobody releases it). Each scenario has nodes of its own names, so the first
one's fault leaves nothing in the node ledger for the second.

The last line is machine-readable: `goodput=<x> recovery_s=<median over faults> detect_s=<median>
schedule_s=.. start_s=.. restore_s=.. first_step_s=..` (`unknown` where no fault measured it),
then `<label>_goodput=<x>` for every other scenario run (`clean`, `elastic`); with `--elastic`
also `elastic_recovery_s=..` and `elastic_ratio=<elastic goodput / spare-node goodput>`.
Targets (issue 32): goodput >= 0.95 with one fault per 2 minutes of training; elastic_ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESUME_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Resuming from checkpoint-(\d+)")
COMMIT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*committed checkpoint-(\d+)")
ATTEMPT_LINE = re.compile(r"\[sat\] attempt (\d+) of job")


def _engine_ts(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)


def productive_seconds(log: list[str]) -> float:
    """Sum over attempts of (last commit - start of training): the time spent on kept steps."""
    import statistics

    segments: list[dict] = []
    for line in log:
        if ATTEMPT_LINE.search(line):
            segments.append({"resume": None, "commits": []})
            continue
        if not segments:
            continue
        match = RESUME_LINE.match(line)
        if match:
            segments[-1]["resume"] = (_engine_ts(match.group(1)), int(match.group(2)))
        match = COMMIT_LINE.match(line)
        if match:
            segments[-1]["commits"].append((_engine_ts(match.group(1)), int(match.group(2))))
    total = 0.0
    for seg in segments:
        commits = seg["commits"]
        if not commits:
            continue
        if seg["resume"] is not None:
            start = seg["resume"][0]
        else:
            rates = [(b[0] - a[0]).total_seconds() / (b[1] - a[1]) for a, b in itertools.pairwise(commits) if b[1] > a[1]]
            per_step = statistics.median(rates) if rates else 0.0
            from datetime import timedelta

            start = commits[0][0] - timedelta(seconds=commits[0][1] * per_step)
        total += (commits[-1][0] - start).total_seconds()
    return total


def step_seconds(log: list[str]) -> float:
    """Median seconds per step between consecutive checkpoint commits of the same attempt."""
    import statistics

    rates, last = [], None
    for line in log:
        if ATTEMPT_LINE.search(line):
            last = None  # intervals never span two attempts
            continue
        match = COMMIT_LINE.match(line)
        if match:
            ts, step = _engine_ts(match.group(1)), int(match.group(2))
            if last is not None and step > last[1]:
                rates.append((ts - last[0]).total_seconds() / (step - last[1]))
            last = (ts, step)
    return statistics.median(rates)


def _setup_env(home: Path) -> None:
    os.environ.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW_CONFIG": str(ROOT / "airflow.cfg"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__SAT__WORK_DIR": str(home / "work"), "AIRFLOW__SAT__JOBS_DIR": str(ROOT / "include" / "jobs"),
        "AIRFLOW__SAT__BACKEND": "local", "GX_ANALYTICS_ENABLED": "false",
    })
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    (home / ".migrated").touch()


def _job(name: str, steps: int, faults: list[dict], **fields):
    from sat_tasks.spec import parse_spec

    return parse_spec({
        "name": name, "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "storage": {"script_url": "s3://sat-demo/scripts/train_tiny_llama.py"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": f'python train_tiny_llama.py --data_dir "$SAT_DATA_DIR" --output_dir "$SAT_OUTPUT_DIR" '
                   f"--max_steps {steps} --save_steps 20",
        "faults": faults, "max_failovers": 3, "heartbeat_timeout_seconds": 300, **fields,
    })


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


# `--elastic`: the job's nodes, and the local pool of each scenario (`[sat] local_nodes`, names of its own).
ELASTIC_NODES = 2
POOLS = {"faulty": ",".join(f"spare-node-{i}" for i in range(ELASTIC_NODES + 1)),
         "elastic": ",".join(f"elastic-node-{i}" for i in range(ELASTIC_NODES))}


def scenarios(args: argparse.Namespace) -> list[tuple[str, object, str | None]]:
    """(label, job, pool) to run, the faulty one (label `faulty`, on which the last line's numbers are) always.

    `pool`: the scenario's `[sat] local_nodes` (None: the configured pool). With `--elastic`
    the faulty job is the two-node elastic job with a spare node, and `elastic` the same job
    with none; only the first fault is injected (after it the elastic job runs on its last node,
    and another fault there would leave it no node to resume on).
    """
    when = {"at_step": args.fault_step} if args.fault_step else {"after_seconds": args.fault_every}
    faults = [{"kind": "hardware", "attempt": n, "xid": 79, **when} for n in range(1, args.faults + 1)]
    if args.elastic:
        fields = {"nodes": ELASTIC_NODES, "elastic": {"min_nodes": 1, "wait_seconds": 0}}
        return [(label, _job(f"goodput-{label}", args.steps, faults[:1], **fields), POOLS[label])
                for label in ("faulty", "elastic")]
    runs: list[tuple[str, object, str | None]] = [("faulty", _job("goodput-faulty", args.steps, faults), None)]
    if args.container:  # the same job, each attempt in the training image (ADR 0035), side by side
        runs.append(("container", _job("goodput-container", args.steps, faults), None))
    if args.clean:
        runs.insert(0, ("clean", _job("goodput-clean", args.steps, []), None))
    return runs


def _median(values: list[float | None]) -> float | None:
    import statistics

    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def summarize(label: str, report: dict, log: list[str]) -> dict:
    """Goodput and the job report's recovery per fault (with its phases) of one run; prints its line."""
    attempts = report["attempts"]
    wall = (_ts(attempts[-1]["finished_at"]) - _ts(attempts[0]["started_at"])).total_seconds()
    t_step = step_seconds(log)
    goodput = productive_seconds(log) / wall
    step_estimate = report["global_step"] * t_step / wall
    lost = [(a.get("last_committed_step"), b.get("resumed_from")) for a, b in itertools.pairwise(attempts)]
    print(f"{label}: {len(attempts)} attempt(s), {report['global_step']} steps (median {t_step * 1000:.0f} ms/step), "
          f"wall {wall:.1f}s, goodput {goodput:.3f} (median-step estimate {step_estimate:.3f}), "
          f"(last commit, resumed from) per fault {lost}", flush=True)
    return {"goodput": goodput, "recovery": report.get("recovery") or [], "step_estimate": step_estimate}


def machine_line(results: dict[str, dict]) -> str:
    """`goodput=.. recovery_s=.. <phase>_s=..` of the faulty run (medians over its faults), other runs' goodput."""
    from sat_tasks.pipeline.report import RECOVERY_PHASES

    faulty = results["faulty"]
    recovery = faulty["recovery"]
    parts = [f"goodput={faulty['goodput']:.3f}", f"recovery_s={_seconds(_median([f['recovery_s'] for f in recovery]))}"]
    parts += [f"{name}_s={_seconds(_median([f['phases'][name] for f in recovery]))}" for name, _, _ in RECOVERY_PHASES]
    parts += [f"{label}_goodput={r['goodput']:.3f}" for label, r in results.items() if label != "faulty"]
    if "container" in results:  # recovery and its start phase in a container against host mode (the faulty run)
        container = results["container"]
        for name in ("recovery", "start"):
            key = "recovery_s" if name == "recovery" else None

            def median(result, key=key, name=name):
                return _median([f[key] if key else f["phases"][name] for f in result["recovery"]])

            host_value, container_value = median(faulty), median(container)
            parts.append(f"container_{name}_s={_seconds(container_value)}")
            parts.append(f"container_{name}_minus_host_s=" + (_seconds(container_value - host_value)
                         if host_value is not None and container_value is not None else "unknown"))
    if "elastic" in results:
        elastic = results["elastic"]
        parts.append(f"elastic_recovery_s={_seconds(_median([f['recovery_s'] for f in elastic['recovery']]))}")
        parts.append(f"elastic_ratio={elastic['goodput'] / faulty['goodput']:.3f}" if faulty["goodput"] else
                     "elastic_ratio=unknown")
    return " ".join(parts)


def _print_faults(label: str, result: dict, note: str) -> None:
    from sat_tasks.pipeline.report import format_recovery

    print(f"{label}: faults: {len(result['recovery'])} ({note})")
    for fault in result["recovery"]:
        print(f"  {format_recovery(fault)}")
        for phase, why in (fault.get("unknown") or {}).items():
            print(f"    {phase} unknown: {why}")


RESULT_PREFIX = "RESULT "


def run_scenario(label: str, job, pool: str | None) -> dict:
    """Run one scenario through its DAG in this process (a fresh Airflow home, its own S3); its summary."""
    home = Path(tempfile.mkdtemp(prefix="sat-goodput-"))
    sys.path.insert(0, str(ROOT))
    _setup_env(home)
    if pool is not None:
        os.environ["AIRFLOW__SAT__LOCAL_NODES"] = pool
    # host mode unless this is the container scenario (airflow.cfg's `auto` is for the service)
    os.environ["AIRFLOW__SAT__LOCAL_RUNTIME"] = "container" if label == "container" else "host"
    from sat_tasks.cli.run import run_job
    from sat_tasks.io.local_s3 import LocalS3Server

    with LocalS3Server(process=True) as server:
        os.environ.update(server.connection_env())
        from sat_tasks.io.object_storage import object_storage_hook

        report = run_job(job, None, quiet=True)
        assert report and report["status"] == "Completed", report and report["history"]
        bucket, _, key = (report["results"] + "job.log")[len("s3://"):].partition("/")
        result = summarize(label, report, object_storage_hook().read_key(key, bucket_name=bucket).splitlines())
    if pool is not None:
        print(f"{label}: pool {pool}; attempts on {[a.get('nodes') or a.get('node') for a in report['attempts']]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4200)
    parser.add_argument("--clean", action="store_true", help="also run the job without faults")
    parser.add_argument("--fault-every", type=float, default=120.0)
    parser.add_argument("--faults", type=int, default=2)
    parser.add_argument("--fault-step", type=int, default=0,
                        help="the fault at this training step of each attempt instead of --fault-every seconds into it "
                             "(the same point of training whatever the machine's load)")
    parser.add_argument("--elastic", action="store_true",
                        help="a two-node job with a spare node and with none (resumes on one): goodput side by side")
    parser.add_argument("--standby", nargs="?", const="true", default="auto", choices=("auto", "true", "false"),
                        help="[sat] failover_warm_interpreter (ADR 0031): `true` (the flag alone), `false`, or `auto` "
                             "(the default: on while memory is plentiful)")
    parser.add_argument("--container", action="store_true",
                        help="also run the faulty job with each attempt in the training image (`make image`; "
                             "[sat] local_runtime = container), recovery and its start phase side by side")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # one scenario, in the child process main() starts
    args = parser.parse_args()
    # read by the launches of the scenario's child process (sat_tasks.backends.local.warm)
    os.environ["AIRFLOW__SAT__FAILOVER_WARM_INTERPRETER"] = args.standby
    runs = scenarios(args)
    if args.only:
        label, job, pool = next(run for run in runs if run[0] == args.only)
        print(RESULT_PREFIX + json.dumps(run_scenario(label, job, pool)), flush=True)
        return
    # Each scenario in a process of its own: a second dag.test in one process logs to the first one's closed
    # log file (structlog keeps the stream it was configured with), and each gets a fresh Airflow home and S3.
    results = {}
    for label, _job_, _pool in runs:
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", label], stdout=subprocess.PIPE,
                               text=True, check=False)
        lines = child.stdout.splitlines()
        print("\n".join(line for line in lines if not line.startswith(RESULT_PREFIX)), flush=True)
        found = [line[len(RESULT_PREFIX):] for line in lines if line.startswith(RESULT_PREFIX)]
        if child.returncode != 0 or not found:
            raise SystemExit(f"scenario {label} failed (exit status {child.returncode})")
        results[label] = json.loads(found[-1])
    faults = args.faults if not args.elastic else 1
    when = f"at step {args.fault_step}" if args.fault_step else f"{args.fault_every:.0f}s into"
    for label, result in results.items():
        if label != "clean":
            _print_faults(label, result, f"one {when} each of the first {faults} attempts")
    print(_standby_line(args.standby))
    print(machine_line(results))


def _standby_line(setting: str) -> str:
    from sat_tasks.backends.local import warm

    if setting != "auto":
        return f"standby warm interpreter {'on' if setting == 'true' else 'off'} (--standby {setting})"
    available = warm._memory_available()
    return (f"standby warm interpreter auto (the default): {'on' if warm.standby_enabled() else 'off'}, "
            f"{'unknown' if available is None else f'{available / 2**30:.1f} GiB'} available now "
            f"(needs {warm.STANDBY_MIN_AVAILABLE_BYTES / 2**30:.0f} GiB), imports {warm.STANDBY_DELAY_S:.0f} s "
            "into an attempt")


if __name__ == "__main__":
    main()
