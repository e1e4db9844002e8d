"""What `sat down` and the stop act on: this deployment's `sat up` and processes, nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sat_tasks.service.stack import PID_FILE, SERVICE_MARK_ENV, processes_of, stop_running


def _sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **env},
                            start_new_session=True)


def test_the_stop_finds_marked_processes_not_those_that_share_the_airflow_home(tmp_path):
    home = tmp_path / "home"
    marked = _sleeper({SERVICE_MARK_ENV: str(home), "AIRFLOW_HOME": str(home)})
    bystander = _sleeper({"AIRFLOW_HOME": str(home)})  # `make down`, or a person's shell
    other = _sleeper({SERVICE_MARK_ENV: str(tmp_path / "other-home")})
    try:
        deadline = time.monotonic() + 60
        while marked.pid not in processes_of(home):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        found = processes_of(home)
        assert bystander.pid not in found and other.pid not in found and os.getpid() not in found
    finally:
        for proc in (marked, bystander, other):
            proc.kill()
            proc.wait()
    assert processes_of(home) == []  # killed and reaped


def test_sat_down_ignores_a_stale_pid_file_whose_pid_is_another_process(tmp_path):
    stranger = _sleeper({})
    try:
        (tmp_path / PID_FILE).write_text(str(stranger.pid))
        assert stop_running(tmp_path) is False
        assert stranger.poll() is None  # not signalled
        assert not (tmp_path / PID_FILE).exists()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.timeout(120)
def test_sat_down_returns_once_sat_up_has_exited_even_before_it_is_reaped(tmp_path):
    # A stand-in whose argv reads like `sat up`, stopping at SIGTERM; its parent (this test) reaps it late.
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(120)"
    fake = subprocess.Popen([sys.executable, "-c", code, "sat", "up"])
    try:
        (tmp_path / PID_FILE).write_text(str(fake.pid))
        time.sleep(0.5)
        started = time.monotonic()
        assert stop_running(tmp_path, timeout=60) is True
        assert time.monotonic() - started < 30  # a zombie counts as stopped
    finally:
        fake.kill()
        fake.wait()


def test_sat_down_without_sat_up_says_so(tmp_path):
    assert stop_running(tmp_path) is False


def test_the_shipped_config_keeps_task_hops_short():
    """What `make up`'s config sets for the time between two tasks, as Airflow reads it (ADR 0011 and 0031,
    2026-12-04): a failed task (the launch of an attempt that died) is marked failed only when its
    supervisor sees the process exit, up to `[workers] min_heartbeat_interval` after its sockets closed
    (Airflow's least, 1 s); a succeeded task's next task waits for the scheduler's idle sleep (0.25 s)."""
    import configparser

    from sat_tasks.config import PROJECT_ROOT

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(PROJECT_ROOT / "airflow.cfg")
    assert parser.getint("workers", "min_heartbeat_interval") == 1
    assert parser.getfloat("scheduler", "scheduler_idle_sleep_time") == 0.25
    done = subprocess.run([sys.executable, "-c", "from airflow.configuration import conf; "
                           "print(conf.getint('workers', 'min_heartbeat_interval'), "
                           "conf.getfloat('scheduler', 'scheduler_idle_sleep_time'))"],
                          env={**os.environ, "AIRFLOW_CONFIG": str(PROJECT_ROOT / "airflow.cfg")},
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "1 0.25"


# ---- `sat down` within its grace (issue 45.6) --------------------------------------------------------------------
# A scheduler that waits for its task, which waits for the training: it exits only once the training is gone.
WAITS_FOR_TRAINING = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); pid = int(sys.argv[1])\n"
                      "while os.path.exists(f'/proc/{pid}') and open(f'/proc/{pid}/stat').read().split()[2] != 'Z':\n"
                      "    time.sleep(0.05)\n")
# A training that writes its final checkpoint (1 s) at SIGTERM, then exits.
CHECKPOINTS_AT_SIGTERM = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(0))); time.sleep(300)"
IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"


def _stack_with(tmp_path, training_code: str, component_code: str):
    from sat_tasks.service.stack import ServiceStack

    home = tmp_path / "home"
    home.mkdir()
    training = subprocess.Popen([sys.executable, "-c", training_code], env={**os.environ, SERVICE_MARK_ENV: str(home)},
                                start_new_session=True)
    scheduler = subprocess.Popen([sys.executable, "-c", component_code, str(training.pid)], start_new_session=True)
    lines: list[str] = []
    stack = ServiceStack(home=home, log=lines.append)
    stack.processes["scheduler"] = scheduler
    deadline = time.monotonic() + 60
    while training.pid not in processes_of(home):  # its environment is readable once it runs
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # both have set their handlers
    return stack, training, scheduler, lines


@pytest.mark.timeout(120)
def test_sat_down_stops_training_with_the_components_so_the_scheduler_ends_in_time(tmp_path):
    stack, training, scheduler, lines = _stack_with(tmp_path, CHECKPOINTS_AT_SIGTERM, WAITS_FOR_TRAINING)
    try:
        started = time.monotonic()
        stack.stop(grace=20)
        took = time.monotonic() - started
        assert not any("did not stop within" in line for line in lines), lines  # nothing was killed
        assert took < 15, (took, lines)  # the training's checkpoint (1 s), then the scheduler: not the grace
        assert training.wait(timeout=10) == 0 and scheduler.wait(timeout=10) == 0  # the training ended itself
    finally:
        for proc in (training, scheduler):
            proc.kill()
            proc.wait()


@pytest.mark.timeout(120)
def test_sat_down_kills_what_ignores_sigterm_at_its_grace_not_after(tmp_path):
    stack, training, scheduler, lines = _stack_with(tmp_path, IGNORES_SIGTERM, WAITS_FOR_TRAINING)
    try:
        started = time.monotonic()
        stack.stop(grace=3)
        took = time.monotonic() - started
        assert took < 3 + 2.5, (took, lines)  # was 3 + 10: the training's own grace came after the components'
        assert any("did not stop within 3s: killing it" in line for line in lines), lines
        assert training.wait(timeout=10) == -9 and processes_of(stack.home) == []
    finally:
        for proc in (training, scheduler):
            proc.kill()
            proc.wait()


# ---- PostgreSQL after SQLite (issue 45.6) ------------------------------------------------------------------------
def _sqlite_home(tmp_path, runs: int):
    import sqlite3

    home = tmp_path / "home"
    home.mkdir()
    with sqlite3.connect(home / "airflow.db") as db:
        db.execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY, dag_id TEXT, run_id TEXT)")
        db.executemany("INSERT INTO dag_run (dag_id, run_id) VALUES (?, ?)",
                       [("sat_training_job", f"manual__{n}") for n in range(runs)])
    return home


def test_starting_on_postgresql_after_sqlite_says_where_the_runs_are_and_how_to_see_them(tmp_path, monkeypatch):
    from sat_tasks.service import postgres
    from sat_tasks.service.stack import ServiceStack

    class Cluster:  # the private cluster, started
        def __init__(self, **_kwargs):
            pass

        def start(self):
            pass

        def describe(self):
            return "PostgreSQL on 127.0.0.1:5999"

    monkeypatch.setattr(postgres, "PostgresCluster", Cluster)
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    home = _sqlite_home(tmp_path, runs=3)
    lines: list[str] = []
    ServiceStack(home=home, db="postgres", log=lines.append)._start_database()
    note = next(line for line in lines if "note:" in line)
    assert f"{home / 'airflow.db'} holds 3 DAG run(s)" in note and "`sat up --db sqlite`" in note, lines
    assert "`make up DB=sqlite`" in note and "does not show them" in note


def test_no_word_without_earlier_sqlite_runs(tmp_path):
    from sat_tasks.service.stack import sqlite_runs_note

    assert sqlite_runs_note(tmp_path) is None  # no SQLite DB
    assert sqlite_runs_note(_sqlite_home(tmp_path, runs=0)) is None  # one without runs
