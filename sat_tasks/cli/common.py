"""What every `sat` command shares: exit statuses, the project's Airflow environment, and the running deployment's
connections for the commands that read or write its Object Storage (`needs_object_storage`)."""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sat_tasks.config import PROJECT_ROOT

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
_DEFAULTED: set[str] = set()  # the variables `configure_airflow_env` set (not the person's own)


def configure_airflow_env() -> None:
    """Point Airflow at the project's config and a project-local AIRFLOW_HOME (unless already set).

    Only environment variables: nothing here imports Airflow.
    """
    _default("AIRFLOW_HOME", str(PROJECT_ROOT / ".airflow"))
    _default("AIRFLOW_CONFIG", str(PROJECT_ROOT / "airflow.cfg"))
    _default("GX_ANALYTICS_ENABLED", "false")
    if Path(os.environ["AIRFLOW_CONFIG"]).resolve() == (PROJECT_ROOT / "airflow.cfg").resolve():
        # The project's DAGs, plugins and job specs are where the project is, wherever the
        # Airflow home is (airflow.cfg derives them from AIRFLOW_HOME/..: right only for .airflow/).
        _default("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags"))
        _default("AIRFLOW__CORE__PLUGINS_FOLDER", str(PROJECT_ROOT / "plugins"))
        _default("AIRFLOW__SAT__JOBS_DIR", str(PROJECT_ROOT / "include" / "jobs"))
    Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)


def _default(name: str, value: str) -> None:
    if name not in os.environ:
        os.environ[name] = value
        _DEFAULTED.add(name)


def use_running_deployment() -> bool:
    """Take the connections and SAT settings of the `sat up` running in this AIRFLOW_HOME, as its components have
    them (`service.stack.running_env`: its Object Storage's endpoint and keys); False when none runs there.

    What the person set in this environment wins; the defaults `configure_airflow_env` chose do not.
    """
    from sat_tasks.service.stack import running_env

    env = running_env(Path(os.environ["AIRFLOW_HOME"]))
    if env is None:
        return False
    for name, value in env.items():
        if name not in os.environ or name in _DEFAULTED:
            os.environ[name] = value
            _DEFAULTED.discard(name)
    return True


def object_storage_problem() -> str | None:
    """Why this process cannot reach SAT's Object Storage, in one line; None when it can try (the running
    deployment's connection, or one defined here: the environment, the metadata DB, a secrets backend)."""
    from sat_tasks.config import sat_setting
    from sat_tasks.io.object_storage_hook import connection_fingerprint

    if use_running_deployment():
        return None
    conn_id = sat_setting("object_storage_conn_id")
    if connection_fingerprint(conn_id) is not None:
        return None
    return (f"no `sat up` runs in {os.environ['AIRFLOW_HOME']}, and the Object Storage connection {conn_id!r} is "
            "not defined here: start the service in this clone (`sat up` or `make up`) and run this beside it, or "
            "define the connection")


def needs_object_storage(command: str) -> Callable[[Callable[[argparse.Namespace], int]],
                                                   Callable[[argparse.Namespace], int]]:
    """A command that reads or writes Object Storage: it uses the running deployment's connection; without one
    (or when the storage does not answer) it says so in one line on stderr and exits 1, no traceback."""
    def wrap(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(func)
        def run(args: argparse.Namespace) -> int:
            from botocore.exceptions import BotoCoreError, ClientError

            # Its "credentials retrieved from login and password" is no output of the command's (`--json`); set
            # before Airflow is imported, which configures its logging.
            os.environ.setdefault("AIRFLOW__LOGGING__NAMESPACE_LEVELS",
                                  "airflow.providers.amazon.aws.utils.connection_wrapper=WARNING")
            problem = object_storage_problem()
            if problem is not None:
                print(f"{command}: {problem}", file=sys.stderr)
                return EXIT_FAILED
            try:
                return func(args)
            except (BotoCoreError, ClientError) as exc:  # their messages name the endpoint or bucket, no secret
                print(f"{command}: Object Storage did not answer as expected: {exc}", file=sys.stderr)
                return EXIT_FAILED
        return run
    return wrap


def ensure_metadata_db(say: Callable[[str], None] = print) -> None:
    """Create or migrate the Airflow metadata DB (SQLite by default); quick when up to date."""
    db = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    stamp = Path(os.environ["AIRFLOW_HOME"]) / ".migrated"
    if db.exists() and stamp.exists():
        return
    say("[sat] preparing the Airflow metadata DB (first run only) ...")
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    stamp.touch()
