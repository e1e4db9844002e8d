"""`sat up` as `make up` runs it (no --db: its private PostgreSQL) keeps going when a component dies (issue 48.2).

The DAG processor is killed (SIGKILL to its process group, as the OOM killer or a crash ends it):
`sat up` logs the exit, restarts it, and the restarted one heartbeats (the API's health check);
the other components and the service stay up, and `sat down` still stops everything.
Needs PostgreSQL's server (`make system-deps`, which `make test` runs first). 1-3 min here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from sat_tasks.io.local_s3 import free_port
from sat_tasks.service.stack import processes_of

pytestmark = pytest.mark.timeout(900)


def _component_pid(home: Path, component: str) -> int | None:
    for pid in processes_of(home):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] in ([b"-m", b"airflow"], [b"-m", b"sat_tasks.service.preload"]) and len(argv) > 3 \
                and argv[3] == component.encode():
            return pid
    return None


def _until(what: str, condition, deadline_s: float, log: Path):
    deadline = time.monotonic() + deadline_s
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {deadline_s}s: {what}\n{log.read_text()[-4000:]}"
        time.sleep(1)


def test_a_killed_dag_processor_is_restarted_and_the_service_stays_up(tmp_path):
    home, port = tmp_path / "home", free_port()
    env = {**os.environ, "AIRFLOW_HOME": str(home), "SAT_PORT": str(port), "SAT_STORAGE_PORT": str(free_port()),
           "SAT_STORAGE_DIR": str(tmp_path / "object-storage")}
    env.pop("SAT_DB", None)  # the default, as `make up` runs it
    sat = str(Path(sys.executable).with_name("sat"))
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        up = subprocess.Popen([sat, "up"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _until("SAT is up", lambda: up.poll() is None and "SAT is up" in log.read_text() or up.poll() is not None,
               600, log)
        assert up.poll() is None, log.read_text()
        assert "[sat] metadata DB: PostgreSQL" in log.read_text(), log.read_text()
        first = _until("the DAG processor's process", lambda: _component_pid(home, "dag-processor"), 120, log)
        scheduler = _component_pid(home, "scheduler")
        killed_at = datetime.now(UTC)
        os.killpg(first, signal.SIGKILL)

        restarted = re.compile(r"\[sat\] restarted the dag-processor \(pid (\d+), restart 1\)")
        match = _until("the restart", lambda: restarted.search(log.read_text()), 180, log)
        assert int(match.group(1)) != first
        assert re.search(r"\[sat\] the dag-processor exited with status -9 \(1 in the last 300s\): restarting it",
                         log.read_text()), log.read_text()

        def heartbeat_after_the_kill():
            try:
                health = requests.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=30).json()
            except (requests.RequestException, ValueError):
                return None
            beat = (health.get("dag_processor") or {}).get("latest_dag_processor_heartbeat")
            return health if beat and datetime.fromisoformat(beat) > killed_at else None

        health = _until("a heartbeat of the restarted DAG processor", heartbeat_after_the_kill, 300, log)
        assert health["dag_processor"]["status"] == "healthy", health
        assert up.poll() is None and _component_pid(home, "scheduler") == scheduler  # the others untouched
    finally:
        down = subprocess.run([sat, "down"], env=env, capture_output=True, text=True, timeout=240, check=False)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr + log.read_text()
    assert up.wait(timeout=60) == 0, log.read_text()
    assert processes_of(home) == []
