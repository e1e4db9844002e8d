"""A Training Workspace's Airflow pool, `sat-workspace-<name>` (a slot per node), kept in step with its definition.

Who calls it: the Workspaces page (`sat_tasks.ui.routers.workspaces`, in the API server's session) and
`sat workspace create|edit|delete` (`sync_workspace_pool`, its own session). The pool queues
a workspace's job DAGs' `launch` tasks on a backend whose `capabilities.workspace_pool` says
so, where nothing else queues them (on Kubernetes: without Kueue; ADR 0015). It is kept for
every workspace whichever backend a job picks: a spec chooses its backend, the workspace does not.
"""

from __future__ import annotations

from pathlib import Path

from sat_tasks.backends.base import workspace_pool_name as pool_name
from sat_tasks.errors import SatError


class MetadataDBUnreachable(SatError):
    """The Airflow metadata DB cannot be read or written here (missing, not migrated, down)."""


def set_workspace_pool(name: str, nodes: int | None, session) -> None:
    """Create or resize the workspace's pool to `nodes` slots; `nodes=None` deletes it (if there is one)."""
    from airflow.models.pool import Pool

    pool = pool_name(name)
    if nodes is None:
        if Pool.get_pool(pool, session=session) is not None:
            Pool.delete_pool(pool, session=session)
    else:
        Pool.create_or_update_pool(pool, nodes, f"Training Workspace {name}: a slot per node", False,
                                   session=session)


def sync_workspace_pool(name: str, nodes: int | None) -> str:
    """Set the pool in the metadata DB that the Airflow config in effect names, committed; the line to print.

    Raises MetadataDBUnreachable (with why) when that DB cannot be used: a SQLite file that
    does not exist (it is not created here), a DB that was never migrated, a server that
    does not answer.
    """
    try:
        from airflow import settings
        from sqlalchemy.exc import SQLAlchemyError

        engine = settings.engine
        if engine is None:
            settings.configure_orm()
            engine = settings.engine
        url = engine.url
    except Exception as exc:  # noqa: BLE001 - any failure to configure Airflow's ORM means: no DB here
        raise MetadataDBUnreachable(f"the Airflow metadata DB is not configured ({_short(exc)})") from None
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).is_file():
        raise MetadataDBUnreachable(f"the Airflow metadata DB {url.database} does not exist")
    try:
        from airflow.utils.session import create_session

        with create_session() as session:
            set_workspace_pool(name, nodes, session)
    except SQLAlchemyError as exc:
        raise MetadataDBUnreachable(
            f"the Airflow metadata DB {url.render_as_string(hide_password=True)} is not reachable "
            f"({_short(exc)})") from None
    pool = pool_name(name)
    return f"Airflow pool {pool} deleted" if nodes is None else f"Airflow pool {pool}: {nodes} slot(s)"


def _short(exc: BaseException) -> str:
    """The first line of an exception's message, without SQLAlchemy's statement and background link."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
