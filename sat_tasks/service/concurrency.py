"""Airflow's concurrency for the deployment `sat up` runs, sized from the local pool (issue 45.5).

With `[core] parallelism = 4` below the 5 local nodes, a fifth job never got a worker to take
its node on: runs waited in Airflow, unexplained, and the node-slot wait the README promises
never showed. `sized_env(env)` gives the components `[core] parallelism`,
`max_active_runs_per_dag` and `max_active_tasks_per_dag` for the pool as configured
(the backend's `concurrent_attempts`, `backends.base.QueuesOnSlots`: on the local backend
`[sat] local_nodes` x `local_node_slots`, plus the nodes of the local workspaces defined at
start; `core.airflow_limits`), as `AIRFLOW__CORE__*` variables. A key the operator set (in the
environment, or in the `[core]` section of the Airflow config) is left as set; so is every key
on a backend with no slot board of its own (Kubernetes queues in Kueue and Airflow pools). Sized at start: a pool or a workspace
that grows later counts from the next `sat up` (until then, the list says when a run waits for
an Airflow worker slot).

`scheduler_env(env)` gives the one scheduler `sat up` runs a `[scheduler] scheduler_health_check_threshold` of
`SCHEDULER_HEALTH_CHECK_THRESHOLD_S` (issue 48): under a burst of 50 runs on 2 cores its loop, and so its heartbeat,
lagged 30-80 s, and at Airflow's default of 30 s its own orphan check (`adopt_or_reset_orphaned_tasks`, every 5
minutes) marked that very scheduler failed and reset the tasks it had running: each killed and run again (a launch among
them). A scheduler that really exits is restarted by `sat up`'s supervision, which does not wait for this threshold;
the tasks the dead one left are reset by an orphan check once it is past. The API's health check calls the scheduler
unhealthy past the same threshold. An operator's own value stands, on every backend.
"""

from __future__ import annotations

import configparser
import contextlib
from collections.abc import Mapping
from pathlib import Path

from sat_tasks import config
from sat_tasks.core.airflow_limits import AirflowConcurrency, airflow_limits

PREFIX = "AIRFLOW__CORE__"
SCHEDULER_HEALTH_CHECK_THRESHOLD_S = 180


def _setting(env: Mapping[str, str], key: str) -> str:
    """`[sat] key` as the components will read it: their environment first, then this process's configuration."""
    return env.get(config.ENV_PREFIX + key.upper()) or config.sat_setting(key)


def operator_keys(env: Mapping[str, str], section: str = "core", keys: tuple[str, ...] | None = None) -> set[str]:
    """Those of `keys` (default: the `[core]` concurrency keys) of `section` that the operator set: in `env`, or in
    the Airflow config file it names."""
    keys = tuple(AirflowConcurrency(0, 0, 0, 0).settings()) if keys is None else keys
    found = {key for key in keys if f"AIRFLOW__{section.upper()}__{key.upper()}" in env}
    path = env.get("AIRFLOW_CONFIG")
    if path and Path(path).is_file():
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        with contextlib.suppress(configparser.Error, OSError):
            parser.read(path, encoding="utf-8")
            found |= {key for key in keys if parser.has_option(section, key)}
    return found


def scheduler_env(env: Mapping[str, str]) -> dict[str, str]:
    """`[scheduler] scheduler_health_check_threshold` for `sat up`'s one scheduler (see the module's docstring), as an
    `AIRFLOW__SCHEDULER__*` variable; none when the operator set it."""
    key = "scheduler_health_check_threshold"
    if operator_keys(env, "scheduler", (key,)):
        return {}
    return {f"AIRFLOW__SCHEDULER__{key.upper()}": str(SCHEDULER_HEALTH_CHECK_THRESHOLD_S)}


def sized_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `AIRFLOW__CORE__*` variables the components get for the pool `env` configures (none on another backend,
    none for a key the operator set)."""
    from sat_tasks.backends import get_backend
    from sat_tasks.backends.base import concurrent_attempts_of

    attempts = concurrent_attempts_of(get_backend(_setting(env, "backend")), lambda key: _setting(env, key))
    if attempts is None:
        return {}
    sized = airflow_limits(attempts)
    kept = operator_keys(env)
    return {PREFIX + key.upper(): str(value) for key, value in sized.settings().items() if key not in kept}
