"""The warm pool on the local backend: the staged directory and the node slot a finished run keeps (ADR 0015).

`keep_warm` leaves the run's staged data directory where it is (the next run links its
unchanged files instead of downloading them) and holds the node the last attempt ran on;
`release_warm` deletes the directory (only below `[sat] work_dir`) and lets the node go.
`release_for_capacity` is what a workspace's queue calls when warm states hold the nodes
a waiting job needs.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from sat_tasks import config
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io import warm_pool
from sat_tasks.io.warm_pool import WarmState

Log = Callable[[str], None]


def keep_warm(run: JobRun, state: WarmState, log: Log) -> WarmState:
    """The state with the run's staged directory (the nodes are the pipeline's: where the last attempt ran)."""
    return state.model_copy(update={"data_dir": str(run.data_dir)})


def warm_node_first(run: JobRun, pool: list[str]) -> list[str]:
    """The pool with the node this run took over from the warm pool first (the pool as it is without one)."""
    if run.job.warm_pool is None:
        return pool
    nodes = ((warm_pool.read_run_record(run.hook(), run.results_uri).get("reused") or {}).get("nodes")) or []
    return [n for n in nodes if n in pool] + [n for n in pool if n not in nodes]


def release_warm(state: WarmState, log: Log) -> list[str]:
    """Delete the kept staged directory and let the node(s) go; `directory/<path>`, `node/<name>` of each."""
    released = []
    if state.data_dir:
        path = Path(state.data_dir).resolve()
        work = config.work_dir().resolve()
        if path.is_relative_to(work) and path != work and path.exists():
            shutil.rmtree(path, ignore_errors=True)
            released.append(f"directory/{path}")
    released += [f"node/{node}" for node in state.nodes]
    return released


def release_for_capacity(workspace: str, nodes_needed: int, log: Log = print) -> list[str]:
    """Release the workspace's warm states (local backend), oldest first, until `nodes_needed` nodes are free."""
    return warm_pool.release_for_capacity(workspace, nodes_needed, _hook(), warm_pool.warm_roots(), release_warm,
                                          backend="local", log=log)


def release_expired(log: Log = print) -> list[str]:
    """Release every expired warm state of the local backend (the sweep)."""
    return warm_pool.release_expired(_hook(), warm_pool.warm_roots(), release_warm, backend="local", log=log)


def _hook():
    from sat_tasks.io.object_storage import object_storage_hook

    return object_storage_hook(config.sat_setting("object_storage_conn_id"))
