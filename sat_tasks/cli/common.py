"""What every `sat` command shares: exit statuses and the project's Airflow environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sat_tasks.config import PROJECT_ROOT

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def configure_airflow_env() -> None:
    """Point Airflow at the project's config and a project-local AIRFLOW_HOME (unless already set).

    Only environment variables: nothing here imports Airflow.
    """
    os.environ.setdefault("AIRFLOW_HOME", str(PROJECT_ROOT / ".airflow"))
    os.environ.setdefault("AIRFLOW_CONFIG", str(PROJECT_ROOT / "airflow.cfg"))
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    if Path(os.environ["AIRFLOW_CONFIG"]).resolve() == (PROJECT_ROOT / "airflow.cfg").resolve():
        # The project's DAGs, plugins and job specs are where the project is, wherever the
        # Airflow home is (airflow.cfg derives them from AIRFLOW_HOME/..: right only for .airflow/).
        os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags"))
        os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(PROJECT_ROOT / "plugins"))
        os.environ.setdefault("AIRFLOW__SAT__JOBS_DIR", str(PROJECT_ROOT / "include" / "jobs"))
    Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)


def ensure_metadata_db(say: Callable[[str], None] = print) -> None:
    """Create or migrate the Airflow metadata DB (SQLite by default); quick when up to date."""
    db = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    stamp = Path(os.environ["AIRFLOW_HOME"]) / ".migrated"
    if db.exists() and stamp.exists():
        return
    say("[sat] preparing the Airflow metadata DB (first run only) ...")
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    stamp.touch()
