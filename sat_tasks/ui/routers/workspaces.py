"""Training Workspaces (ADR 0015): list, create, edit the node count, delete; Airflow's pool permissions.

JSON: `GET|POST /api/workspaces`, `PUT /api/workspaces/{name}` (`{"nodes": n}`),
`DELETE /api/workspaces/{name}`: 422 with `{"field", "rule"}` problems, 409 with the jobs
that run or wait there, 404 for an unknown name. HTML: `GET|POST /workspaces`,
`POST /workspaces/{name}/nodes`, `POST /workspaces/{name}/delete` (asks first; `confirm=yes`
deletes). Each change also sets the workspace's Airflow pool (`sat-workspace-<name>`, a slot
per node; `sat_tasks.airflow.workspace_pools`, which `sat workspace` uses too), which queues
its jobs where nothing else does. The form handlers read the form on the event loop and write
(the YAML, the Airflow pool) off it, as a sync endpoint does: on the loop a write waits out
SQLite's busy timeout (ADR 0009, c7d6537).
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.airflow.workspace_pools import set_workspace_pool
from sat_tasks.core.clock import now_utc
from sat_tasks.core.workspaces import WorkspaceUse, merge_uses
from sat_tasks.io.workspaces import (
    SlotBoard,
    WorkspaceNotFound,
    WorkspaceRefused,
    WorkspaceStore,
)
from sat_tasks.spec import SpecError
from sat_tasks.spec.loading import SpecProblem
from sat_tasks.spec.workspace import Workspace, parse_workspace
from sat_tasks.ui import dag_runs
from sat_tasks.ui import workspaces as pages
from sat_tasks.ui.jobs import job_of
from sat_tasks.ui.routers.jobs import usage_by_workspace
from sat_tasks.ui.security import (
    CHANGE_POOLS,
    CREATE_POOLS,
    DELETE_POOLS,
    READ_POOLS,
    SAME_ORIGIN,
)
from sat_tasks.ui.sources import job_specs

router = APIRouter(tags=["Training Workspaces"])


# ---- JSON ------------------------------------------------------------------------------------------
@router.get("/api/workspaces", dependencies=READ_POOLS)
def list_workspaces(session: SessionDep, user: GetUserDep):
    """Every workspace with who runs and waits there, and the GPU-/node-hours its jobs' runs used (`usage`)."""
    return {"workspaces": rows(session, user)}


@router.post("/api/workspaces", dependencies=CREATE_POOLS, status_code=201)
def post_workspace(body: dict, session: SessionDep):
    try:
        workspace = create_workspace(body, session)
    except SpecError as exc:
        return _problems_json(exc)
    return {"workspace": workspace.to_dict()}


@router.put("/api/workspaces/{name}", dependencies=CHANGE_POOLS)
def put_workspace(name: str, body: dict, session: SessionDep):
    try:
        workspace = set_nodes(name, body.get("nodes"), session)
    except SpecError as exc:
        return _problems_json(exc)
    except WorkspaceRefused as exc:
        return JSONResponse({"detail": str(exc)}, status_code=409)
    return {"workspace": workspace.to_dict(), "effective": "for the next job that starts"}


@router.delete("/api/workspaces/{name}", dependencies=DELETE_POOLS)
def delete_workspace_api(name: str, session: SessionDep):
    try:
        workspace = delete_workspace(name, session)
    except WorkspaceRefused as exc:
        return JSONResponse({"detail": str(exc)}, status_code=409)
    return {"deleted": workspace.name}


def _problems_json(exc: SpecError) -> JSONResponse:
    return JSONResponse({"detail": "invalid workspace", "errors": [p.model_dump() for p in exc.problems]},
                        status_code=422)


# ---- HTML ------------------------------------------------------------------------------------------
@router.get("/workspaces", dependencies=READ_POOLS, response_class=HTMLResponse)
def workspaces_view(session: SessionDep, user: GetUserDep, created: str | None = None, resized: str | None = None,
                    deleted: str | None = None):
    notice = pages.done_notice(created=created, resized=resized, deleted=deleted)
    return pages.workspaces_page(rows(session, user), notice=notice)


@router.post("/workspaces", dependencies=CREATE_POOLS + SAME_ORIGIN, response_class=HTMLResponse)
async def create_from_form(request: Request, session: SessionDep, user: GetUserDep):
    values = {key: str(value) for key, value in (await request.form()).items()}
    return await run_in_threadpool(_create_and_answer, values, session, user)


def _create_and_answer(values: dict[str, str], session: Any, user: Any):
    try:
        workspace = create_workspace(pages.workspace_from_form(values), session)
    except SpecError as exc:
        return HTMLResponse(pages.workspaces_page(rows(session, user), values=values,
                                                  errors=pages.problems_by_field(exc.problems)), status_code=422)
    return _done(created=workspace.name)


@router.post("/workspaces/{name}/nodes", dependencies=CHANGE_POOLS + SAME_ORIGIN, response_class=HTMLResponse)
async def nodes_from_form(name: str, request: Request, session: SessionDep, user: GetUserDep):
    text = str((await request.form()).get("nodes") or "").strip()
    return await run_in_threadpool(_nodes_and_answer, name, text, session, user)


def _nodes_and_answer(name: str, text: str, session: Any, user: Any):
    try:
        workspace = set_nodes(name, int(text) if text.lstrip("-").isdigit() else text, session)
    except SpecError as exc:
        return HTMLResponse(pages.workspaces_page(rows(session, user), refusal="; ".join(map(str, exc.problems))),
                            status_code=422)
    except WorkspaceRefused as exc:
        return HTMLResponse(pages.workspaces_page(rows(session, user), refusal=str(exc)), status_code=409)
    return _done(resized=workspace.name)


@router.post("/workspaces/{name}/delete", dependencies=DELETE_POOLS + SAME_ORIGIN, response_class=HTMLResponse)
async def delete_from_form(name: str, request: Request, session: SessionDep, user: GetUserDep):
    confirmed = (await request.form()).get("confirm") == "yes"
    return await run_in_threadpool(_delete_and_answer, name, confirmed, session, user)


def _delete_and_answer(name: str, confirmed: bool, session: Any, user: Any):
    if not confirmed:  # the row's Delete asks first, as a job's Delete does
        try:
            WorkspaceStore().get(name)
        except WorkspaceNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        return pages.workspaces_page(rows(session, user), confirm_delete=name)
    try:
        workspace = delete_workspace(name, session)
    except WorkspaceRefused as exc:
        return HTMLResponse(pages.workspaces_page(rows(session, user), refusal=str(exc)), status_code=409)
    return _done(deleted=workspace.name)


def _done(**what: str) -> RedirectResponse:
    """After a change: 303 to the list (Post/Redirect/Get), so a reload does not post it again."""
    return RedirectResponse(f"/sat/workspaces?{urlencode(what)}", status_code=303)


# ---- what the routes do ----------------------------------------------------------------------------
def uses_of(name: str, session: Any) -> list[WorkspaceUse]:
    """Who runs or waits there: the local slot board first, then the queued and running Airflow runs."""
    jobs = job_specs()
    from_runs = []
    for ref in dag_runs.active_runs(session, set(jobs) | {GENERIC_DAG_ID}):
        job = job_of(ref, jobs, GENERIC_DAG_ID)
        if job is not None and job.workspace == name:
            from_runs.append(WorkspaceUse(job.name, ref.run_id, job.nodes, ref.state))
    return merge_uses(SlotBoard(name).uses(), from_runs)


def rows(session: Any, user: Any) -> list[dict[str, Any]]:
    """The list's rows: every workspace with who runs and who waits there, and what its jobs' runs used (the runs
    of the Training Jobs the person may read: GPU- and node-hours, every attempt, failovers included)."""
    used = usage_by_workspace(user, session)
    return [pages.workspace_row(ws, uses_of(ws.name, session), used.get(ws.name)) for ws in WorkspaceStore().list()]


def create_workspace(data: dict[str, Any], session: Any) -> Workspace:
    """Create the workspace (422 problems as SpecError; a contract that has ended too) and its Airflow pool."""
    ended = contract_ended(parse_workspace(data, source=str(data.get("name") or "<workspace>")), now_utc().date())
    if ended is not None:
        raise SpecError(str(data.get("name")), [ended])
    workspace = WorkspaceStore().create(data)
    set_workspace_pool(workspace.name, workspace.nodes, session)
    return workspace


def contract_ended(workspace: Workspace, today: dt.date) -> SpecProblem | None:
    """A new workspace whose contract ended before `today` reserves nothing: the problem, on `contract.end`."""
    if workspace.contract.end >= today:
        return None
    return SpecProblem(field="contract.end", rule=f"the contract ended on {workspace.contract.end.isoformat()}; "
                                                  f"a new workspace's contract must run until today "
                                                  f"({today.isoformat()}) or later")


def set_nodes(name: str, nodes: Any, session: Any) -> Workspace:
    """Change the node count (refused below what runs there) and the pool's slots; 404 for an unknown name."""
    try:
        workspace = WorkspaceStore().set_nodes(name, nodes, uses_of(name, session))
    except WorkspaceNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    set_workspace_pool(name, workspace.nodes, session)
    return workspace


def delete_workspace(name: str, session: Any) -> Workspace:
    """Delete the workspace (refused while jobs run or wait there) and its pool; 404 for an unknown name."""
    try:
        workspace = WorkspaceStore().delete(name, uses_of(name, session))
    except WorkspaceNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    set_workspace_pool(name, None, session)
    return workspace
