"""The CLI takes the running deployment's connections and SAT settings (issue 45.3); the person's own set ones win.

The commands against a real `sat up`: tests/e2e/test_cli_beside_service.py.
"""

from __future__ import annotations

import os

from sat_tasks.cli import common
from sat_tasks.io import (
    object_storage_hook,  # Airflow imported here, in the session's home (it keeps the first)
)
from sat_tasks.service import stack

CONN = "AIRFLOW_CONN_SAT_OBJECT_STORAGE"
JOBS = "AIRFLOW__SAT__JOBS_DIR"
LEDGER = "AIRFLOW__SAT__NODE_LEDGER_URI"


def _unset(monkeypatch, *names: str) -> None:
    """Unset `names` for the test; whatever the code under test sets them to is undone afterwards too."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _deployment(monkeypatch, env: dict[str, str] | None) -> None:
    monkeypatch.setattr(stack, "running_env", lambda home: env)


def test_the_deployments_values_replace_the_clis_defaults_but_not_what_the_person_set(tmp_path, monkeypatch):
    _unset(monkeypatch, CONN, JOBS, LEDGER, "AIRFLOW_CONFIG", "GX_ANALYTICS_ENABLED", "AIRFLOW__CORE__DAGS_FOLDER",
           "AIRFLOW__CORE__PLUGINS_FOLDER")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(LEDGER, "s3://mine/ledger/")
    monkeypatch.setattr(common, "_DEFAULTED", set())
    common.configure_airflow_env()  # defaults JOBS_DIR to the project's
    _deployment(monkeypatch, {CONN: '{"conn_type": "aws"}', JOBS: "/srv/jobs", LEDGER: "s3://theirs/ledger/"})
    assert common.use_running_deployment() is True
    assert (os.environ[CONN], os.environ[JOBS], os.environ[LEDGER]) == (
        '{"conn_type": "aws"}', "/srv/jobs", "s3://mine/ledger/")


def test_without_a_deployment_or_a_connection_the_problem_is_one_line(monkeypatch):
    _unset(monkeypatch, CONN)
    _deployment(monkeypatch, None)
    monkeypatch.setattr(object_storage_hook, "connection_fingerprint", lambda conn_id: None)
    problem = common.object_storage_problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"no `sat up` runs in {os.environ['AIRFLOW_HOME']}") and "'sat_object_storage'" in problem
    monkeypatch.setattr(object_storage_hook, "connection_fingerprint", lambda conn_id: "defined")
    assert common.object_storage_problem() is None  # a connection of the person's own (DB, secrets backend)
