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

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SECTION = "sat"

# [sat] defaults; airflow.cfg's [sat] section or AIRFLOW__SAT__<KEY> override them.
SAT_DEFAULTS = {
    "backend": "local",
    "object_storage_conn_id": "sat_object_storage",
    "work_dir": str(PROJECT_ROOT / ".sat" / "work"),
    "local_nodes": "local-node-0,local-node-1,local-node-2,local-node-3,local-node-4",
    # How many attempts each local node runs at once (issue 31.4): a job without a workspace takes a
    # slot on the least-loaded healthy node and queues while every slot is taken, for at most
    # `workspace_wait_seconds`, as a workspace job waits for its nodes (sat_tasks.backends.local.pool).
    "local_node_slots": "1",
    # Where the local backend runs an attempt (ADR 0035): `host` (a process of this host in SAT's own environment;
    # the job's image is not used), `container` (podman runs the attempt in the job's image, isolated: its run's
    # directories and Object Storage endpoint only), or `auto` (container wherever podman is installed; what the
    # shipped airflow.cfg sets for `make up`). `sat run` / `sat demo --runtime` choose for one run.
    "local_runtime": "host",
    # `forbidden`: an attempt never runs on this host outside a container (a deployment for more than one
    # trusted team); a job whose attempt would run in host mode fails with this setting named.
    "local_host_mode": "allowed",
    "kubernetes_namespace": "sat-jobs",
    "kubernetes_conn_id": "kubernetes_default",
    "jobs_dir": str(PROJECT_ROOT / "include" / "jobs"),
    # Training Workspaces (ADR 0015): their YAML definitions (the `sat workspace` command and the
    # Workspaces page write here), and how long a job waits for its workspace's nodes before it fails.
    "workspaces_dir": str(PROJECT_ROOT / "include" / "workspaces"),
    "workspace_wait_seconds": "3600",
    "final_checkpoint_grace_seconds": "60",
    # A failover job's next attempt starts in a standby interpreter that has imported the framework
    # (local backend, ADR 0031): `true`, `false`, or `auto` (on while the host has
    # `warm.STANDBY_MIN_AVAILABLE_BYTES` of memory available when the standby would start), the default:
    # the standby imports only once the attempt has run `warm.STANDBY_DELAY_S` (ADR 0031).
    "failover_warm_interpreter": "auto",
    # Node labels or taints (`key=value` or `key`, comma-separated) that mark an on-premise
    # pool as Spot/preemptible capacity; the classifier reads a lost node there as a
    # preemption (ADR 0004). GKE, EKS, Karpenter and AKS labels are known without it.
    "spot_node_labels": "",
    # Per-job metrics (ckpt_engine.metrics): seconds between samples (300, as the managed
    # service), and an OTLP/HTTP endpoint to export them to ("": OTEL_EXPORTER_OTLP_ENDPOINT, if set).
    "metrics_interval_seconds": "300",
    "otlp_endpoint": "",
    # The node health ledger (ADR 0004): every job's HARDWARE and SUSPECT_NODE verdicts against their
    # node, in Object Storage under `node_ledger_uri` ("": `<results destination>/_node-health/` of each
    # job; set it when jobs write their results to different places, so that they share one ledger).
    # A node with faults of two different jobs within the window is quarantined until a person
    # releases it (`sat nodes release NODE`); with `quarantine_cordon` the Kubernetes node is also
    # cordoned and tainted `sat.io/quarantined` (SAT's account then needs get/patch on nodes).
    "node_ledger_uri": "",
    "node_quarantine_window_seconds": "86400",
    "quarantine_cordon": "false",
    # Registry logins (issue 29.3): a job may name only its own registry connection,
    # `sat_registry_<job name>` (what the Create form writes), or one listed here
    # (comma-separated connection ids an operator shares with every job, e.g. a team's robot
    # account). Anyone who may create a job may use a listed one, so list pull-only logins.
    "shared_registry_connections": "",
    # A CA certificate (PEM) the local container runtime trusts when it pulls a job's image (a registry behind a
    # private CA, e.g. the embedded one's); only for those pulls, never added to the machine's trust store.
    "registry_ca_file": "",
    # The backends a job spec may name (comma-separated; ADR 0019). "": the deployment's `backend`
    # only, so `{"backend": "local"}` cannot stage a job's data onto a Kubernetes deployment's workers.
    "allowed_backends": "",
    # Each training attempt's Object Storage credentials (ADR 0020): STS AssumeRole with a session
    # policy of its run's data (read) and results prefix (read-write); "off" hands trainings the
    # service's keys (a store without STS), with a warning. See `io.scoped_credentials`.
    "scoped_credentials": "on",
    "scoped_credentials_role_arn": "arn:aws:iam::123456789012:role/sat-training",
    "scoped_credentials_seconds": "43200",
}

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
    """One `[sat]` setting: env `AIRFLOW__SAT__<KEY>`, then the config file, then the default.

    `default` serves keys without an entry in `SAT_DEFAULTS` (optional settings such as
    `k8s_<field>`, where `""` means "not set"); an unknown key without one is a
    programming error (KeyError).
    """
    env_value = os.environ.get(f"AIRFLOW__SAT__{key.upper()}")
    if env_value:
        return env_value
    value = _file_section(config_file()).get(key.lower())
    if value:
        return os.path.expandvars(value)
    if key in SAT_DEFAULTS:
        return SAT_DEFAULTS[key]
    if default is not None:
        return default
    raise KeyError(f"[sat] {key}: no such setting and no default")


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
