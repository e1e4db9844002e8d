"""Who may use the view: Airflow's own permission dependencies per route, and the same-origin check of its forms.

Reading needs GET on the job's DAG; Create needs POST on the generic DAG's runs (and on
connections, when it stores a registry login: `may_store_connection`); Stop and Tags need
PUT, Delete DELETE on the DAG's runs; the Workspaces need Airflow's pool permissions; a job
that names a workspace needs GET on the workspace's pool (`may_use_workspace`). No token or
session cookie: 401 (Airflow's dependencies answer it). Every route that names a run checks the
permission on the run's own DAG (the path's `dag_id`), and then reads and acts only on the
objects of the run's recorded results prefix (`sources.find_job_run`: 404 for a run whose record
reaches another DAG's prefix, ADR 0024), never on a prefix rebuilt from what the URL names.

Cross-site requests (ADR 0019): every state-changing request (`refuse_cross_site_writes`, on
the whole app) is refused when its Origin (or, without one, its Referer) is another site, and
one that the session cookie authenticates must name this origin: a browser sends the cookie
with another site's request, never an `Authorization` header, so a request with a bearer token
(the REST API's clients) and no Origin is the caller's own. Pages may be framed by this origin
only (Airflow's UI embeds them): `FRAME_HEADERS`.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.resource_details import (
    ConnectionDetails,
    DagAccessEntity,
    PoolDetails,
)
from airflow.api_fastapi.core_api.security import (
    requires_access_dag,
    requires_access_pool,
)
from fastapi import Depends, HTTPException, Request

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.backends.base import workspace_pool_name

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Only this origin may frame the view's pages (Airflow's UI, same origin as its API server, does).
FRAME_HEADERS = {"X-Frame-Options": "SAMEORIGIN", "Content-Security-Policy": "frame-ancestors 'self'"}


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def _sender(request: Request) -> tuple[str | None, bool]:
    """The origin the request names (Origin, else Referer's), and whether it is this one."""
    own = _own_origin(request)
    origin, referer = request.headers.get("origin"), request.headers.get("referer")
    if origin:
        return origin, origin == own
    if referer:
        return referer, referer == own or referer.startswith(own + "/")
    return None, False


def refuse_other_sites(request: Request) -> None:
    """Refuse a form post that another site's page sent (the session cookie would come with it)."""
    sender, same = _sender(request)
    if sender is not None and not same:
        raise HTTPException(403, "a form of another site cannot act on Training Jobs")


def cookie_authenticated(request: Request) -> bool:
    """Whether the session cookie is the request's identity (no bearer token, which a browser never adds by itself)."""
    authorization = request.headers.get("authorization", "")
    return COOKIE_NAME_JWT_TOKEN in request.cookies and not authorization.lower().startswith("bearer ")


def refuse_cross_site_writes(request: Request) -> None:
    """On every state-changing request: another site's Origin/Referer is refused, and a cookie needs this origin's."""
    if request.method.upper() in SAFE_METHODS:
        return
    refuse_other_sites(request)
    if cookie_authenticated(request) and _sender(request)[0] is None:
        raise HTTPException(403, "a request with the session cookie must come from this site's pages "
                                 "(send Origin), or authenticate with a bearer token")


SAME_ORIGIN = [Depends(refuse_other_sites)]
READ_JOBS = [Depends(requires_access_dag("GET"))]
CREATE_JOBS = [Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=GENERIC_DAG_ID))]
CHANGE_RUNS = [Depends(requires_access_dag("PUT", DagAccessEntity.RUN))]
DELETE_RUNS = [Depends(requires_access_dag("DELETE", DagAccessEntity.RUN))]
READ_POOLS = [Depends(requires_access_pool("GET"))]
CREATE_POOLS = [Depends(requires_access_pool("POST"))]
CHANGE_POOLS = [Depends(requires_access_pool("PUT"))]
DELETE_POOLS = [Depends(requires_access_pool("DELETE"))]


def readable_dag_ids(user: Any, dag_ids: set[str]) -> set[str]:
    """Those of `dag_ids` the person may read (the list shows no row of another)."""
    return get_auth_manager().get_authorized_dag_ids(user=user, method="GET") & dag_ids


def may_store_connection(user: Any, conn_id: str, *, exists: bool = False) -> bool:
    """Whether the person may store the connection `conn_id` (a created job's registry login): POST, or PUT when it `exists`."""
    return get_auth_manager().is_authorized_connection(method="PUT" if exists else "POST",
                                                       details=ConnectionDetails(conn_id=conn_id), user=user)


def may_use_workspace(user: Any, workspace: str) -> bool:
    """Whether the person may run a job in `workspace`: GET on its Airflow pool `sat-workspace-<name>` (ADR 0019)."""
    return get_auth_manager().is_authorized_pool(method="GET", details=PoolDetails(name=workspace_pool_name(workspace)),
                                                 user=user)
