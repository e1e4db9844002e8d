"""Compare runs: `/sat/compare?run=<dag_id>/<run_id>&run=...` (HTML) and `/sat/api/compare` (JSON), issue 45 item 7.

Each run is read as its job page is (`security.find_visible_run`, `routers.runs.job_data`: the run's records and
the metadata DB's facts, its goodput among them): only a run of a
Training Job DAG the person may read; another DAG's run answers as a run that does not exist.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import HTMLResponse

from sat_tasks.core.links import job_page_path
from sat_tasks.ui import compare
from sat_tasks.ui.routers.runs import job_data
from sat_tasks.ui.security import READ_JOBS, find_visible_run, readable_dag_ids
from sat_tasks.ui.templating import render

router = APIRouter(tags=["Compare runs"])
RUNS = Query(default_factory=list, alias="run", description=compare.REF_RULE)


def _compared(user: Any, session: Any, values: list[str]) -> dict[str, Any]:
    """The comparison of the named runs; 400 naming the rule, 404 for a run that is not there or not theirs."""
    try:
        refs = compare.parse_refs(values)
    except compare.CompareQueryError as exc:
        raise HTTPException(400, str(exc)) from None
    readable = readable_dag_ids(user, {dag_id for dag_id, _ in refs})
    pages = []
    for dag_id, run_id in refs:  # another's run of the generic DAG is a 404 too (ADR 0043)
        pages.append(job_data(session, find_visible_run(user, session, dag_id, run_id, readable)))  # as its page
    return compare.comparison(pages, [job_page_path(dag_id, run_id) for dag_id, run_id in refs])


@router.get("/api/compare", dependencies=READ_JOBS)
def compare_api(user: GetUserDep, session: SessionDep, run: list[str] = RUNS):
    """The runs' loss curves (step, loss) and settings side by side, with the rows whose values differ marked."""
    found = _compared(user, session, run)
    return {"runs": found["runs"], "settings": found["settings"],
            "series": [{"label": s.label, "href": s.href, "points": s.points} for s in found["series"]]}


@router.get("/compare", dependencies=READ_JOBS, response_class=HTMLResponse)
def compare_view(user: GetUserDep, session: SessionDep, run: list[str] = RUNS):
    try:
        found = _compared(user, session, run)
    except HTTPException as exc:
        if exc.status_code != 400:
            raise
        return HTMLResponse(render("compare.html", problem=exc.detail, chart=None, runs=[], settings=[]),
                            status_code=400)
    return render("compare.html", problem=None, chart=compare.loss_chart(found["series"]), runs=found["runs"],
                  settings=found["settings"])
