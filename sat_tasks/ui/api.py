"""The Training Jobs API and pages, mounted in Airflow's API server by `plugins/sat_training_jobs.py` under `/sat`.

Every endpoint sits behind Airflow's own authentication and permissions (the same
dependencies the core REST API uses): no token or session cookie, 401; a person without
the permission on a job's DAG, 403 on its page and actions, and no row in the list.
Reading needs GET on the DAG; Create needs POST on the generic DAG's runs (and on
connections, when it stores a registry login); Stop and Tags need PUT, Delete DELETE on
the DAG's runs. Forms post to the same origin: a post from another site is refused.

JSON (`/sat/api/...`):
- `GET  /api/jobs[?status=<status word>]`: the list, newest first.
- `POST /api/jobs`: create a job from `{"form": {<field>: <value>, ...}}` (the Create
  form's fields): 201 with the run, or 422 with every problem as `{"field", "rule"}`.
- `GET  /api/jobs/{dag_id}/runs/{run_id}`: the job page's data.
- `GET  /api/jobs/{dag_id}/runs/{run_id}/log`: the job log (all attempts), a download;
  404 until the run has uploaded it (at its end).
- `POST /api/jobs/{dag_id}/runs/{run_id}/stop`: stop the job (202), naming who asked.
- `PUT  /api/jobs/{dag_id}/runs/{run_id}/tags`: replace the run's tags (`{"tags": {...}}`).
- `DELETE /api/jobs/{dag_id}/runs/{run_id}[?delete_results=true]`: delete the run; its
  results stay in Object Storage unless asked; 409 while it runs.

Workspaces (ADR 0015; `add_workspace_routes`): `GET|POST /api/workspaces`, `PUT|DELETE
/api/workspaces/{name}`, and the "Workspaces" menu entry's page `GET|POST /workspaces`.

HTML: `GET /jobs` (the "Training Jobs" menu entry), `GET|POST /jobs/new` (Create Training
Job), `GET /jobs/{dag_id}/runs/{run_id}` (the job page), `GET .../report` (the job report's
plots from the metrics series so far; the Monitoring tab embeds it), and the forms
`POST .../stop`, `POST .../tags`, `GET|POST .../delete`.
"""

from typing import Any

from sat_tasks.ui.jobs import RunRef, job_log_uri, job_of, job_page, list_rows

LIST_LIMIT = 200


def _jobs() -> dict:
    from sat_tasks.airflow.job_dags import load_job_dags
    from sat_tasks.config import sat_setting

    return load_job_dags(sat_setting("jobs_dir"), build=False).jobs


def _hook():
    from sat_tasks.config import sat_setting
    from sat_tasks.io.object_storage import object_storage_hook

    return object_storage_hook(sat_setting("object_storage_conn_id"))


def _reader(hook):
    from sat_tasks.io.object_storage import read_json

    def read(uri: str) -> Any:
        try:
            return read_json(hook, uri)
        except Exception:
            return None

    return read


def _ref(run, next_run=None) -> RunRef:
    state = getattr(run.state, "value", run.state)
    return RunRef(dag_id=run.dag_id, run_id=run.run_id, state=str(state), start_date=run.start_date,
                  end_date=run.end_date, conf=dict(run.conf or {}), next_run=next_run)


class LazyApp:
    """An ASGI app that builds `factory()` on its first request.

    Every Airflow process that loads plugins (task processes too) imports the plugin
    module; building the FastAPI app there would import the API server's modules (~2 s)
    into each task. Only the API server ever calls it.
    """

    def __init__(self, factory) -> None:
        self._factory = factory
        self._app = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            self._app = self._factory()
        await self._app(scope, receive, send)


def create_app():
    """The FastAPI app the plugin mounts (imports the API server's modules: call it only there)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        ConnectionDetails,
        DagAccessEntity,
    )
    from airflow.api_fastapi.common.dagbag import (
        DagBagDep,
        get_dag_for_run,
        get_latest_version_of_dag,
    )
    from airflow.api_fastapi.common.db.common import SessionDep
    from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
    from airflow.models.dag import DagModel
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from fastapi import Depends, FastAPI, HTTPException, Query, Request
    from fastapi.responses import (
        HTMLResponse,
        JSONResponse,
        PlainTextResponse,
        RedirectResponse,
    )
    from sqlalchemy import select

    from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
    from sat_tasks.io.run_layout import JobRun
    from sat_tasks.spec import split_s3_uri
    from sat_tasks.ui import actions
    from sat_tasks.ui.create import validate_form
    from sat_tasks.ui.pages import (
        create_page,
        delete_page,
        deleted_page,
        job_href,
        job_page_html,
        list_page,
    )

    app = FastAPI(title="SAT Training Jobs", description=__doc__)
    app.state.dag_bag = DBDagBag()  # what DagBagDep reads: the serialized DAGs, from the metadata DB
    read_dags = [Depends(requires_access_dag("GET"))]
    create_runs = [Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=GENERIC_DAG_ID))]
    change_runs = [Depends(requires_access_dag("PUT", DagAccessEntity.RUN))]
    delete_runs = [Depends(requires_access_dag("DELETE", DagAccessEntity.RUN))]

    def refuse_other_sites(request: Request) -> None:
        """Refuse a form post that another site's page sent (the session cookie would come with it)."""
        own = f"{request.url.scheme}://{request.url.netloc}"
        origin, referer = request.headers.get("origin"), request.headers.get("referer")
        if (origin and origin != own) or (not origin and referer and not referer.startswith(own + "/")):
            raise HTTPException(403, "a form of another site cannot act on Training Jobs")

    same_origin = [Depends(refuse_other_sites)]

    def rows(user, session, status: str | None) -> list[dict]:
        jobs = _jobs()
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET") & (set(jobs) | {GENERIC_DAG_ID})
        next_runs = dict(session.execute(
            select(DagModel.dag_id, DagModel.next_dagrun_create_after).where(DagModel.dag_id.in_(readable))).all())
        runs = session.scalars(select(DagRun).where(DagRun.dag_id.in_(readable))
                               .order_by(DagRun.id.desc()).limit(LIST_LIMIT)).all()
        refs = [_ref(run, next_runs.get(run.dag_id) if jobs.get(run.dag_id) and jobs[run.dag_id].schedule else None)
                for run in runs]
        return list_rows(refs, jobs, _reader(_hook()), GENERIC_DAG_ID, status=status or None)

    def run_and_job(dag_id: str, run_id: str, session):
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
        job = job_of(_ref(run), _jobs(), GENERIC_DAG_ID)
        if job is None:
            raise HTTPException(404, f"{dag_id!r} is not a Training Job DAG, or its run {run_id!r} has no valid spec")
        return run, job

    def page(dag_id: str, run_id: str, session) -> dict:
        run, job = run_and_job(dag_id, run_id, session)
        hook = _hook()
        return job_page(_ref(run), job, _reader(hook), lambda prefix: actions.object_sizes(hook, prefix))

    # ---- create ----------------------------------------------------------------------------------
    def create(values: dict[str, str], user, session, dag_bag):
        """Validate the form; store the registry login as a connection; start the generic DAG's run."""
        from airflow.api_fastapi.core_api.datamodels.dag_run import (
            TriggerDAGRunPostBody,
        )
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        from sat_tasks.airflow.params import params_from_spec

        hook = _hook()
        result = validate_form(values, exists=lambda uri: actions.uri_exists(hook, uri))
        if result.job is None:
            return result, None
        if result.registry is not None:
            if not get_auth_manager().is_authorized_connection(
                    method="POST", details=ConnectionDetails(conn_id=result.registry.conn_id), user=user):
                raise HTTPException(403, "storing a registry login needs the permission to create connections")
            _store_registry_login(session, result.registry)
        dag = get_latest_version_of_dag(dag_bag, GENERIC_DAG_ID, session)
        body = TriggerDAGRunPostBody(logical_date=None, conf=params_from_spec(result.job),
                                     note=f"created by {user.get_name()} in the Training Jobs view")
        params = body.validate_context(dag)
        run = dag.create_dagrun(
            run_id=params["run_id"], logical_date=params["logical_date"], data_interval=params["data_interval"],
            run_after=params["run_after"], conf=params["conf"], run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user.get_name(), state=DagRunState.QUEUED,
            partition_key=params.get("partition_key"), partition_date=params.get("partition_date"), session=session)
        session.flush()
        return result, run

    @app.get("/jobs/new", dependencies=create_runs, response_class=HTMLResponse)
    def create_form():
        return create_page()

    @app.post("/jobs/new", dependencies=create_runs + same_origin, response_class=HTMLResponse)
    async def create_from_form(request: Request, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
        from starlette.concurrency import run_in_threadpool

        values = {key: str(value) for key, value in (await request.form()).items()}
        # The writes (connection, DAG run) block on SQLite's lock: off the event loop, as a sync
        # endpoint's are, or the loop waits out the busy timeout for a lock another request of this
        # server holds and needs the loop to release ("database is locked", a 500, seen under load).
        return await run_in_threadpool(create_and_answer, values, user, session, dag_bag)

    def create_and_answer(values: dict[str, str], user, session, dag_bag):
        result, run = create(values, user, session, dag_bag)
        if run is None:
            return HTMLResponse(create_page(result.values, result.errors), status_code=422)
        session.commit()
        return RedirectResponse(f"/sat/{job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}", status_code=303)

    @app.post("/api/jobs", dependencies=create_runs, status_code=201)
    def create_job(body: dict[str, Any], user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
        form = body.get("form")
        if not isinstance(form, dict):
            raise HTTPException(422, "the body must be {\"form\": {<field>: <value>, ...}} (the Create form's fields)")
        result, run = create({k: "" if v is None else str(v) for k, v in form.items()}, user, session, dag_bag)
        if run is None:
            return JSONResponse({"detail": "the job was not started", "errors": result.problems}, status_code=422)
        return {"dag_id": run.dag_id, "run_id": run.run_id, "job": result.job.name,
                "page": f"/sat/{job_href({'dag_id': run.dag_id, 'run_id': run.run_id})}"}

    # ---- read ------------------------------------------------------------------------------------
    status_query = Query(None, description="a status word, e.g. Running or Completed")

    @app.get("/api/jobs", dependencies=read_dags)
    def list_jobs(user: GetUserDep, session: SessionDep, status: str | None = status_query):
        return {"jobs": rows(user, session, status)}

    @app.get("/api/jobs/{dag_id}/runs/{run_id}", dependencies=read_dags)
    def job_detail(dag_id: str, run_id: str, session: SessionDep):
        return page(dag_id, run_id, session)

    @app.get("/api/jobs/{dag_id}/runs/{run_id}/log", dependencies=read_dags, response_class=PlainTextResponse)
    def job_log(dag_id: str, run_id: str, session: SessionDep):
        run, job = run_and_job(dag_id, run_id, session)
        bucket, key = split_s3_uri(job_log_uri(job, run.run_id))
        hook = _hook()
        if not hook.check_for_key(key, bucket_name=bucket):
            raise HTTPException(404, "the job log is uploaded when the run ends; until then, read the task logs")
        filename = f"{job.name}-{run.run_id}.log".replace(":", "_").replace("+", "_")
        return PlainTextResponse(hook.read_key(key, bucket_name=bucket),
                                 headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @app.get("/jobs", dependencies=read_dags, response_class=HTMLResponse)
    def jobs_view(user: GetUserDep, session: SessionDep, status: str | None = status_query):
        return list_page(rows(user, session, status), status or None)

    @app.get("/jobs/{dag_id}/runs/{run_id}", dependencies=read_dags, response_class=HTMLResponse)
    def job_view(dag_id: str, run_id: str, session: SessionDep):
        return job_page_html(page(dag_id, run_id, session))

    @app.get("/jobs/{dag_id}/runs/{run_id}/report", dependencies=read_dags, response_class=HTMLResponse)
    def job_report(dag_id: str, run_id: str, session: SessionDep):
        """The job report's plots from the run's metrics series as they are now (the Monitoring tab shows it)."""
        from sat_tasks.io.metrics import read_object_storage
        from sat_tasks.pipeline.report_html import render_report_html

        run, job = run_and_job(dag_id, run_id, session)
        metrics = read_object_storage(JobRun(job, run_id).results_uri, _hook())
        return render_report_html(metrics, title=f"{job.name} {run_id}")

    # ---- stop ------------------------------------------------------------------------------------
    def stop(dag_id: str, run_id: str, user, session, dag_bag) -> dict:
        from airflow.api_fastapi.core_api.datamodels.dag_run import DagRunMutableStates
        from airflow.api_fastapi.core_api.services.public.dag_run import (
            patch_dag_run_state,
        )

        from sat_tasks.core.policy import stop_reason
        from sat_tasks.core.status import JobStatus
        from sat_tasks.spec import BackendKind

        run, job = run_and_job(dag_id, run_id, session)
        state = str(getattr(run.state, "value", run.state))
        if state not in ("queued", "running"):
            raise HTTPException(409, f"the run has already ended ({state}): there is nothing to stop")
        from sat_tasks.config import sat_setting

        job = job.with_backend(sat_setting("backend"))
        layout = JobRun(job, run_id)
        hook = _hook()
        request = actions.request_stop(hook, layout, user.get_name())
        launching = session.scalars(select(TaskInstance.task_id).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.state == "running",
            TaskInstance.task_id.like("attempt_%.launch"))).all()
        if launching and job.backend is BackendKind.LOCAL:
            how = ("the training gets SIGTERM within seconds and writes a final checkpoint; the status turns "
                   "Stopped when it has")
        else:
            layout.history(log=lambda _line: None).record(
                JobStatus.STOPPED, stop_reason(request) + ("" if launching else " before training ran"),
                task="stop")
            patch_dag_run_state(dag=get_dag_for_run(dag_bag, run, session=session), dag_run=run,
                                state=DagRunMutableStates.FAILED, session=session)
            how = ("the run was ended; its training pods get their grace period for a final checkpoint"
                   if launching else "the run was ended before its training started")
        return {"stop_requested": request, "how": how}

    @app.post("/api/jobs/{dag_id}/runs/{run_id}/stop", dependencies=change_runs, status_code=202)
    def stop_job(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
        return stop(dag_id, run_id, user, session, dag_bag)

    @app.post("/jobs/{dag_id}/runs/{run_id}/stop", dependencies=change_runs + same_origin,
              response_class=HTMLResponse)
    def stop_from_page(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
        stop(dag_id, run_id, user, session, dag_bag)
        session.commit()
        return RedirectResponse(f"/sat/{job_href({'dag_id': dag_id, 'run_id': run_id})}", status_code=303)

    # ---- tags ------------------------------------------------------------------------------------
    def set_tags(dag_id: str, run_id: str, text: str, session) -> tuple[dict | None, list[str]]:
        run, job = run_and_job(dag_id, run_id, session)
        tags, problems = actions.parse_tags(job, text)
        if tags is not None:
            actions.save_tags(_hook(), JobRun(job, run_id), tags)
        return tags, problems

    @app.put("/api/jobs/{dag_id}/runs/{run_id}/tags", dependencies=change_runs)
    def put_tags(dag_id: str, run_id: str, body: dict[str, Any], session: SessionDep):
        given = body.get("tags")
        if not isinstance(given, dict):
            raise HTTPException(422, "the body must be {\"tags\": {<key>: <value>, ...}}")
        tags, problems = set_tags(dag_id, run_id, "\n".join(f"{k}={v}" for k, v in given.items()), session)
        if tags is None:
            return JSONResponse({"detail": "tags not saved", "errors": problems}, status_code=422)
        return {"tags": tags}

    @app.post("/jobs/{dag_id}/runs/{run_id}/tags", dependencies=change_runs + same_origin,
              response_class=HTMLResponse)
    async def tags_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
        text = str((await request.form()).get("tags") or "")
        tags, problems = set_tags(dag_id, run_id, text, session)
        if tags is None:
            return HTMLResponse(job_page_html(page(dag_id, run_id, session), tag_errors=problems), status_code=422)
        return RedirectResponse(f"/sat/{job_href({'dag_id': dag_id, 'run_id': run_id})}#tags", status_code=303)

    # ---- delete ----------------------------------------------------------------------------------
    def delete(dag_id: str, run_id: str, delete_results: bool, session) -> tuple[str, str, int | None]:
        """Delete the run (409 while it runs); its results too when asked: (job name, results URI, objects removed)."""
        run, job = run_and_job(dag_id, run_id, session)
        state = str(getattr(run.state, "value", run.state))
        if state == "running":
            raise HTTPException(409, "the job is running: stop it first")
        layout = JobRun(job, run_id)
        removed = actions.delete_results(_hook(), layout) if delete_results else None
        session.delete(run)
        session.flush()
        return job.name, layout.results_uri, removed

    @app.delete("/api/jobs/{dag_id}/runs/{run_id}", dependencies=delete_runs)
    def delete_job(dag_id: str, run_id: str, session: SessionDep, delete_results: bool = False):
        name, results_uri, removed = delete(dag_id, run_id, delete_results, session)
        return {"deleted": {"dag_id": dag_id, "run_id": run_id, "job": name},
                "results": "kept" if removed is None else f"{removed} object(s) deleted", "results_uri": results_uri}

    @app.get("/jobs/{dag_id}/runs/{run_id}/delete", dependencies=delete_runs, response_class=HTMLResponse)
    def delete_confirmation(dag_id: str, run_id: str, session: SessionDep):
        return delete_page(page(dag_id, run_id, session))

    @app.post("/jobs/{dag_id}/runs/{run_id}/delete", dependencies=delete_runs + same_origin,
              response_class=HTMLResponse)
    async def delete_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
        wanted = (await request.form()).get("delete_results") not in (None, "", "off")
        name, _results_uri, removed = delete(dag_id, run_id, wanted, session)
        return deleted_page(name, run_id, removed)

    add_workspace_routes(app, session_dep=SessionDep, same_origin=same_origin)
    return app


def add_workspace_routes(app, *, session_dep, same_origin: list) -> None:
    """The Workspaces page and API (ADR 0015): list, create, edit the node count, delete; Airflow's pool permissions.

    JSON: `GET|POST /api/workspaces`, `PUT /api/workspaces/{name}` (`{"nodes": n}`),
    `DELETE /api/workspaces/{name}`: 422 with `{"field", "rule"}` problems, 409 with the jobs
    that run or wait there, 404 for an unknown name. HTML: `GET|POST /workspaces`,
    `POST /workspaces/{name}/nodes`, `POST /workspaces/{name}/delete` (asks first; `confirm=yes`
    deletes). Each change also sets the workspace's Airflow pool (`sat-workspace-<name>`, a slot
    per node; `sat_tasks.airflow.workspace_pools`, which `sat workspace` uses too), which queues
    its jobs on Kubernetes where Kueue does not.
    """
    from airflow.api_fastapi.core_api.security import requires_access_pool
    from airflow.models.dagrun import DagRun
    from fastapi import Depends, HTTPException, Request
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
    from sqlalchemy import select
    from starlette.concurrency import run_in_threadpool

    from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
    from sat_tasks.airflow.workspace_pools import set_workspace_pool
    from sat_tasks.core.workspaces import WorkspaceUse, merge_uses
    from sat_tasks.io.workspaces import SlotBoard, WorkspaceNotFound, WorkspaceRefused, WorkspaceStore
    from sat_tasks.spec import SpecError
    from sat_tasks.ui import workspaces as pages

    SessionDep = session_dep  # noqa: N806 - FastAPI's annotated dependency
    read = [Depends(requires_access_pool("GET"))]
    create = [Depends(requires_access_pool("POST"))]
    change = [Depends(requires_access_pool("PUT"))]
    remove = [Depends(requires_access_pool("DELETE"))]

    def uses_of(name: str, session) -> list[WorkspaceUse]:
        """Who runs or waits there: the local slot board first, then the queued and running Airflow runs."""
        jobs = _jobs()
        runs = session.scalars(select(DagRun).where(DagRun.state.in_(("queued", "running")),
                                                    DagRun.dag_id.in_(set(jobs) | {GENERIC_DAG_ID}))).all()
        from_runs = []
        for run in runs:
            job = job_of(_ref(run), jobs, GENERIC_DAG_ID)
            if job is not None and job.workspace == name:
                state = str(getattr(run.state, "value", run.state))
                from_runs.append(WorkspaceUse(job.name, run.run_id, job.nodes, state))
        return merge_uses(SlotBoard(name).uses(), from_runs)

    def rows(session) -> list[dict]:
        return [pages.workspace_row(ws, uses_of(ws.name, session)) for ws in WorkspaceStore().list()]

    def create_workspace(data: dict, session):
        workspace = WorkspaceStore().create(data)
        set_workspace_pool(workspace.name, workspace.nodes, session)
        return workspace

    def set_nodes(name: str, nodes: int, session):
        store = WorkspaceStore()
        try:
            workspace = store.set_nodes(name, nodes, uses_of(name, session))
        except WorkspaceNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        set_workspace_pool(name, workspace.nodes, session)
        return workspace

    def delete_workspace(name: str, session):
        try:
            workspace = WorkspaceStore().delete(name, uses_of(name, session))
        except WorkspaceNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        set_workspace_pool(name, None, session)
        return workspace

    def problems_json(exc: SpecError) -> JSONResponse:
        return JSONResponse({"detail": "invalid workspace", "errors": [p.model_dump() for p in exc.problems]},
                            status_code=422)

    # ---- JSON ----------------------------------------------------------------------------------
    @app.get("/api/workspaces", dependencies=read)
    def list_workspaces(session: SessionDep):
        return {"workspaces": rows(session)}

    @app.post("/api/workspaces", dependencies=create, status_code=201)
    def post_workspace(body: dict, session: SessionDep):
        try:
            workspace = create_workspace(body, session)
        except SpecError as exc:
            return problems_json(exc)
        return {"workspace": workspace.to_dict()}

    @app.put("/api/workspaces/{name}", dependencies=change)
    def put_workspace(name: str, body: dict, session: SessionDep):
        try:
            workspace = set_nodes(name, body.get("nodes"), session)
        except SpecError as exc:
            return problems_json(exc)
        except WorkspaceRefused as exc:
            return JSONResponse({"detail": str(exc)}, status_code=409)
        return {"workspace": workspace.to_dict(), "effective": "for the next job that starts"}

    @app.delete("/api/workspaces/{name}", dependencies=remove)
    def delete_workspace_api(name: str, session: SessionDep):
        try:
            workspace = delete_workspace(name, session)
        except WorkspaceRefused as exc:
            return JSONResponse({"detail": str(exc)}, status_code=409)
        return {"deleted": workspace.name}

    # ---- HTML ----------------------------------------------------------------------------------
    @app.get("/workspaces", dependencies=read, response_class=HTMLResponse)
    def workspaces_view(session: SessionDep, created: str | None = None, resized: str | None = None,
                        deleted: str | None = None):
        return pages.workspaces_page(rows(session), notice=pages.done_notice(created=created, resized=resized,
                                                                             deleted=deleted))

    def done(**what: str) -> RedirectResponse:
        """After a change: 303 to the list (Post/Redirect/Get), so a reload does not post it again."""
        from urllib.parse import urlencode

        return RedirectResponse(f"/sat/workspaces?{urlencode(what)}", status_code=303)

    # The form handlers read the form on the event loop and write (the YAML, the Airflow pool) off it,
    # as a sync endpoint does: on the loop a write waits out SQLite's busy timeout (ADR 0009, c7d6537).
    @app.post("/workspaces", dependencies=create + same_origin, response_class=HTMLResponse)
    async def create_from_form(request: Request, session: SessionDep):
        values = {key: str(value) for key, value in (await request.form()).items()}
        return await run_in_threadpool(create_and_answer, values, session)

    def create_and_answer(values: dict[str, str], session):
        try:
            workspace = create_workspace(pages.workspace_from_form(values), session)
        except SpecError as exc:
            return HTMLResponse(pages.workspaces_page(rows(session), values=values,
                                                      errors=pages.problems_by_field(exc.problems)), status_code=422)
        return done(created=workspace.name)

    @app.post("/workspaces/{name}/nodes", dependencies=change + same_origin, response_class=HTMLResponse)
    async def nodes_from_form(name: str, request: Request, session: SessionDep):
        text = str((await request.form()).get("nodes") or "").strip()
        return await run_in_threadpool(nodes_and_answer, name, text, session)

    def nodes_and_answer(name: str, text: str, session):
        try:
            workspace = set_nodes(name, int(text) if text.lstrip("-").isdigit() else text, session)
        except SpecError as exc:
            return HTMLResponse(pages.workspaces_page(rows(session), refusal="; ".join(map(str, exc.problems))),
                                status_code=422)
        except WorkspaceRefused as exc:
            return HTMLResponse(pages.workspaces_page(rows(session), refusal=str(exc)), status_code=409)
        return done(resized=workspace.name)

    @app.post("/workspaces/{name}/delete", dependencies=remove + same_origin, response_class=HTMLResponse)
    async def delete_from_form(name: str, request: Request, session: SessionDep):
        confirmed = (await request.form()).get("confirm") == "yes"
        return await run_in_threadpool(delete_and_answer, name, confirmed, session)

    def delete_and_answer(name: str, confirmed: bool, session):
        if not confirmed:  # the row's Delete asks first, as a job's Delete does
            try:
                WorkspaceStore().get(name)
            except WorkspaceNotFound as exc:
                raise HTTPException(404, str(exc)) from None
            return pages.workspaces_page(rows(session), confirm_delete=name)
        try:
            workspace = delete_workspace(name, session)
        except WorkspaceRefused as exc:
            return HTMLResponse(pages.workspaces_page(rows(session), refusal=str(exc)), status_code=409)
        return done(deleted=workspace.name)


def _store_registry_login(session, login) -> None:
    """Create or update the Airflow connection that holds a created job's registry login (Fernet-encrypted)."""
    import json

    from airflow.models.connection import Connection
    from sqlalchemy import select

    extra = json.dumps({"insecure": True}) if login.insecure else None
    conn = session.scalar(select(Connection).where(Connection.conn_id == login.conn_id))
    if conn is None:
        session.add(Connection(conn_id=login.conn_id, conn_type="generic", host=login.host, login=login.login,
                               password=login.password, extra=extra,
                               description="registry login of a Training Job, from the Create Training Job form"))
        return
    conn.host, conn.login, conn.password = login.host, login.login, login.password
    conn.set_extra(extra)
