"""The Training Jobs view's FastAPI app, mounted in Airflow's API server under `/sat` by `plugins/sat_training_jobs.py`.

Every endpoint sits behind Airflow's own authentication and permissions (the same
dependencies the core REST API uses; `sat_tasks.ui.security`): no token or session cookie,
401; a person without the permission on a job's DAG, 403 on its page and actions, and no
row in the list. Reading needs GET on the DAG; Create needs POST on the generic DAG's runs
(and on connections, when it stores a registry login); Stop and Tags need PUT, Delete
DELETE on the DAG's runs. Forms post to the same origin: a post from another site is refused.

One router per resource (`sat_tasks.ui.routers`: jobs, runs, workspaces, nodes):

JSON (`/sat/api/...`):
- `GET  /api/jobs[?status=<status word>]`: the list, newest first.
- `POST /api/jobs`: create a job from `{"form": {<field>: <value>, ...}}` (the Create
  form's fields): 201 with the run, or 422 with every problem as `{"field", "rule"}`.
- `GET  /api/jobs/{dag_id}/runs/{run_id}`: the job page's data.
- `GET  /api/jobs/{dag_id}/runs/{run_id}/log`: the job log (all attempts), a download streamed
  from its freshest copy (while the job runs too); 404 before its first line.
- `GET  /api/jobs/{dag_id}/runs/{run_id}/log/tail[?offset=N&limit=B]`: its last lines, or what
  came after `offset` (the Logs tab follows the log with it).
- `GET  /api/jobs/{dag_id}/runs/{run_id}/files[/<name>]`: the run's files with their sizes;
  one of them, a download.
- `POST /api/jobs/{dag_id}/runs/{run_id}/stop`: stop the job (202), naming who asked.
- `PUT  /api/jobs/{dag_id}/runs/{run_id}/tags`: replace the run's tags (`{"tags": {...}}`).
- `DELETE /api/jobs/{dag_id}/runs/{run_id}[?delete_results=true]`: delete the run; its
  results stay in Object Storage unless asked; 409 while it runs.
- Workspaces (ADR 0015): `GET|POST /api/workspaces`, `PUT|DELETE /api/workspaces/{name}`.
- Nodes: `GET /api/nodes`, `POST /api/nodes/{node}/release`.

HTML: `GET /jobs` (the "Training Jobs" menu entry), `GET|POST /jobs/new` (Create Training
Job), `GET /jobs/{dag_id}/runs/{run_id}` (the job page), `GET .../report` (the job report's
plots from the metrics series so far; the Monitoring tab embeds it), the forms
`POST .../stop`, `POST .../tags`, `GET|POST .../delete`; `GET|POST /workspaces` (the
"Workspaces" menu entry) and its forms; `GET /nodes` and its Release form.

`GET /docs` and `GET /openapi.json` (this API's description) need a login too. Every
state-changing request passes the cross-site check, and every answer may be framed by this
origin only (`sat_tasks.ui.security`, ADR 0019).
"""

from __future__ import annotations

from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.models.dagbag import DBDagBag
from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html

from sat_tasks.ui import errors
from sat_tasks.ui.routers import bulk, compare, jobs, nodes, runs, workspaces
from sat_tasks.ui.security import FRAME_HEADERS, refuse_cross_site_writes

ROUTERS = (bulk.router, jobs.router, runs.router, workspaces.router, nodes.router, compare.router)


def create_app() -> FastAPI:
    """The FastAPI app the plugin mounts (imports the API server's modules: call it only there)."""
    app = FastAPI(title="SAT Training Jobs", description=__doc__, docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(refuse_cross_site_writes)])
    app.state.dag_bag = DBDagBag()  # what DagBagDep reads: the serialized DAGs, from the metadata DB
    for router in ROUTERS:
        app.include_router(router)
    errors.install(app)  # pages: a login redirect, a not-found page; the JSON API answers as before

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(user: GetUserDep):
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request, user: GetUserDep):
        return get_swagger_ui_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json",
                                   title=f"{app.title} - Swagger UI")

    @app.middleware("http")
    async def frame_only_here(request: Request, call_next):
        response = await call_next(request)
        for name, value in FRAME_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return app
