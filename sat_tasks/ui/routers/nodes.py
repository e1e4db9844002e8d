"""The Nodes page of the Training Jobs view: the node health ledger (quarantined nodes, their evidence) and Release.

`router` serves, below the view's prefix (`/sat`): `GET /nodes` (the page), `POST
/nodes/{node}/release` (the page's Release button: a same-origin form post, then back to the
page), `GET /api/nodes` and `POST /api/nodes/{node}/release` (JSON). The ledger is
`sat_tasks.io.node_ledger` (the one `sat nodes` reads and writes). Nodes are capacity, as
pools are: reading needs Airflow's pool GET permission, releasing its PUT. A fault's job, run,
signature and evidence are the job's: shown only to a person who may read that job's DAG
(`job_reader`); anyone else sees the node's state and "a job you may not read" (issue 44.7).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.config import sat_setting
from sat_tasks.core.node_health import NodeHealth
from sat_tasks.io.node_ledger import NodeLedger, describe, to_json, window_seconds
from sat_tasks.io.object_storage import object_storage_hook
from sat_tasks.pipeline import actions
from sat_tasks.ui.security import (
    CHANGE_POOLS,
    READ_POOLS,
    SAME_ORIGIN,
    readable_dag_ids,
)
from sat_tasks.ui.sources import job_specs
from sat_tasks.ui.templating import templates


def node_ledger() -> NodeLedger:
    """The deployment's ledger on SAT's Object Storage connection (a dependency: tests give their own)."""
    return NodeLedger.for_deployment(object_storage_hook(sat_setting("object_storage_conn_id")))


def user_name(user: GetUserDep) -> str:
    """Who releases: the signed-in Airflow user's name."""
    return str(user.get_name() or user.get_id() or "unknown")


OTHER_JOB = "a job you may not read"


def job_reader(user: GetUserDep) -> Callable[[str], bool]:
    """Whether the signed-in person may read a fault's job: its job DAG's (a job DAG's id is its job's name), else
    the generic DAG's (a job made with Create)."""
    jobs = set(job_specs())
    readable = readable_dag_ids(user, jobs | {GENERIC_DAG_ID})
    return lambda job: job in readable if job in jobs else GENERIC_DAG_ID in readable


def redacted(health: NodeHealth, may_read: Callable[[str], bool]) -> NodeHealth:
    """`health` with the job, run, signature and evidence of each fault the person may not read left out."""
    hidden = {"job": OTHER_JOB, "run_id": "", "signature": "", "evidence": [], "reason": ""}
    faults = [fault if may_read(fault.job) else fault.model_copy(update=hidden) for fault in health.faults]
    return health.model_copy(update={"faults": faults,
                                     "jobs": [job if may_read(job) else OTHER_JOB for job in health.jobs]})


Ledger = Annotated[NodeLedger, Depends(node_ledger)]
UserName = Annotated[str, Depends(user_name)]
MayRead = Annotated[Callable[[str], bool], Depends(job_reader)]
router = APIRouter(tags=["nodes"])


def _release(ledger: NodeLedger, node: str, by: str, note: str) -> dict[str, Any]:
    if node not in {h.node for h in ledger.health()}:
        raise HTTPException(404, f"the node health ledger has no faults of node {node!r} in the window")
    lines: list[str] = []
    marker = actions.release_node(ledger, node, by=by, note=note, log=lines.append)
    return {"released": marker.model_dump(mode="json"), "lines": lines}


@router.get("/api/nodes", dependencies=READ_POOLS)
def list_nodes(ledger: Ledger, may_read: MayRead) -> dict[str, Any]:
    return {"window_seconds": window_seconds(), "nodes": [to_json(redacted(h, may_read)) for h in ledger.health()]}


@router.post("/api/nodes/{node}/release", dependencies=CHANGE_POOLS)
def release_node(node: str, ledger: Ledger, by: UserName, body: dict | None = None) -> dict[str, Any]:
    return _release(ledger, node, by, str((body or {}).get("note") or ""))


@router.get("/nodes", response_class=HTMLResponse, dependencies=READ_POOLS)
def nodes_page(request: Request, ledger: Ledger, may_read: MayRead, released: str | None = None) -> HTMLResponse:
    fleet = [redacted(h, may_read) for h in ledger.health()]
    rows = [{"health": h, "lines": describe(h)[1:],
             "since": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(h.since)) if h.since else ""}
            for h in fleet]
    return templates.TemplateResponse(request, "nodes.html", {
        "rows": rows, "window_hours": window_seconds() / 3600, "released": released,
        "quarantined": sum(h.quarantined for h in fleet)})


@router.post("/nodes/{node}/release", dependencies=CHANGE_POOLS + SAME_ORIGIN)
def release_node_form(node: str, ledger: Ledger, by: UserName,
                      note: Annotated[str, Form()] = "") -> RedirectResponse:
    _release(ledger, node, by, note)
    # Paths, not request.url_for: inside Airflow the view is mounted as one ASGI app whose routes
    # the outer router cannot name (url_for raised NoMatchFound there, a 500 on every non-empty page).
    return RedirectResponse(f"/sat/nodes?released={quote(node, safe='')}", status_code=303)
