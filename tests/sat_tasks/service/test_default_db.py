"""`sat up` (what `make up` runs) defaults to its private PostgreSQL; a bare `ServiceStack` keeps SQLite (issue 48.2)."""

from __future__ import annotations

import pytest

from sat_tasks.cli import build_parser
from sat_tasks.config import PROJECT_ROOT
from sat_tasks.service import stack as stack_module
from sat_tasks.service.database import CONFIGURED, SERVICE_DEFAULT, choose_database
from sat_tasks.service.stack import ServiceStack


@pytest.fixture
def started(monkeypatch, tmp_path):
    """The stacks `sat up` would run, and what each would choose (nothing starts)."""
    chosen: list[tuple[ServiceStack, str]] = []

    def run(self):
        chosen.append((self, self.database_choice().kind))
        return 0

    monkeypatch.setattr(stack_module.ServiceStack, "run", run)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    for name in ("SAT_DB", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD",
                 "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    return chosen


def _up(*argv: str) -> int:
    args = build_parser().parse_args(["up", *argv])
    return args.func(args)


def test_sat_up_runs_postgres_unless_told_otherwise(started, monkeypatch):
    assert SERVICE_DEFAULT == "postgres"
    assert _up() == 0 and started[-1][1] == "postgres"
    assert _up("--db", "sqlite") == 0 and started[-1][1] == "sqlite"  # `make up DB=sqlite`
    monkeypatch.setenv("SAT_DB", "sqlite")
    assert _up() == 0 and started[-1][1] == "sqlite"


def test_an_operators_own_database_url_still_wins(started, monkeypatch):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://db.example.com/airflow")
    assert _up() == 0 and started[-1][1] == CONFIGURED


def test_a_stack_that_names_no_default_and_the_demo_keep_sqlite(tmp_path):
    assert ServiceStack(home=tmp_path).database_choice().kind == "sqlite"  # tests, benchmarks
    assert choose_database(None, {}, PROJECT_ROOT / "airflow.cfg").kind == "sqlite"
    assert choose_database(None, {}, PROJECT_ROOT / "airflow.cfg", default="postgres").kind == "postgres"


def test_make_up_installs_the_postgres_server_first():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    target = next(line for line in makefile.splitlines() if line.startswith("up:"))
    assert "system-deps" in target.split(":", 1)[1].split(), target
