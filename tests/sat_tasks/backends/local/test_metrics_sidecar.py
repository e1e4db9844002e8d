"""The node's metrics sidecar on the local backend: every attempt has its system and job series.

Also an attempt whose script does not use SAT's engine, and one killed long before its
first metrics interval (300 s here, the service's default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from sat_tasks.backends.local.metrics_sidecar import MetricsSidecar
from sat_tasks.backends.local.runner import LocalAttempt
from sat_tasks.spec import Fault

# Writes progress.json as the engine would, but is no engine and records no metrics itself.
# After step 1 it waits (bounded) for the sidecar's first_step record, so the fault at step 10
# strikes an attempt whose start the sidecar has seen, however busy the machine is.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
    os.makedirs(out, exist_ok=True)
    print("sidecar env", os.environ.get("SAT_METRICS_SIDECAR"), flush=True)
    job_series = os.path.join(os.environ["SAT_METRICS_DIR"], "attempt-1", "n1", "job.jsonl")
    for step in range(1, 400):
        with open(os.path.join(out, "progress.json.tmp"), "w") as f:
            json.dump({"step": step, "attempt": 1}, f)
        os.replace(os.path.join(out, "progress.json.tmp"), os.path.join(out, "progress.json"))
        deadline = time.time() + 120
        while step == 1 and "first_step" not in (open(job_series).read() if os.path.exists(job_series) else ""):
            if time.time() > deadline:
                sys.exit("the sidecar never wrote its first_step record")
            time.sleep(0.05)
        time.sleep(0.05)
    """
)


def test_an_attempt_killed_before_its_first_interval_has_system_and_job_series(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "t.py").write_text(SCRIPT)
    metrics = tmp_path / "metrics"
    runner = LocalAttempt(
        job="unit-job", attempt=1, node="n1", command="python t.py",
        env={"SAT_OUTPUT_DIR": str(tmp_path / "out"), "SAT_JOB_NAME": "unit-job", "SAT_ATTEMPT": "1",
             "SAT_NODE": "n1", "SAT_RUN_ID": "r1", "SAT_METRICS_DIR": str(metrics),
             "SAT_METRICS_INTERVAL_SECONDS": "300"},
        cwd=tmp_path / "code", output_dir=tmp_path / "out", job_log=tmp_path / "job.log",
        node_dir=tmp_path / "nodes" / "n1", faults=[Fault(kind="hardware", at_step=10)], grace_seconds=5.0,
        poll_seconds=0.05,
    )
    record = runner.run(lambda _: None)
    assert record.signal == 9, record.log_tail  # the fault killed it, some seconds in
    assert "sidecar env 1" in record.log_tail  # the training process was told the sidecar owns these series

    def series(name):
        path = metrics / "attempt-1" / "n1" / f"{name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    job = series("job")
    assert [r.get("status") or r.get("event") for r in job] == ["Starting", "first_step", "Running", "Ended"]
    assert job[1]["step"] == 1 and all(r["attempt"] == 1 and r["node"] == "n1" and r["job"] == "unit-job"
                                       for r in job)
    system = series("system")
    assert len(system) >= 3 and all(r["device"] == "host" and 0 <= r["cpu_percent"] for r in system)
    assert all("gpu" not in r["device"] for r in system)  # no GPU here: absent, not zeros
    assert not (metrics / "attempt-1" / "n1" / "training.jsonl").exists()  # the script records none itself
    # the sidecar said once why there is no GPU series, in the job log; and it is gone
    log = (tmp_path / "job.log").read_text()
    assert log.count("no GPU series") == 1
    sidecar_log = tmp_path / "nodes" / "n1" / "metrics-sidecar-attempt-1.log"
    assert sidecar_log.exists()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_sidecar(p, str(metrics))]


def _is_sidecar(pid: str, metrics_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return False
    return b"ckpt_engine.metrics" in cmdline and f"SAT_METRICS_DIR={metrics_dir}".encode() in environ


def test_the_runner_asks_its_sidecar_to_stop_once(tmp_path):
    """`request_stop` (the end of the log) then `stop` (the wait): one SIGTERM, not two."""
    counted = tmp_path / "sigterms"
    script = ("import signal, sys, time\n"
              "n = []\n"
              "signal.signal(signal.SIGTERM, lambda *a: n.append(1))\n"
              "print('ready', flush=True)\n"
              "time.sleep(3)\n"  # SIGTERMs still arriving are counted too
              f"open({str(counted)!r}, 'w').write(str(len(n)))\n")
    sidecar = MetricsSidecar({}, tmp_path / "sidecar.log")
    sidecar.proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert sidecar.proc.stdout.readline().strip() == "ready"
    sidecar.request_stop()
    began = time.monotonic()
    sidecar.stop(lambda _: None)
    assert sidecar.proc.returncode == 0 and time.monotonic() - began < 30
    assert counted.read_text() == "1"


def test_stop_relays_the_end_of_a_long_sidecar_log_and_says_it_was_cut(tmp_path, monkeypatch):
    from sat_tasks.backends.local import metrics_sidecar

    log_file = tmp_path / "sidecar.log"
    sidecar = MetricsSidecar({}, log_file)
    sidecar.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    sidecar.proc.wait()
    log_file.write_text("no GPU series: NVML cannot be read\n[sat metrics] uploaded\n")
    assert sidecar.stop(lambda _: None) == ["[sat metrics] no GPU series: NVML cannot be read", "[sat metrics] uploaded"]
    log_file.write_text("".join(f"upload {i} failed, retrying\n" for i in range(10_000)))
    monkeypatch.setattr(metrics_sidecar, "LOG_TAIL_BYTES", 1024)
    lines = sidecar.stop(lambda _: None)
    assert lines[0].startswith(f"[sat metrics] (the sidecar logged {log_file.stat().st_size} bytes: its last 1 KiB")
    assert lines[-1] == "[sat metrics] upload 9999 failed, retrying"
    assert all(line.startswith("[sat metrics] upload ") and line.endswith(" failed, retrying") for line in lines[1:])
    assert len(lines) < 1024 // 20
