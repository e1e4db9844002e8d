"""Bulk Stop and Delete from the Training Jobs list (issue 45 item 7): the ticked runs, one confirmation.

`GET /sat/jobs/bulk?action=stop|delete&run=<dag_id>/<run_id>&...` is the confirmation: each ticked
run and what will happen to it, or why nothing will (not found, not the person's to change,
already ended, still running). `POST /sat/jobs/bulk` (same origin) does it and says what happened
to each. Each run is checked as its own route checks it: the person may read its DAG and act on
its runs (`security.may_act_on_runs`), and a generic-DAG run must be theirs to see
(`security.find_visible_run`, ADR 0043); a run that fails a check answers "not found", as its
own route does, so the page is no oracle of others' runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.api_fastapi.common.dagbag import DagBagDep
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select, tuple_

from sat_tasks.core.links import job_page_path, split_run_ref
from sat_tasks.errors import SatError
from sat_tasks.ui import dag_runs, run_index
from sat_tasks.ui.routers.runs import delete, stop
from sat_tasks.ui.security import READ_JOBS, SAME_ORIGIN, find_visible_run, may_act_on_runs, readable_dag_ids
from sat_tasks.ui.templating import render

router = APIRouter(tags=["Training Jobs list"])
MAX_RUNS = run_index.PER_PAGE  # a page of the list
ACTIONS = {"stop": ("PUT", "Stop"), "delete": ("DELETE", "Delete")}
RULE = (f"action: stop or delete; run: 1 to {MAX_RUNS} runs as <dag_id>/<run_id> "
        "(a run= parameter each, ticked on the list)")
NOT_FOUND = "not found (or not yours to see)"
RUNS = Query(default_factory=list, alias="run", description=RULE)


class BulkQueryError(SatError, ValueError):
    """A bulk request that names no action, no run, too many, or a run not as <dag_id>/<run_id>."""


@dataclass
class Target:
    """One ticked run and what the bulk action does to it: `problem` None when it can go ahead."""

    dag_id: str
    run_id: str
    job: str = ""
    state: str = ""  # the DAG run's state (Airflow's word)
    status: str = ""  # the job's status, as the list shows it (Pending, Running, Stopped...)
    problem: str | None = None
    done: str | None = None

    @property
    def href(self) -> str:
        return job_page_path(self.dag_id, self.run_id)


def parse(action: str | None, values: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """The action and the runs, in order and without repeats; BulkQueryError naming the rule otherwise."""
    if action not in ACTIONS or not values or len(values) > MAX_RUNS:
        raise BulkQueryError(RULE)
    refs: list[tuple[str, str]] = []
    for value in values:
        ref = split_run_ref(value)
        if ref is None:
            raise BulkQueryError(RULE)
        if ref not in refs:
            refs.append(ref)
    return action, refs


def targets(user: Any, session: Any, action: str, refs: list[tuple[str, str]]) -> list[Target]:
    """Each run, checked as its own route checks it, with why the action cannot touch it (if so)."""
    method = ACTIONS[action][0]
    readable = readable_dag_ids(user, {dag_id for dag_id, _ in refs})
    found: list[Target] = []
    for dag_id, run_id in refs:
        target = Target(dag_id, run_id)
        found.append(target)
        try:
            run = find_visible_run(user, session, dag_id, run_id, readable)
        except HTTPException:
            target.problem = NOT_FOUND
            continue
        target.job, target.state = run.job.name, run.state
        if not may_act_on_runs(user, dag_id, method):
            target.problem = f"you may not {action} runs of {dag_id}"
        elif action == "stop" and run.state not in dag_runs.ACTIVE:
            target.problem = "already ended: nothing to stop"
        elif action == "delete" and run.state == "running":
            target.problem = "running: stop it first"
    _note_statuses(session, found)
    return found


def _note_statuses(session: Any, found: list[Target]) -> None:
    """Each found run's job status in the list's words: its index row's (one query), else its DAG-run state's."""
    known = [(t.dag_id, t.run_id) for t in found if t.state]
    rows: dict[tuple[str, str], str] = {}
    if known:
        run_index.ensure_table(session)
        C = run_index.C
        rows = {(dag_id, run_id): status for dag_id, run_id, status in session.execute(
            select(C.dag_id, C.run_id, C.status).where(tuple_(C.dag_id, C.run_id).in_(known)))}
    for target in found:
        if target.state:
            target.status = rows.get((target.dag_id, target.run_id)) or run_index.STATUS_BEFORE_HISTORY.get(
                target.state, target.state)


def _page(action: str, found: list[Target], *, done: bool = False, problem: str | None = None) -> str:
    return render("bulk.html", action=action, verb=ACTIONS.get(action, ("", action))[1], targets=found, done=done,
                  problem=problem, ready=sum(t.problem is None for t in found))


@router.get("/jobs/bulk", dependencies=READ_JOBS, response_class=HTMLResponse)
def bulk_confirmation(user: GetUserDep, session: SessionDep, action: str | None = None,
                      run: list[str] = RUNS):
    """What Stop or Delete of the ticked runs would do to each, and one button to do it."""
    try:
        wanted, refs = parse(action, run)
    except BulkQueryError as exc:
        return HTMLResponse(_page(action or "", [], problem=str(exc)), status_code=400)
    return _page(wanted, targets(user, session, wanted, refs))


@router.post("/jobs/bulk", dependencies=READ_JOBS + SAME_ORIGIN, response_class=HTMLResponse)
async def bulk_action(request: Request, user: GetUserDep, session: SessionDep, dag_bag: DagBagDep):
    """Stop or Delete the ticked runs that may be (each checked again), and say what happened to each."""
    form = await request.form()
    try:
        wanted, refs = parse(str(form.get("action") or ""), [str(v) for v in form.getlist("run")])
    except BulkQueryError as exc:
        return HTMLResponse(_page(str(form.get("action") or ""), [], problem=str(exc)), status_code=400)
    with_results = form.get("delete_results") not in (None, "", "off")
    found = targets(user, session, wanted, refs)
    for target in found:
        if target.problem is not None:
            continue
        try:
            if wanted == "stop":
                stop(target.dag_id, target.run_id, user, session, dag_bag)
                target.done = "stop requested"
            else:
                _, _, removed = delete(target.dag_id, target.run_id, with_results, session)
                target.done = "deleted" + (f", with its {removed} result objects" if removed is not None else
                                           "; its results stay in Object Storage")
        except HTTPException as exc:  # it ended or started meanwhile: said, and the others go on
            target.problem = str(exc.detail)
    session.commit()
    return _page(wanted, found, done=True)
