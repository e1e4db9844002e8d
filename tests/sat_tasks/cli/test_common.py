"""The CLI's Airflow environment: the project's DAGs and specs wherever the Airflow home is."""

from __future__ import annotations

from sat_tasks.cli.common import configure_airflow_env
from sat_tasks.config import PROJECT_ROOT

PATHS = ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__SAT__JOBS_DIR")


def test_a_home_outside_the_project_still_finds_the_projects_dags_and_specs(tmp_path, monkeypatch):
    for name in (*PATHS, "AIRFLOW_CONFIG"):
        _unset(monkeypatch, name)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    configure_airflow_env()
    assert (tmp_path / "home").is_dir()
    assert [monkeypatch_get(name) for name in PATHS] == [
        str(PROJECT_ROOT / "dags"), str(PROJECT_ROOT / "plugins"), str(PROJECT_ROOT / "include" / "jobs")]


def test_a_config_of_ones_own_keeps_its_paths(tmp_path, monkeypatch):
    for name in PATHS:
        _unset(monkeypatch, name)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW_CONFIG", str(tmp_path / "airflow.cfg"))
    configure_airflow_env()
    assert all(monkeypatch_get(name) is None for name in PATHS)


def _unset(monkeypatch, name: str) -> None:
    """Unset `name` for the test; whatever the code under test sets is undone afterwards too."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


def monkeypatch_get(name: str) -> str | None:
    import os

    return os.environ.get(name)
