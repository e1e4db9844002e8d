"""Training Jobs: the list (JSON and the "Training Jobs" page) and Create (the form, and `POST /api/jobs`)."""

from __future__ import annotations

import json
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.dagbag import DagBagDep
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.airflow.params import params_from_spec
from sat_tasks.backends.base import workspace_pool_name
from sat_tasks.config import allowed_backends
from sat_tasks.core.clock import now_utc
from sat_tasks.core.workspaces import job_problems
from sat_tasks.io.notify_targets import notification_problems
from sat_tasks.io.workspaces import WorkspaceStore
from sat_tasks.pipeline.actions import VIA, VIA_API
from sat_tasks.spec import SpecProblem
from sat_tasks.spec.env_secrets import env_secret_problems
from sat_tasks.spec.loading import MAX_NESTING
from sat_tasks.spec.model import backend_problem
from sat_tasks.ui import dag_runs, pages, run_index
from sat_tasks.ui.create import (
    ADVANCED_FIELD,
    FormResult,
    add_problems,
    form_values,
    validate_form,
)
from sat_tasks.ui.security import (
    CREATE_JOBS,
    OWN_RUN,
    READ_JOBS,
    SAME_ORIGIN,
    may_store_connection,
    may_use_workspace,
    readable_dag_ids,
    visible_owners,
)
from sat_tasks.ui.sources import (
    find_job_run,
    job_specs,
    json_reader,
    object_storage,
    uri_exists,
)

router = APIRouter(tags=["Training Jobs"])
STATUS = Query(None, description="a status word, e.g. Running or Completed")
SEARCH = Query(None, description="a part of the job's name or run id")
TAG = Query(None, description="a tag: key or key=value")
PAGE = Query(None, description="the page (from 1); more filters and sort: see the description")


@router.get("/api/jobs", dependencies=READ_JOBS)
def list_jobs(request: Request, user: GetUserDep, session: SessionDep, status: str | None = STATUS,
              q: str | None = SEARCH, tag: str | None = TAG, page: int | None = PAGE):
    """Every run of the Training Jobs the person may read: filtered, sorted and paged in the query (ADR 0022).

    Filters: `status`, `q` (a part of the name or run id), `tag` (`key` or `key=value`),
    `framework`, `learning_type`, `workspace`, `creator`, `since`/`until` (submitted; a date
    or an ISO time); `sort` (one of `run_index.SORTS`) and `order` (`asc`/`desc`); `page`,
    `per_page` (at most 200). The answer: `jobs` (this page), `total`, `pages`, and
    `gpu_hours_by_workspace` over every matching run.
    """
    try:
        query = run_index.parse_query(request.query_params)
    except run_index.ListQueryError as exc:
        return JSONResponse({"detail": "the list query is not valid", "errors": [{"field": exc.field, "rule": exc.rule}]},
                            status_code=422)
    return jobs_page(user, session, query).to_dict()


@router.get("/jobs", dependencies=READ_JOBS, response_class=HTMLResponse)
def jobs_view(request: Request, user: GetUserDep, session: SessionDep):
    try:
        query, problem = run_index.parse_query(request.query_params), None
    except run_index.ListQueryError as exc:
        query, problem = run_index.ListQuery(), exc
    found = jobs_page(user, session, query)
    return HTMLResponse(pages.list_page(found, run_index.choices(session, found.readable, found.owners), problem),
                        status_code=422 if problem else 200)


@router.get("/jobs/new", dependencies=CREATE_JOBS, response_class=HTMLResponse)
def create_form():
    return pages.create_page()


# The most a Create request's body may hold (issue 44.7): a spec is a few KiB; 6 MB of Advanced JSON held the API
# server 26 s and answered an 18 MB error. Past it: 413, read no further.
MAX_CREATE_BYTES = 256 * 1024
CREATE_BODY_RULE = f"the request body is larger than {MAX_CREATE_BYTES} bytes (the Create form's fields)"
CREATE_BODY_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["form"],
    "properties": {"form": {"type": "object", "description": "the Create form's fields: {<field>: <value>, ...}"}},
}}}}}


async def bounded_body(request: Request, limit: int = MAX_CREATE_BYTES) -> bytes:
    """The request's body, read up to `limit` bytes (413 past it, by its Content-Length or as it streams); kept as
    starlette's cached body, so `request.form()` parses it without reading again."""
    declared = request.headers.get("content-length") or ""
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, CREATE_BODY_RULE)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, CREATE_BODY_RULE)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # starlette's own cache of the body, which form() reads
    return body


@router.post("/jobs/new", dependencies=CREATE_JOBS + SAME_ORIGIN, response_class=HTMLResponse)
async def create_from_form(request: Request, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    await bounded_body(request)
    values = {key: str(value) for key, value in (await request.form()).items()}
    # The writes (connection, DAG run) block on SQLite's lock: off the event loop, as a sync
    # endpoint's are, or the loop waits out the busy timeout for a lock another request of this
    # server holds and needs the loop to release ("database is locked", a 500, seen under load).
    return await run_in_threadpool(_create_and_answer, values, user, session, dag_bag)


def _create_and_answer(values: dict[str, str], user: Any, session: Any, dag_bag: Any):
    result, run = create_job_run(values, user, session, dag_bag)
    if run is None:
        return HTMLResponse(pages.create_page(result.values, result.errors), status_code=422)
    session.commit()
    return RedirectResponse(f"/sat/{pages.job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}", status_code=303)


@router.post("/api/jobs", dependencies=CREATE_JOBS, status_code=201, openapi_extra=CREATE_BODY_SCHEMA)
async def create_job(request: Request, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    raw = await bounded_body(request)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's recursion (issue 44.7)
        raise HTTPException(422, "the body must be JSON: {\"form\": {<field>: <value>, ...}}, nested at most "
                                 f"{MAX_NESTING} levels") from None
    return await run_in_threadpool(_create_from_api, body, user, session, dag_bag)


def _create_from_api(body: Any, user: Any, session: Any, dag_bag: Any):
    form = body.get("form") if isinstance(body, dict) else None
    if not isinstance(form, dict):
        raise HTTPException(422, "the body must be {\"form\": {<field>: <value>, ...}} (the Create form's fields)")
    result, run = create_job_run({k: "" if v is None else str(v) for k, v in form.items()}, user, session, dag_bag)
    if run is None:
        return JSONResponse({"detail": "the job was not started", "errors": result.problems}, status_code=422)
    return {"dag_id": run.dag_id, "run_id": run.run_id, "job": result.job.name,
            "page": f"/sat/{pages.job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}"}


def jobs_page(user: Any, session: Any, query: run_index.ListQuery) -> run_index.JobsPage:
    """The page of the list `query` asks for, over every run of the Training Job DAGs the person may read.

    The index follows Airflow and the pipeline first (`run_index.sync`: the metadata DB only,
    unless a run must be read once); specs come from the cache (parsed once per file change). Its cost does not
    grow with the number of specs (issue 48.5): the cache stats the jobs directory, not each file; the queries
    name the DAGs with indexed runs, not every spec's DAG.
    """
    jobs = synced_index(session)
    readable = readable_dag_ids(user, set(jobs) | {GENERIC_DAG_ID})
    owners = generic_owners(user, session)
    found = run_index.list_runs(session, query, readable, owners=owners)
    run_index.note_next_runs(session, found.rows, jobs)  # the page's scheduled DAGs alone (issue 48.5)
    found.readable, found.owners = readable, owners
    return found


def generic_owners(user: Any, session: Any) -> run_index.Owners | None:
    """Whose runs of the generic DAG the person sees in the list (ADR 0043); None: everyone's (an operator)."""
    visible = visible_owners(user, run_index.creators(session, GENERIC_DAG_ID))
    return None if visible is None else (GENERIC_DAG_ID, frozenset(visible))


def synced_index(session: Any) -> dict[str, Any]:
    """Bring the index in step with Airflow and the pipeline (`run_index.sync`); the job DAGs' specs it used."""
    jobs = job_specs()
    run_index.ensure_table(session)
    run_index.sync(session, jobs, GENERIC_DAG_ID, read_json=lambda: json_reader(object_storage()))
    return jobs


def usage_by_workspace(user: Any, session: Any) -> dict[str, dict[str, float]]:
    """GPU-hours, node-hours and runs per workspace over every run of the Training Jobs the person may read."""
    jobs = synced_index(session)
    return run_index.usage_by_workspace(session, readable_dag_ids(user, set(jobs) | {GENERIC_DAG_ID}))


def workspace_problems(job: Any) -> list[Any]:
    """Why the job's workspace cannot take it today (none named, unknown, contract ended, too small): `validate_spec`'s rule."""
    if job.workspace is None:
        return []
    store = WorkspaceStore()
    return job_problems(job, store.find(job.workspace), now_utc().date(), [w.name for w in store.list()])


def notification_refusals(job: Any, user: Any) -> list[SpecProblem]:
    """The job's notifications that may not be sent (`io.notify_targets`): a connection neither listed nor an http
    connection the person may read, an endpoint off the connection's host, an SMTP connection not listed."""
    if not job.notifications:
        return []
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        ConnectionDetails,
    )

    def may_read(conn_id: str) -> bool:
        return get_auth_manager().is_authorized_connection(method="GET", details=ConnectionDetails(conn_id=conn_id),
                                                           user=user)

    lines = notification_problems(job.notifications, may_read, person=user.get_name())
    return [SpecProblem(field=line.split(": ", 1)[0], rule=line.split(": ", 1)[1]) for line in lines]


def create_job_run(values: dict[str, str], user: Any, session: Any, dag_bag: Any) -> tuple[FormResult, Any]:
    """Validate the form; store the registry login as a connection; start the generic DAG's run (None: not started)."""
    hook = object_storage()
    result = validate_form(values, exists=lambda uri: uri_exists(hook, uri))
    if result.job is None:
        return result, None
    refused = backend_problem(result.job, allowed_backends())
    if refused is not None:  # as validate_spec would refuse it (ADR 0019): say so now, start nothing
        result.add(ADVANCED_FIELD, *refused.split(": ", 1))
        result.job = None
        return result, None
    # The permission first: whether a workspace exists is not told to a person who may not use it.
    if result.job.workspace is not None and not may_use_workspace(user, result.job.workspace):
        raise HTTPException(403, f"workspace: running a job in workspace {result.job.workspace} needs the "
                                 f"permission to read its pool {workspace_pool_name(result.job.workspace)}")
    if add_problems(result, workspace_problems(result.job)).job is None:  # as validate_spec would, before it runs
        return result, None
    if add_problems(result, notification_refusals(result.job, user)).job is None:  # issue 44.2, as validate_spec
        return result, None
    if result.registry is not None:
        exists = dag_runs.connection_exists(session, result.registry.conn_id)
        if not may_store_connection(user, result.registry.conn_id, exists=exists):
            raise HTTPException(403, "storing a registry login needs the permission to "
                                     + ("edit the existing connection " if exists else "create the connection ")
                                     + result.registry.conn_id)
        dag_runs.store_registry_login(session, result.registry)
    run = dag_runs.start_run(dag_bag, session, GENERIC_DAG_ID, params_from_spec(result.job), user_name=user.get_name(),
                             note=f"created by {user.get_name()} in the Training Jobs view")
    return result, run


# ---- Clone and Re-run (from a run's page) -------------------------------------------------------------
# a new run of the run's DAG; a run of the generic DAG: its owner's (ADR 0043)
RERUN_JOBS = READ_JOBS + [Depends(requires_access_dag("POST", DagAccessEntity.RUN))] + OWN_RUN


@router.get("/jobs/{dag_id}/runs/{run_id}/clone", dependencies=READ_JOBS + CREATE_JOBS + OWN_RUN,
            response_class=HTMLResponse)
def clone_form(dag_id: str, run_id: str, session: SessionDep):
    """"Create from this job": the Create form filled in from the run's spec (the registry password excepted)."""
    found = find_job_run(session, dag_id, run_id)
    return pages.create_page(form_values(found.job), notice=(
        f"A copy of {found.job.name} (run {run_id}): change what you need, then Create. The registry password is "
        "never copied: the copy pulls with the same connection unless you type another login."))


@router.post("/api/jobs/{dag_id}/runs/{run_id}/rerun", dependencies=RERUN_JOBS, status_code=201)
def rerun_job(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    run = rerun(dag_id, run_id, user, session, dag_bag, via=VIA_API)
    return {"dag_id": run.dag_id, "run_id": run.run_id, "rerun_of": run_id,
            "page": f"/sat/{pages.job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}"}


@router.post("/jobs/{dag_id}/runs/{run_id}/rerun", dependencies=RERUN_JOBS + SAME_ORIGIN,
             response_class=HTMLResponse)
def rerun_from_page(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    run = rerun(dag_id, run_id, user, session, dag_bag, via=VIA)
    session.commit()
    return RedirectResponse(f"/sat/{pages.job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}", status_code=303)


def rerun(dag_id: str, run_id: str, user: Any, session: Any, dag_bag: Any, *, via: str) -> Any:
    """Start the run's spec again as a new run of the same DAG (409 with the rule when it cannot start now)."""
    found = find_job_run(session, dag_id, run_id)
    refused = backend_problem(found.job, allowed_backends())
    problems = ([refused] if refused else []) + [str(p) for p in workspace_problems(found.job)]
    problems += [f"{name}: {rule}" for name, rule in env_secret_problems(found.job.env)]  # not again (ADR 0043)
    if problems:
        raise HTTPException(409, "the job cannot start again now: " + "; ".join(problems))
    if found.job.workspace is not None and not may_use_workspace(user, found.job.workspace):
        raise HTTPException(403, f"workspace: running a job in workspace {found.job.workspace} needs the "
                                 f"permission to read its pool {workspace_pool_name(found.job.workspace)}")
    # the generic DAG: the run's own conf again (Airflow merges the Params' defaults as it did), not the form values
    # of its validated record, which holds what validate_spec filled in (the backend, the results' DAG); a run with
    # no conf left (none recorded) gets its job's form values. A spec file's DAG holds its spec.
    conf = (dict(found.ref.conf) or params_from_spec(found.job)) if dag_id == GENERIC_DAG_ID else {}
    return dag_runs.start_run(dag_bag, session, dag_id, conf, user_name=user.get_name(),
                              note=f"re-run of {run_id} by {user.get_name()} through {via}")
