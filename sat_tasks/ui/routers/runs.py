"""A Training Job's run: its page (JSON, HTML, the job log, the report) and the actions Stop, Tags and Delete.

The actions' effect on the run's records is `sat_tasks.pipeline.actions`'; here: who may
(`sat_tasks.ui.security`), the DAG run in Airflow's DB (`sat_tasks.ui.dag_runs`), the answer.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.common.dagbag import DagBagDep
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)

from sat_tasks.io.metrics import read_object_storage
from sat_tasks.pipeline import actions
from sat_tasks.pipeline.report_html import render_report_html
from sat_tasks.ui import dag_runs, pages
from sat_tasks.ui.create import parse_tags
from sat_tasks.ui.jobs import job_log_uri
from sat_tasks.ui.security import CHANGE_RUNS, DELETE_RUNS, READ_JOBS, SAME_ORIGIN
from sat_tasks.ui.sources import find_job_run, object_storage, object_stream, page_data

router = APIRouter(tags=["Training Job runs"])
RUN = "/jobs/{dag_id}/runs/{run_id}"  # a run's page; its JSON under /api


def _page_href(dag_id: str, run_id: str) -> str:
    return f"/sat/{pages.job_href({'dag_id': dag_id, 'run_id': run_id})}"


# ---- read ------------------------------------------------------------------------------------------
@router.get("/api" + RUN, dependencies=READ_JOBS)
def job_detail(dag_id: str, run_id: str, session: SessionDep):
    return page_data(find_job_run(session, dag_id, run_id))


@router.get(RUN, dependencies=READ_JOBS, response_class=HTMLResponse)
def job_view(dag_id: str, run_id: str, session: SessionDep):
    return pages.job_page_html(page_data(find_job_run(session, dag_id, run_id)))


@router.get("/api" + RUN + "/log", dependencies=READ_JOBS, response_class=PlainTextResponse)
def job_log(dag_id: str, run_id: str, session: SessionDep):
    """The job log (all attempts) as a download, streamed in chunks; 404 until the run has uploaded it (at its end)."""
    found = find_job_run(session, dag_id, run_id)
    stream = object_stream(job_log_uri(found.job, run_id))
    if stream is None:
        raise HTTPException(404, "the job log is uploaded when the run ends; until then, read the task logs")
    filename = f"{found.job.name}-{run_id}.log".replace(":", "_").replace("+", "_")
    return StreamingResponse(stream.chunks, media_type="text/plain; charset=utf-8",
                             headers={"Content-Disposition": f'attachment; filename="{filename}"',
                                      "Content-Length": str(stream.size)})


@router.get(RUN + "/report", dependencies=READ_JOBS, response_class=HTMLResponse)
def job_report(dag_id: str, run_id: str, session: SessionDep):
    """The job report's plots from the run's metrics series as they are now (the Monitoring tab shows it)."""
    found = find_job_run(session, dag_id, run_id)
    metrics = read_object_storage(found.layout.results_uri, object_storage())
    return render_report_html(metrics, title=f"{found.job.name} {run_id}")


# ---- stop ------------------------------------------------------------------------------------------
@router.post("/api" + RUN + "/stop", dependencies=CHANGE_RUNS, status_code=202)
def stop_job(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    return stop(dag_id, run_id, user, session, dag_bag, via=actions.VIA_API)


@router.post(RUN + "/stop", dependencies=CHANGE_RUNS + SAME_ORIGIN, response_class=HTMLResponse)
def stop_from_page(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    stop(dag_id, run_id, user, session, dag_bag)
    session.commit()
    return RedirectResponse(_page_href(dag_id, run_id), status_code=303)


def stop(dag_id: str, run_id: str, user: Any, session: Any, dag_bag: Any, via: str = actions.VIA) -> dict[str, Any]:
    """Stop a queued or running job (409 once it has ended), naming who asked; end the DAG run where that stops it."""
    found = find_job_run(session, dag_id, run_id)
    if found.state not in dag_runs.ACTIVE:
        raise HTTPException(409, f"the run has already ended ({found.state}): there is nothing to stop")
    outcome = actions.stop_job(found.layout, user.get_name(), via=via,
                               training_launched=dag_runs.training_launched(session, dag_id, run_id))
    if outcome.end_run:
        dag_runs.end_run(found.run, session, dag_bag)
    return {"stop_requested": outcome.request, "how": outcome.how}


# ---- tags ------------------------------------------------------------------------------------------
@router.put("/api" + RUN + "/tags", dependencies=CHANGE_RUNS)
def put_tags(dag_id: str, run_id: str, body: dict[str, Any], session: SessionDep):
    given = body.get("tags")
    if not isinstance(given, dict):
        raise HTTPException(422, "the body must be {\"tags\": {<key>: <value>, ...}}")
    tags, problems = set_tags(dag_id, run_id, "\n".join(f"{k}={v}" for k, v in given.items()), session)
    if tags is None:
        return JSONResponse({"detail": "tags not saved", "errors": problems}, status_code=422)
    return {"tags": tags}


@router.post(RUN + "/tags", dependencies=CHANGE_RUNS + SAME_ORIGIN, response_class=HTMLResponse)
async def tags_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
    text = str((await request.form()).get("tags") or "")
    tags, problems = set_tags(dag_id, run_id, text, session)
    if tags is None:
        page = page_data(find_job_run(session, dag_id, run_id))
        return HTMLResponse(pages.job_page_html(page, tag_errors=problems), status_code=422)
    return RedirectResponse(_page_href(dag_id, run_id) + "#tags", status_code=303)


def set_tags(dag_id: str, run_id: str, text: str, session: Any) -> tuple[dict[str, str] | None, list[str]]:
    """Check `key=value` lines with the spec's tag rules and save them: (tags, []) or (None, problems)."""
    found = find_job_run(session, dag_id, run_id)
    tags, problems = parse_tags(found.job, text)
    if tags is not None:
        actions.save_tags(object_storage(), found.layout, tags)
    return tags, problems


# ---- delete ----------------------------------------------------------------------------------------
@router.delete("/api" + RUN, dependencies=DELETE_RUNS)
def delete_job(dag_id: str, run_id: str, session: SessionDep, delete_results: bool = False):
    name, results_uri, removed = delete(dag_id, run_id, delete_results, session)
    return {"deleted": {"dag_id": dag_id, "run_id": run_id, "job": name},
            "results": "kept" if removed is None else f"{removed} object(s) deleted", "results_uri": results_uri}


@router.get(RUN + "/delete", dependencies=DELETE_RUNS, response_class=HTMLResponse)
def delete_confirmation(dag_id: str, run_id: str, session: SessionDep):
    return pages.delete_page(page_data(find_job_run(session, dag_id, run_id)))


@router.post(RUN + "/delete", dependencies=DELETE_RUNS + SAME_ORIGIN, response_class=HTMLResponse)
async def delete_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
    wanted = (await request.form()).get("delete_results") not in (None, "", "off")
    name, _results_uri, removed = delete(dag_id, run_id, wanted, session)
    return pages.deleted_page(name, run_id, removed)


def delete(dag_id: str, run_id: str, delete_results: bool, session: Any) -> tuple[str, str, int | None]:
    """Delete the run (409 while it runs); its results too when asked: (job name, results URI, objects removed)."""
    found = find_job_run(session, dag_id, run_id)
    if found.state == "running":
        raise HTTPException(409, "the job is running: stop it first")
    removed = actions.delete_results(object_storage(), found.layout) if delete_results else None
    dag_runs.delete_run(session, found.run)
    return found.job.name, found.layout.results_uri, removed
