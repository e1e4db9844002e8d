"""A Training Job's run: its page (JSON, HTML, the job log, its files, the report) and the actions Stop, Tags and Delete.

The actions' effect on the run's records is `sat_tasks.pipeline.actions`'; here: who may
(`sat_tasks.ui.security`), the DAG run in Airflow's DB (`sat_tasks.ui.dag_runs`), the answer.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any

from airflow.api_fastapi.common.dagbag import DagBagDep
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)
from starlette.concurrency import run_in_threadpool

from sat_tasks.backends import backend_for
from sat_tasks.backends.base import live_log_of
from sat_tasks.core.live_log import CURSOR_RULE, BadCursor, LiveCursor, LiveLog
from sat_tasks.io.metrics import read_object_storage
from sat_tasks.io.scoped_credentials import revoke_run_credentials
from sat_tasks.pipeline import actions
from sat_tasks.pipeline.report_html import render_report_html
from sat_tasks.ui import dag_runs, pages, run_index
from sat_tasks.ui.create import parse_tags
from sat_tasks.ui.log_tail import (
    MARKER,
    MAX_READ_BYTES,
    TAIL_BYTES,
    LiveReader,
    is_marker,
    read_job_log,
    read_log,
)
from sat_tasks.ui.run_files import (
    READ_ERRORS,
    BadFileName,
    attachment_headers,
    check_file_name,
    job_log_source,
    list_result_files,
    result_file_source,
)
from sat_tasks.ui.security import CHANGE_RUNS, DELETE_RUNS, OWN_RUN, READ_JOBS, SAME_ORIGIN
from sat_tasks.ui.sources import JobRunFound, find_job_run, object_storage, page_data

router = APIRouter(tags=["Training Job runs"])
RUN = "/jobs/{dag_id}/runs/{run_id}"  # a run's page; its JSON under /api
LIVE_DOWNLOAD_LINES = 100_000  # the running attempt's section in a download: rank 0's last lines, ...
LIVE_DOWNLOAD_BYTES = 8 << 20  # ... at most this much of them (held in memory while the download starts)


def _page_href(dag_id: str, run_id: str) -> str:
    return f"/sat/{pages.job_href({'dag_id': dag_id, 'run_id': run_id})}"


# ---- read ------------------------------------------------------------------------------------------
@router.get("/api" + RUN, dependencies=READ_JOBS + OWN_RUN)
def job_detail(dag_id: str, run_id: str, session: SessionDep):
    """The run's page as JSON: its status, history, attempts, checkpoints, monitoring, who created it, its queue
    time, the time it ran and the GPU-/node-hours that makes (failovers included), and its goodput once it ended."""
    return job_data(session, find_job_run(session, dag_id, run_id))


@router.get(RUN, dependencies=READ_JOBS + OWN_RUN, response_class=HTMLResponse)
def job_view(dag_id: str, run_id: str, session: SessionDep):
    found = find_job_run(session, dag_id, run_id)
    return pages.job_page_html({**job_data(session, found), **files_data(found)})


def job_data(session: Any, found: JobRunFound) -> dict[str, Any]:
    """The page's data: what the run's records say (Object Storage), and what the metadata DB says of the run."""
    return {**page_data(found), **run_index.run_facts(session, found.run)}


def files_data(found: JobRunFound) -> dict[str, Any]:
    """What the Logs and Outputs tabs show first: the job log's tail (its lines, markers flagged) and the results' files.

    A store that cannot be read leaves both tabs saying so (`files_problem`); the rest of the page shows.
    """
    try:
        tail = log_answer(found)
        outputs = list_result_files(object_storage(), found.layout.results_uri).as_dict()
    except READ_ERRORS as error:
        return {"log_tail": None, "outputs": None, "files_problem": f"could not read them: {type(error).__name__}"}
    tail.update(lines=[(line, is_marker(line)) for line in tail["text"].splitlines()], marker=MARKER.pattern)
    return {"log_tail": tail, "outputs": outputs}


def log_answer(found: JobRunFound, offset: int | None = None, limit: int = TAIL_BYTES,
               cursor: LiveCursor | None = None) -> dict[str, Any]:
    """The job log's piece after `offset` (its tail without one) from its freshest copy; `ended`: the run has ended.

    While the run is active and the copy is the attempts' stored sections, the running attempt's section follows
    them (`read_job_log`: `cursor` is where its reader is in it).
    """
    ended = found.state not in dag_runs.ACTIVE
    copy = job_log_source(found.layout, object_storage())
    if copy.attempts is not None and not ended:
        piece = read_job_log(copy.source, copy.attempts, live_reader(found, copy.attempts), offset, cursor, limit)
        return {**piece.as_dict(), "source": piece.source or None, "ended": ended}
    if copy.source is None:  # no line yet: the page asks again
        return {"start": 0, "end": 0, "offset": offset or 0, "size": 0, "text": "", "skipped": 0, "restarted": False,
                "source": None, "cursor": None, "more": False, "ended": ended}
    return {**read_log(copy.source, offset, limit, growing=not ended).as_dict(), "ended": ended}


def live_reader(found: JobRunFound, attempts: frozenset[int]) -> LiveReader:
    """The run's backend reading the running attempt's section (`Backend.live_log`); a failure is a note, not a 500."""
    def read(cursor: LiveCursor | None, limit: int, lines: int) -> LiveLog | None:
        try:
            return live_log_of(backend_for(found.job), found.layout, stored=attempts, cursor=cursor, limit=limit,
                               lines=lines)
        except Exception as error:  # noqa: BLE001 - the cluster connection missing or refused: the stored sections show
            return LiveLog(cursor.attempt if cursor else None, "", None,
                           note=f"the running attempt's log could not be read ({type(error).__name__})")

    return read


@router.get("/api" + RUN + "/log", dependencies=READ_JOBS + OWN_RUN, response_class=PlainTextResponse)
def job_log(dag_id: str, run_id: str, session: SessionDep):
    """The whole job log (all attempts) as a download from its freshest copy, streamed in chunks; 404 before its first line.

    While the run writes it, the download ends where the log was when it began. While a Kubernetes attempt runs, its
    section comes last as its pods have it then: the last `LIVE_DOWNLOAD_LINES` lines of rank 0, at most
    `LIVE_DOWNLOAD_BYTES` (a `[sat]` line says where the download stops short of it).
    """
    found = find_job_run(session, dag_id, run_id)
    copy = job_log_source(found.layout, object_storage())
    live = b""
    if copy.attempts is not None and found.state in dag_runs.ACTIVE:
        got = live_reader(found, copy.attempts)(None, LIVE_DOWNLOAD_BYTES, LIVE_DOWNLOAD_LINES)
        if got is not None and got.cursor is not None:
            live = got.text.encode() + (f"[sat] attempt {got.attempt}: the download stops here, at "
                                        f"{LIVE_DOWNLOAD_BYTES} bytes of the running attempt's log; the page follows "
                                        "the rest\n".encode() if got.more else b"")
    if copy.source is None and not live:
        raise HTTPException(404, "no job log yet: it begins when the first attempt starts")
    stored = copy.source.size() if copy.source is not None else 0
    chunks = itertools.chain(copy.source.chunks(stored) if copy.source is not None else (), [live] if live else ())
    return StreamingResponse(chunks, media_type="text/plain; charset=utf-8",
                             headers=attachment_headers(f"{found.job.name}-{run_id}.log", stored + len(live)))


@router.get("/api" + RUN + "/log/tail", dependencies=READ_JOBS + OWN_RUN)
def job_log_tail(dag_id: str, run_id: str, session: SessionDep,
                 offset: Annotated[int | None, Query(ge=0, description="the end of what the reader has")] = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_READ_BYTES)] = TAIL_BYTES,
                 cursor: Annotated[str | None, Query(max_length=300, description=CURSOR_RULE)] = None):
    """The job log's last `limit` bytes in whole lines, or (with `offset`) what it gained since: only new bytes travel.

    A running Kubernetes attempt's section is followed by `cursor` (the previous answer's; `read_job_log`).
    """
    try:
        at = LiveCursor.parse(cursor) if cursor is not None else None
    except BadCursor as error:
        raise HTTPException(422, str(error)) from None
    return log_answer(find_job_run(session, dag_id, run_id), offset, limit, at)


@router.get("/api" + RUN + "/files", dependencies=READ_JOBS + OWN_RUN)
def result_files(dag_id: str, run_id: str, session: SessionDep):
    """The run's files under its results prefix with their sizes, grouped (model and outputs, checkpoints, report, ...)."""
    return list_result_files(object_storage(), find_job_run(session, dag_id, run_id).layout.results_uri).as_dict()


@router.get("/api" + RUN + "/files/{name:path}", dependencies=READ_JOBS + OWN_RUN, response_class=StreamingResponse)
def result_file(dag_id: str, run_id: str, name: str, session: SessionDep):
    """One of the run's files (`name` relative to its results prefix) as a download, streamed in chunks."""
    found = find_job_run(session, dag_id, run_id)
    try:
        check_file_name(name)
    except BadFileName as error:
        raise HTTPException(422, str(error)) from None
    source = result_file_source(object_storage(), found.layout.results_uri, name)
    if source is None:
        raise HTTPException(404, f"no file {name!r} in the run's results")
    size = source.size()
    return StreamingResponse(source.chunks(size), media_type="application/octet-stream",
                             headers={**attachment_headers(name.rsplit("/", 1)[-1], size),
                                      "X-Content-Type-Options": "nosniff"})


@router.get(RUN + "/report", dependencies=READ_JOBS + OWN_RUN, response_class=HTMLResponse)
def job_report(dag_id: str, run_id: str, session: SessionDep, embedded: bool = False):
    """The job report's plots from the run's metrics series as they are now (the Monitoring tab shows it).

    `embedded`: inside the Monitoring tab, without the plots the tab draws itself (each chart once).
    """
    found = find_job_run(session, dag_id, run_id)
    metrics = read_object_storage(found.layout.results_uri, object_storage())
    return render_report_html(metrics, title=f"{found.job.name} {run_id}", omit=pages.CHARTS_ON_THE_PAGE if embedded else ())


# ---- stop ------------------------------------------------------------------------------------------
@router.post("/api" + RUN + "/stop", dependencies=CHANGE_RUNS + OWN_RUN, status_code=202)
def stop_job(dag_id: str, run_id: str, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    return stop(dag_id, run_id, user, session, dag_bag, via=actions.VIA_API)


@router.get(RUN + "/stop", dependencies=CHANGE_RUNS + OWN_RUN, response_class=HTMLResponse)
def stop_confirmation(dag_id: str, run_id: str, session: SessionDep):
    """Stop asks first, as Delete does (409 once the run has ended)."""
    found = find_job_run(session, dag_id, run_id)
    if found.state not in dag_runs.ACTIVE:
        raise HTTPException(409, f"the run has already ended ({found.state}): there is nothing to stop")
    return pages.stop_page(page_data(found))


@router.post(RUN + "/stop", dependencies=CHANGE_RUNS + OWN_RUN + SAME_ORIGIN, response_class=HTMLResponse)
async def stop_from_page(dag_id: str, run_id: str, request: Request, user: GetUserDep, session: SessionDep,
                         dag_bag: DagBagDep):
    if (await request.form()).get("confirm") != "yes":  # not from the confirmation: ask first
        return await run_in_threadpool(stop_confirmation, dag_id, run_id, session)
    return await run_in_threadpool(_stop_and_answer, dag_id, run_id, user, session, dag_bag)


def _stop_and_answer(dag_id: str, run_id: str, user: Any, session: Any, dag_bag: Any) -> RedirectResponse:
    stop(dag_id, run_id, user, session, dag_bag)  # off the event loop with its commit, as a sync endpoint's writes
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
@router.put("/api" + RUN + "/tags", dependencies=CHANGE_RUNS + OWN_RUN)
def put_tags(dag_id: str, run_id: str, body: dict[str, Any], session: SessionDep):
    given = body.get("tags")
    if not isinstance(given, dict):
        raise HTTPException(422, "the body must be {\"tags\": {<key>: <value>, ...}}")
    tags, problems = set_tags(dag_id, run_id, "\n".join(f"{k}={v}" for k, v in given.items()), session)
    if tags is None:
        return JSONResponse({"detail": "tags not saved", "errors": problems}, status_code=422)
    return {"tags": tags}


@router.get(RUN + "/tags", dependencies=READ_JOBS + OWN_RUN, include_in_schema=False)
def tags_address(dag_id: str, run_id: str):
    """The Tags form's address asked for with GET (a reload, Airflow re-requesting its frame): the Tags tab."""
    return RedirectResponse(_page_href(dag_id, run_id) + "#tags", status_code=303)


@router.post(RUN + "/tags", dependencies=CHANGE_RUNS + OWN_RUN + SAME_ORIGIN, response_class=HTMLResponse)
async def tags_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
    text = str((await request.form()).get("tags") or "")
    tags, problems = set_tags(dag_id, run_id, text, session)
    if tags is None:
        page = job_data(session, find_job_run(session, dag_id, run_id))
        return HTMLResponse(pages.job_page_html(page, tag_errors=problems, tags_typed=text), status_code=422)
    return RedirectResponse(_page_href(dag_id, run_id) + "#tags", status_code=303)


def set_tags(dag_id: str, run_id: str, text: str, session: Any) -> tuple[dict[str, str] | None, list[str]]:
    """Check `key=value` lines with the spec's tag rules and save them: (tags, []) or (None, problems)."""
    found = find_job_run(session, dag_id, run_id)
    tags, problems = parse_tags(found.job, text)
    if tags is not None:
        actions.save_tags(object_storage(), found.layout, tags)
        run_index.note_tags(session, dag_id, run_id, tags)  # the list shows them at once (ADR 0022)
    return tags, problems


# ---- delete ----------------------------------------------------------------------------------------
@router.delete("/api" + RUN, dependencies=DELETE_RUNS + OWN_RUN)
def delete_job(dag_id: str, run_id: str, session: SessionDep, delete_results: bool = False):
    name, results_uri, removed = delete(dag_id, run_id, delete_results, session)
    return {"deleted": {"dag_id": dag_id, "run_id": run_id, "job": name},
            "results": "kept" if removed is None else f"{removed} object(s) deleted", "results_uri": results_uri}


@router.get(RUN + "/delete", dependencies=DELETE_RUNS + OWN_RUN, response_class=HTMLResponse)
def delete_confirmation(dag_id: str, run_id: str, session: SessionDep):
    return pages.delete_page(page_data(find_job_run(session, dag_id, run_id)))


@router.post(RUN + "/delete", dependencies=DELETE_RUNS + OWN_RUN + SAME_ORIGIN, response_class=HTMLResponse)
async def delete_from_page(dag_id: str, run_id: str, request: Request, session: SessionDep):
    wanted = (await request.form()).get("delete_results") not in (None, "", "off")
    name, _results_uri, removed = delete(dag_id, run_id, wanted, session)
    return pages.deleted_page(name, run_id, removed)


def delete(dag_id: str, run_id: str, delete_results: bool, session: Any) -> tuple[str, str, int | None]:
    """Delete the run (409 while it runs); its results too when asked: (job name, results URI, objects removed).

    The run's training credentials are revoked first (`io.scoped_credentials.revoke_run_credentials`).
    """
    found = find_job_run(session, dag_id, run_id)
    if found.state == "running":
        raise HTTPException(409, "the job is running: stop it first")
    hook = object_storage()
    revoke_run_credentials(hook, found.layout, why="the run was deleted")  # its trainings' keys stop working (ADR 0039)
    removed = actions.delete_results(hook, found.layout) if delete_results else None
    dag_runs.delete_run(session, found.run)
    return found.job.name, found.layout.results_uri, removed
