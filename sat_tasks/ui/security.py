"""Who may use the view: Airflow's own permission dependencies per route, and the same-origin check of its forms.

Reading needs GET on the job's DAG; Create needs POST on the generic DAG's runs (and on
connections, when it stores a registry login: `may_store_connection`); Stop and Tags need
PUT, Delete DELETE on the DAG's runs; the Workspaces need Airflow's pool permissions. No
token or session cookie: 401 (Airflow's dependencies answer it). A form posted from
another site's page is refused (the session cookie would come with it).
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import (
    ConnectionDetails,
    DagAccessEntity,
)
from airflow.api_fastapi.core_api.security import (
    requires_access_dag,
    requires_access_pool,
)
from fastapi import Depends, HTTPException, Request

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID


def refuse_other_sites(request: Request) -> None:
    """Refuse a form post that another site's page sent (the session cookie would come with it)."""
    own = f"{request.url.scheme}://{request.url.netloc}"
    origin, referer = request.headers.get("origin"), request.headers.get("referer")
    if (origin and origin != own) or (not origin and referer and not referer.startswith(own + "/")):
        raise HTTPException(403, "a form of another site cannot act on Training Jobs")


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


def may_store_connection(user: Any, conn_id: str) -> bool:
    """Whether the person may create the connection `conn_id` (a created job's registry login)."""
    return get_auth_manager().is_authorized_connection(method="POST", details=ConnectionDetails(conn_id=conn_id),
                                                       user=user)
