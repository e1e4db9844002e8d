"""The metadata DB of `sat up` (issue 31.3): the operator's URL unchanged, SQLite by default, or a private PostgreSQL cluster."""

from __future__ import annotations

import json
import shutil
import stat

import pytest

from sat_tasks.service import secrets as service_secrets
from sat_tasks.service.database import CONFIGURED, DatabaseChoiceError, choose_database
from sat_tasks.service.stack import ServiceStack

PG_URL = "postgresql+psycopg2://ops:kept-by-ops@db.internal:5432/airflow"


def _cfg(tmp_path, database_section: str):
    path = tmp_path / "airflow.cfg"
    path.write_text(f"[core]\nload_examples = False\n\n[database]\n{database_section}\n")
    return path


# ---- which DB -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("asked", "environ", "section", "expected"), [
    pytest.param(None, {}, "", ("sqlite", ""), id="default-sqlite"),
    pytest.param("postgres", {}, "", ("postgres", ""), id="asked-postgres"),
    pytest.param(None, {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": PG_URL}, "",
                 (CONFIGURED, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"), id="operator-variable"),
    pytest.param(None, {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET": "db-url"}, "",
                 (CONFIGURED, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET"), id="operator-secret-backend"),
    pytest.param(None, {}, f"sql_alchemy_conn = {PG_URL}", (CONFIGURED, "[database] sql_alchemy_conn"),
                 id="operator-config-file"),
    pytest.param(None, {}, "# sql_alchemy_conn = left as a comment", ("sqlite", ""), id="commented-out"),
])
def test_the_operator_url_wins_else_the_asked_kind(tmp_path, asked, environ, section, expected):
    choice = choose_database(asked, environ, _cfg(tmp_path, section))
    assert choice.kind == expected[0] and expected[1] in choice.source


@pytest.mark.parametrize(("asked", "environ", "match"), [
    pytest.param("mysql", {}, r"--db: must be one of sqlite, postgres, got 'mysql'", id="unknown-kind"),
    pytest.param("postgres", {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": PG_URL},
                 r"--db postgres: the metadata DB is already configured \(AIRFLOW__DATABASE__SQL_ALCHEMY_CONN\)",
                 id="asked-against-a-configured-url"),
])
def test_a_contradictory_or_unknown_choice_is_refused_naming_the_field(tmp_path, asked, environ, match):
    with pytest.raises(DatabaseChoiceError, match=match):
        choose_database(asked, environ, _cfg(tmp_path, ""))


def test_the_shipped_config_sets_no_url_so_sat_up_chooses():
    from sat_tasks.config import PROJECT_ROOT

    assert choose_database(None, {}, PROJECT_ROOT / "airflow.cfg").kind == "sqlite"


def test_the_components_get_the_operators_url_unchanged_and_no_sqlite_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", PG_URL)
    env = ServiceStack(home=tmp_path / "home").environment()
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == PG_URL
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS" not in env


def test_the_default_is_sqlite_in_the_home_with_its_connect_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    env = ServiceStack(home=tmp_path / "home").environment()
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / 'home' / 'airflow.db'}"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] == "sat_tasks.service.sqlite.CONNECT_ARGS"


# ---- the generated password -----------------------------------------------------------------------
def test_a_deployment_made_before_the_db_password_gains_one_and_keeps_its_other_secrets(tmp_path):
    home = tmp_path / "home"
    first = service_secrets.load_or_create(home)
    kept = home / service_secrets.SECRETS_FILE
    older = json.loads(kept.read_text())
    del older["db_password"]
    kept.write_text(json.dumps(older))
    again = service_secrets.load_or_create(home)
    assert again.admin_password == first.admin_password and again.jwt_secret == first.jwt_secret
    assert len(again.db_password) >= 24 and again.db_password != first.db_password
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert service_secrets.load_or_create(home).db_password == again.db_password  # generated once
    assert again.db_password not in repr(again)


# ---- a real cluster -------------------------------------------------------------------------------
def test_a_private_cluster_answers_with_the_generated_password_only_and_logs_no_secret(tmp_path):
    """initdb, start, the `airflow` database through Airflow's URL, a wrong password refused, a restart keeps data."""
    import psycopg2
    import sqlalchemy

    from sat_tasks.service.postgres import DB_NAME, DB_USER, PostgresCluster

    home = tmp_path / "home"
    kept = service_secrets.load_or_create(home)
    cluster = PostgresCluster(home=home, password=kept.db_password, logs_dir=home / "logs", log=lambda _l: None)
    try:
        cluster.start()
        assert cluster.url().startswith(f"postgresql+psycopg2://{DB_USER}:")
        engine = sqlalchemy.create_engine(cluster.url())
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("CREATE TABLE kept (v text)"))
            connection.execute(sqlalchemy.text("INSERT INTO kept VALUES ('across a restart')"))
        engine.dispose()
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(host="127.0.0.1", port=cluster.port, user=DB_USER, password="not-it", dbname=DB_NAME)
        assert stat.S_IMODE(cluster.directory.stat().st_mode) == 0o700
        cluster.stop()
        cluster.start()  # the same cluster, initialised once
        engine = sqlalchemy.create_engine(cluster.url())
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("SELECT v FROM kept")).scalar() == "across a restart"
        engine.dispose()
    finally:
        cluster.stop()
        logged = cluster.log_file.read_text(errors="replace")
        cluster.remove()
    assert "database system is ready to accept connections" in logged
    assert kept.db_password not in logged and kept.db_password not in repr(cluster)
    assert not cluster.directory.exists()


def test_a_start_that_fails_after_the_cluster_started_leaves_no_server_behind(tmp_path):
    """The server runs in a session of its own: a failed `start()` stops it (and the storage) before raising."""
    import subprocess

    from sat_tasks.service.postgres import cluster_dir
    from sat_tasks.service.stack import ServiceError

    class FailsAfterTheDatabase(ServiceStack):
        def environment(self):
            if self.database is not None:
                raise ServiceError("planted: a failure after the server started")
            return super().environment()

    home = tmp_path / "home"
    stack = FailsAfterTheDatabase(home=home, storage_port=0, db="postgres", log=lambda _line: None)
    try:
        with pytest.raises(ServiceError, match="planted"):
            stack.start()
        assert stack.database is None and stack.storage is None
        assert "ready to accept connections" in (stack.logs_dir / "postgres.log").read_text()
        left = subprocess.run(["pgrep", "-f", str(cluster_dir(home) / "data")], capture_output=True, text=True,
                              check=False).stdout.split()
        assert left == []
    finally:
        shutil.rmtree(cluster_dir(home), ignore_errors=True)
