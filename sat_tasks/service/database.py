"""Which metadata DB a deployment uses: the operator's `[database] sql_alchemy_conn`, else SQLite in its home or a private PostgreSQL.

- An operator's URL (`AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`, its `_CMD`/`_SECRET` forms, or
  `sql_alchemy_conn` in the project's airflow.cfg) is used unchanged: `sat up` sets no
  database variable at all, so every component reads it as Airflow reads it.
- Else `postgres`, what `sat up` / `make up` run by default (`SERVICE_DEFAULT`): the
  deployment's own cluster (`service.postgres`, from the `postgresql` package `make system-deps`
  installs), reached with the generated `db_password`. SQLite took the whole service down under
  a burst of 20-30 submissions (the DAG processor died on "database is locked"; issue 48.2).
- Or `sqlite` (`sat up --db sqlite`, `make up DB=sqlite`, and a `ServiceStack` that names no
  default): `<home>/airflow.db` in write-ahead mode with longer lock waits (`service.sqlite`).
  `make demo` and `dag.test()` run no service and keep SQLite.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sat_tasks.errors import SatError

KINDS = ("sqlite", "postgres")
SERVICE_DEFAULT = "postgres"  # what `sat up` (and so `make up`) runs when neither --db nor an operator's URL says
CONFIGURED = "configured"
URL_VARIABLES = tuple(f"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN{suffix}" for suffix in ("", "_CMD", "_SECRET"))


class DatabaseChoiceError(SatError, ValueError):
    """`--db` names no known kind, or asks for one while the operator configured a URL of their own."""


@dataclass(frozen=True)
class DatabaseChoice:
    """What `sat up` runs: `kind` is `sqlite`, `postgres` or `configured` (`source` says where that URL is set)."""

    kind: str
    source: str = ""


def operator_url_source(environ: Mapping[str, str], config_file: Path | None) -> str:
    """Where the operator set `[database] sql_alchemy_conn` ("" when nowhere): a variable's name or the file."""
    for name in URL_VARIABLES:
        if environ.get(name):
            return name
    if config_file is not None and config_file.is_file():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read(config_file, encoding="utf-8")
        for key in ("sql_alchemy_conn", "sql_alchemy_conn_cmd", "sql_alchemy_conn_secret"):
            if parser.has_option("database", key) and parser.get("database", key).strip():
                return f"{config_file} [database] {key}"
    return ""


def choose_database(asked: str | None, environ: Mapping[str, str], config_file: Path | None,
                    default: str = "sqlite") -> DatabaseChoice:
    """The metadata DB for `sat up --db <asked>` (None: not asked; `default` unless the operator set a URL)."""
    if asked is not None and asked not in KINDS:
        raise DatabaseChoiceError(f"--db: must be one of {', '.join(KINDS)}, got {asked!r}")
    source = operator_url_source(environ, config_file)
    if source and asked is not None:
        raise DatabaseChoiceError(f"--db {asked}: the metadata DB is already configured ({source}); "
                                  "unset it, or leave --db (and SAT_DB) out to use it unchanged")
    if source:
        return DatabaseChoice(CONFIGURED, source)
    return DatabaseChoice(asked or default)


def sqlite_env(home: Path) -> dict[str, str]:
    """The components' variables for SQLite at `<home>/airflow.db`."""
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "sat_tasks.service.sqlite.CONNECT_ARGS",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": "sat_tasks.service.sqlite.CONNECT_ARGS_ASYNC",
    }
