"""SAT's settings: the one reader of the `[sat]` config section, and where SAT's files live.

A setting comes from, in order: the environment (`AIRFLOW__SAT__<KEY>`, as Airflow itself
reads it), the `[sat]` section of the Airflow config file (`$AIRFLOW_CONFIG`, else
`$AIRFLOW_HOME/airflow.cfg`), then `SAT_DEFAULTS`. The file is read with `configparser`,
not through `airflow.configuration`, so the `sat` command line and the training image need
no Airflow import (importing it costs ~1.5 s); `${VAR}` in a value is expanded as Airflow
expands it.
"""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path

from sat_tasks.settings import SETTINGS, declared, problems

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SECTION = "sat"

# [sat] defaults, from the one table of settings (`sat_tasks.settings`); airflow.cfg's [sat] section or
# AIRFLOW__SAT__<KEY> override them.
SAT_DEFAULTS = {s.name: s.default.replace("<project>", str(PROJECT_ROOT)) for s in SETTINGS if not s.family}
ENV_PREFIX = "AIRFLOW__SAT__"


_file_cache: dict[tuple[str, float], dict[str, str]] = {}


def config_file() -> Path | None:
    """The Airflow config file in effect: `$AIRFLOW_CONFIG`, else `$AIRFLOW_HOME/airflow.cfg` (None if absent)."""
    explicit = os.environ.get("AIRFLOW_CONFIG")
    if explicit:
        return Path(explicit)
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return Path(home) / "airflow.cfg"


def _file_section(path: Path | None) -> dict[str, str]:
    """The `[sat]` section of `path` (cached per path and modification time)."""
    if path is None:
        return {}
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    key = (str(path), mtime)
    if key not in _file_cache:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read(path, encoding="utf-8")
        _file_cache.clear()
        _file_cache[key] = dict(parser.items(SECTION)) if parser.has_section(SECTION) else {}
    return _file_cache[key]


def sat_setting(key: str, default: str | None = None) -> str:
    """One `[sat]` setting: env `AIRFLOW__SAT__<KEY>`, then the config file, then its declared default.

    Only what `sat_tasks.settings` declares is read (a family's member too: `data_roots_<workspace>`);
    an undeclared key is a programming error (KeyError). `default` serves a family member, whose
    declared default is the family's; a plain setting's default is the table's.
    """
    setting = declared(key)
    if setting is None:
        raise KeyError(f"[sat] {key}: not declared in sat_tasks.settings.SETTINGS")
    env_value = os.environ.get(f"{ENV_PREFIX}{key.upper()}")
    if env_value:
        return env_value
    value = _file_section(config_file()).get(key.lower())
    if value:
        return os.path.expandvars(value)
    if key in SAT_DEFAULTS:
        return SAT_DEFAULTS[key]
    return default if default is not None else setting.default


def settings_problems() -> list[str]:
    """Every unknown `[sat]` key and mistyped value in the config file and the environment, one line each,
    naming the key and the nearest known one (what `sat up` and `sat validate` refuse to start with)."""
    env = {k[len(ENV_PREFIX):].lower(): v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    return problems(_file_section(config_file()), env)


def local_node_pool() -> list[str]:
    """The local backend's named nodes, from `[sat] local_nodes` (comma-separated)."""
    return [n.strip() for n in (sat_setting("local_nodes") or "").split(",") if n.strip()]


def shared_registry_connections() -> frozenset[str]:
    """The registry connection ids every job may name, from `[sat] shared_registry_connections`."""
    return frozenset(c.strip() for c in sat_setting("shared_registry_connections").split(",") if c.strip())


def allowed_backends() -> tuple[str, ...]:
    """The backends a job may run on, from `[sat] allowed_backends` (default: `[sat] backend` only)."""
    listed = tuple(b.strip() for b in sat_setting("allowed_backends").split(",") if b.strip())
    return listed or (sat_setting("backend"),)


def include_dir() -> Path:
    """The include/ directory (env SAT_INCLUDE_DIR overrides, e.g. in an image)."""
    return Path(os.environ.get("SAT_INCLUDE_DIR", PROJECT_ROOT / "include"))


def work_dir() -> Path:
    """The local backend's working directory (staged data, outputs, job logs per run)."""
    return Path(sat_setting("work_dir"))


def safe_run_id(run_id: str) -> str:
    """A run id made safe as a path component, lossily (`:` and `+` both become `_`: distinct ids can collide).

    The legacy rule: runs validated before issue 29.4 keep their results under it, and names that
    need no round trip (the node ledger, Kubernetes names with a hash of the id) still use it.
    A run's results prefix and work directory use `run_key` (ADR 0024).
    """
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("._") or "run"


_RUN_KEY_KEEPS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


def run_key(run_id: str) -> str:
    """A run id as one path component and object key segment, reversibly (`run_id_of_key` undoes it).

    Letters, digits, `_`, `-` and `.` stay; every other byte of its UTF-8 form (`:`, `+`, `/`,
    `%`, ...) becomes `%XX`, and so does a leading `.` (no `.`, `..` or hidden name). Distinct run
    ids give distinct keys: `manual__2026-01-01T00:00:00+00:00` ->
    `manual__2026-01-01T00%3A00%3A00%2B00%3A00`.
    """
    if not run_id:
        raise ValueError("run id: must not be empty")
    encoded = "".join(chr(b) if chr(b) in _RUN_KEY_KEEPS else f"%{b:02X}" for b in run_id.encode("utf-8"))
    return "%2E" + encoded[1:] if encoded.startswith(".") else encoded


def run_id_of_key(key: str) -> str:
    """The run id `run_key` encoded as `key`."""
    from urllib.parse import unquote

    return unquote(key, errors="strict")


def run_dir(job_name: str, run_id: str, dag_id: str | None = None) -> Path:
    """The local working directory of one job run: `<work_dir>/<dag_id>/<job>/<run_key>` (legacy, no
    DAG: `<work_dir>/<job>/<safe_run_id>`)."""
    if dag_id is None:
        return work_dir() / job_name / safe_run_id(run_id)
    return work_dir() / dag_id / job_name / run_key(run_id)
