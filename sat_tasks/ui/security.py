"""Who may use the view: Airflow's own permission dependencies per route, and the same-origin check of its forms.

Reading needs GET on the job's DAG; Create needs POST on the generic DAG's runs (and on
connections, when it stores a registry login: `may_store_connection`); Stop and Tags need
PUT, Delete DELETE on the DAG's runs; the Workspaces need Airflow's pool permissions; a job
that names a workspace needs GET on the workspace's pool (`may_use_workspace`). No token or
session cookie: 401 (Airflow's dependencies answer it). Every route that names a run checks the
permission on the run's own DAG (the path's `dag_id`), and then reads and acts only on the
objects of the run's recorded results prefix (`sources.find_job_run`: 404 for a run whose record
reaches another DAG's prefix, ADR 0024), never on a prefix rebuilt from what the URL names.

A run of the generic DAG (a job made with Create, re-run or triggered through the REST API) is
its owner's (ADR 0043): the person Airflow recorded as its `triggering_user_name` (the
authenticated user of Create, Re-run or the REST API's trigger, never a body's field). Every
route that names such a run (`OWN_RUN`) and the list answer it only to the owner, a person who
shares an Airflow team with the owner (multi-team mode), and the operators (PUT on pools: the
Op and Admin roles); anyone else gets the 404 of a run that does not exist.

Cross-site requests (ADR 0019): every state-changing request (`refuse_cross_site_writes`, on
the whole app) is refused when its Origin (or, without one, its Referer) is another site, and
one that the session cookie authenticates must name this origin: a browser sends the cookie
with another site's request, never an `Authorization` header, so a request with a bearer token
(the REST API's clients) and no Origin is the caller's own. Pages may be framed by this origin
only (Airflow's UI embeds them): `FRAME_HEADERS`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.resource_details import (
    ConnectionDetails,
    DagAccessEntity,
    DagDetails,
    PoolDetails,
    TeamDetails,
)
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    requires_access_dag,
    requires_access_pool,
)
from airflow.models.dagrun import DagRun
from fastapi import Depends, HTTPException, Request
from sqlalchemy import select

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.backends.base import workspace_pool_name
from sat_tasks.ui.sources import JobRunFound, find_job_run

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


def is_operator(user: Any) -> bool:
    """Whether the person operates the deployment (PUT on pools: the simple and FAB managers' Op and Admin roles)."""
    return bool(get_auth_manager().is_authorized_pool(method="PUT", user=user))


def _teams_of(user: Any, teams: Iterable[str]) -> set[str]:
    manager = get_auth_manager()
    try:
        return {team for team in teams
                if manager.is_authorized_team(method="GET", user=user, details=TeamDetails(name=team))}
    except NotImplementedError:  # an auth manager without teams
        return set()


def shares_a_team(user: Any, owner: str) -> bool:
    """Whether the person and the owner are in one Airflow team (`[core] multi_team`; else there are no teams).

    An operator's runs are shared with no team (the simple manager puts an admin in every team).
    """
    from airflow.configuration import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return False
    from airflow.models.team import Team

    from sat_tasks.airflow.person_access import find_user

    owner_user = find_user(owner)
    if owner_user is None or is_operator(owner_user):
        return False
    teams = Team.get_all_team_names()
    return bool(_teams_of(owner_user, teams) & _teams_of(user, teams))


def may_see_owned_run(user: Any, owner: str | None) -> bool:
    """Whether the person may read and act on a generic-DAG run that `owner` triggered (None: no person did)."""
    if owner is not None and owner == user.get_name():
        return True
    return is_operator(user) or (owner is not None and shares_a_team(user, owner))


def visible_owners(user: Any, owners: Iterable[str]) -> set[str] | None:
    """Of `owners`, those whose generic-DAG runs the person may see; None: every run (an operator)."""
    if is_operator(user):
        return None
    return {owner for owner in owners if may_see_owned_run(user, owner)}


def refuse_others_runs(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep) -> None:
    """404 for a run of the generic DAG the person may not see (`may_see_owned_run`), as for a run that is not there.

    A job DAG's runs are the DAG's (Airflow's permission on it decides); a run that does not exist is
    left to the route (`sources.find_job_run`), which answers the same 404.
    """
    if dag_id != GENERIC_DAG_ID:
        return
    found = session.execute(select(DagRun.triggering_user_name).where(
        DagRun.dag_id == dag_id, DagRun.run_id == run_id)).first()
    if found is not None and not may_see_owned_run(user, found[0]):
        raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")


def find_visible_run(user: Any, session: Any, dag_id: str, run_id: str, readable: Collection[str]) -> JobRunFound:
    """The run as its own page finds it for the person, for routes that name several (compare, bulk actions):
    404 for a DAG not in `readable` (`readable_dag_ids`), another's generic-DAG run, or no such run."""
    if dag_id not in readable:
        raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
    refuse_others_runs(dag_id, run_id, user, session)
    return find_job_run(session, dag_id, run_id)


SAME_ORIGIN = [Depends(refuse_other_sites)]
OWN_RUN = [Depends(refuse_others_runs)]  # after the DAG's permission: a route that names a generic-DAG run
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


def may_act_on_runs(user: Any, dag_id: str, method: str) -> bool:
    """Whether the person may `method` (PUT: stop; DELETE: delete) the runs of `dag_id`, as CHANGE_RUNS and
    DELETE_RUNS ask on a run's own route (a bulk action asks it per run; the owner is `refuse_others_runs`')."""
    return get_auth_manager().is_authorized_dag(method=method, access_entity=DagAccessEntity.RUN,
                                                details=DagDetails(id=dag_id), user=user)


def may_store_connection(user: Any, conn_id: str, *, exists: bool = False) -> bool:
    """Whether the person may store the connection `conn_id` (a created job's registry login): POST, or PUT when it `exists`."""
    return get_auth_manager().is_authorized_connection(method="PUT" if exists else "POST",
                                                       details=ConnectionDetails(conn_id=conn_id), user=user)


def may_use_workspace(user: Any, workspace: str) -> bool:
    """Whether the person may run a job in `workspace`: GET on its Airflow pool `sat-workspace-<name>` (ADR 0019)."""
    return get_auth_manager().is_authorized_pool(method="GET", details=PoolDetails(name=workspace_pool_name(workspace)),
                                                 user=user)
