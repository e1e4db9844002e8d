"""The Training Jobs API, mounted in Airflow's API server by `plugins/sat_training_jobs.py` under `/sat`.

Every endpoint sits behind Airflow's own authentication and DAG permissions (the same
dependencies the core REST API uses): no token or session cookie, 401; a person without
read access to a job's DAG, 403 on its page and no row in the list.

- `GET /sat/api/jobs[?status=<status word>]`: the list, newest first.
- `GET /sat/api/jobs/{dag_id}/runs/{run_id}`: the job page's data.
- `GET /sat/api/jobs/{dag_id}/runs/{run_id}/log`: the job log (all attempts), as a download;
  404 until the run has uploaded it (at its end).
- `GET /sat/jobs` and `GET /sat/jobs/{dag_id}/runs/{run_id}`: the same as HTML (the
  "Training Jobs" entry of Airflow's menu opens the list).
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


def _reader():
    from sat_tasks.io.object_storage import read_json

    hook = _hook()

    def read(uri: str) -> Any:
        try:
            return read_json(hook, uri)
        except Exception:  # noqa: BLE001 - a missing or unreadable file shows as "not written yet"
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
    from airflow.api_fastapi.common.db.common import SessionDep
    from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from fastapi import Depends, FastAPI, HTTPException, Query
    from sqlalchemy import select

    from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID

    from fastapi.responses import HTMLResponse, PlainTextResponse

    from sat_tasks.ui.pages import job_page_html, list_page

    app = FastAPI(title="SAT Training Jobs", description=__doc__)
    read_dags = [Depends(requires_access_dag("GET"))]

    def rows(user, session, status: str | None) -> list[dict]:
        jobs = _jobs()
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET") & (set(jobs) | {GENERIC_DAG_ID})
        next_runs = dict(session.execute(
            select(DagModel.dag_id, DagModel.next_dagrun_create_after).where(DagModel.dag_id.in_(readable))).all())
        runs = session.scalars(select(DagRun).where(DagRun.dag_id.in_(readable))
                               .order_by(DagRun.id.desc()).limit(LIST_LIMIT)).all()
        refs = [_ref(run, next_runs.get(run.dag_id) if jobs.get(run.dag_id) and jobs[run.dag_id].schedule else None)
                for run in runs]
        return list_rows(refs, jobs, _reader(), GENERIC_DAG_ID, status=status or None)

    def run_and_job(dag_id: str, run_id: str, session):
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if run is None:
            raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
        ref = _ref(run)
        job = job_of(ref, _jobs(), GENERIC_DAG_ID)
        if job is None:
            raise HTTPException(404, f"{dag_id!r} is not a Training Job DAG, or its run {run_id!r} has no valid spec")
        return ref, job

    def page(dag_id: str, run_id: str, session) -> dict:
        ref, job = run_and_job(dag_id, run_id, session)
        return job_page(ref, job, _reader())

    status_query = Query(None, description="a status word, e.g. Running or Completed")

    @app.get("/api/jobs", dependencies=read_dags)
    def list_jobs(user: GetUserDep, session: SessionDep, status: str | None = status_query):
        return {"jobs": rows(user, session, status)}

    @app.get("/api/jobs/{dag_id}/runs/{run_id}", dependencies=read_dags)
    def job_detail(dag_id: str, run_id: str, session: SessionDep):
        return page(dag_id, run_id, session)

    @app.get("/api/jobs/{dag_id}/runs/{run_id}/log", dependencies=read_dags, response_class=PlainTextResponse)
    def job_log(dag_id: str, run_id: str, session: SessionDep):
        from sat_tasks.spec import split_s3_uri

        ref, job = run_and_job(dag_id, run_id, session)
        bucket, key = split_s3_uri(job_log_uri(job, ref.run_id))
        hook = _hook()
        if not hook.check_for_key(key, bucket_name=bucket):
            raise HTTPException(404, "the job log is uploaded when the run ends; until then, read the task logs")
        filename = f"{job.name}-{ref.run_id}.log".replace(":", "_").replace("+", "_")
        return PlainTextResponse(hook.read_key(key, bucket_name=bucket),
                                 headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @app.get("/jobs", dependencies=read_dags, response_class=HTMLResponse)
    def jobs_view(user: GetUserDep, session: SessionDep, status: str | None = status_query):
        return list_page(rows(user, session, status), status or None)

    @app.get("/jobs/{dag_id}/runs/{run_id}", dependencies=read_dags, response_class=HTMLResponse)
    def job_view(dag_id: str, run_id: str, session: SessionDep):
        return job_page_html(page(dag_id, run_id, session))

    return app
