"""Where SAT's files live: the project root, include/, the local work directory, and the [sat] config."""

from __future__ import annotations

import os
import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# [sat] defaults; airflow.cfg's [sat] section or AIRFLOW__SAT__<KEY> override them.
SAT_DEFAULTS = {
    "backend": "local",
    "object_storage_conn_id": "sat_object_storage",
    "work_dir": str(PROJECT_ROOT / ".sat" / "work"),
    "local_nodes": "local-node-0,local-node-1,local-node-2,local-node-3,local-node-4",
    "kubernetes_namespace": "sat-jobs",
    "kubernetes_conn_id": "kubernetes_default",
    "jobs_dir": str(PROJECT_ROOT / "include" / "jobs"),
    "final_checkpoint_grace_seconds": "60",
}


def sat_setting(key: str) -> str:
    """One `[sat]` setting: env `AIRFLOW__SAT__<KEY>`, then airflow.cfg, then the default."""
    env_value = os.environ.get(f"AIRFLOW__SAT__{key.upper()}")
    if env_value:
        return env_value
    try:
        from airflow.configuration import conf

        value = conf.get("sat", key, fallback=None)
    except Exception:  # Airflow not configured (plain library use): fall back to the defaults
        value = None
    return value if value else SAT_DEFAULTS[key]


def local_node_pool() -> list[str]:
    """The local backend's named nodes, from `[sat] local_nodes` (comma-separated)."""
    return [n.strip() for n in sat_setting("local_nodes").split(",") if n.strip()]


def include_dir() -> Path:
    """The include/ directory (env SAT_INCLUDE_DIR overrides, e.g. in an image)."""
    return Path(os.environ.get("SAT_INCLUDE_DIR", PROJECT_ROOT / "include"))


def work_dir() -> Path:
    """The local backend's working directory (staged data, outputs, job logs per run)."""
    return Path(sat_setting("work_dir"))


def safe_run_id(run_id: str) -> str:
    """A run id made safe as a single path component and object key segment."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("._") or "run"


def run_dir(job_name: str, run_id: str) -> Path:
    """The local working directory of one job run."""
    return work_dir() / job_name / safe_run_id(run_id)
