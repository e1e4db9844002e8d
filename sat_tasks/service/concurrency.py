"""Airflow's concurrency for the deployment `sat up` runs, sized from the local pool (issue 45.5).

With `[core] parallelism = 4` below the 5 local nodes, a fifth job never got a worker to take
its node on: runs waited in Airflow, unexplained, and the node-slot wait the README promises
never showed. `sized_env(env)` gives the components `[core] parallelism`,
`max_active_runs_per_dag` and `max_active_tasks_per_dag` for the pool as configured
(`backends.local.pool.airflow_concurrency`: `[sat] local_nodes` x `local_node_slots`, plus the
nodes of the local workspaces defined at start), as `AIRFLOW__CORE__*` variables. A key the
operator set (in the environment, or in the `[core]` section of the Airflow config) is left as
set; so is every key on a backend other than `local`. Sized at start: a pool or a workspace
that grows later counts from the next `sat up` (until then, the list says when a run waits for
an Airflow worker slot).
"""

from __future__ import annotations

import configparser
import contextlib
from collections.abc import Mapping
from pathlib import Path

from sat_tasks import config
from sat_tasks.backends.local.pool import AirflowConcurrency, NodePool, airflow_concurrency

PREFIX = "AIRFLOW__CORE__"


def _setting(env: Mapping[str, str], key: str) -> str:
    """`[sat] key` as the components will read it: their environment first, then this process's configuration."""
    return env.get(config.ENV_PREFIX + key.upper()) or config.sat_setting(key)


def pool_of(env: Mapping[str, str]) -> tuple[NodePool, int]:
    """The shared pool and the local workspaces' nodes that the components' environment `env` configures."""
    from sat_tasks.io.workspaces import WorkspaceStore

    nodes = tuple(n.strip() for n in _setting(env, "local_nodes").split(",") if n.strip())
    try:
        slots = max(1, int(_setting(env, "local_node_slots")))
    except ValueError:
        slots = 1  # the launch refuses the setting with its rule (`pool.node_pool_now`); the size stays sane
    workspace_nodes = 0
    with contextlib.suppress(Exception):  # a broken workspaces folder: validate_spec reports it, not the start
        workspace_nodes = sum(w.nodes for w in WorkspaceStore(_setting(env, "workspaces_dir")).list())
    return NodePool(nodes, slots), workspace_nodes


def operator_keys(env: Mapping[str, str]) -> set[str]:
    """The `[core]` concurrency keys the operator set: in `env`, or in the Airflow config file it names."""
    keys = {key for key in AirflowConcurrency(0, 0, 0, 0).settings() if PREFIX + key.upper() in env}
    path = env.get("AIRFLOW_CONFIG")
    if path and Path(path).is_file():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        with contextlib.suppress(configparser.Error, OSError):
            parser.read(path, encoding="utf-8")
            keys |= {key for key in AirflowConcurrency(0, 0, 0, 0).settings() if parser.has_option("core", key)}
    return keys


def sized_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `AIRFLOW__CORE__*` variables the components get for the pool `env` configures (none on another backend,
    none for a key the operator set)."""
    if _setting(env, "backend") != "local":
        return {}
    sized = airflow_concurrency(*pool_of(env))
    kept = operator_keys(env)
    return {PREFIX + key.upper(): str(value) for key, value in sized.settings().items() if key not in kept}
