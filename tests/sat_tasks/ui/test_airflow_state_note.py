"""The job page says why Airflow shows a Stopped or Pending - * run as failed (ADR 0025), and only then."""

from __future__ import annotations

import pytest

from sat_tasks.core.status import AIRFLOW_FAILED_BECAUSE, JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec
from sat_tasks.ui.jobs import RunRef, job_page
from sat_tasks.ui.pages import job_page_html
from tests.sat_tasks.spec.test_spec import BASE


def _page(status: JobStatus, run_state: str) -> str:
    job = parse_spec({**BASE, "name": "state-note"})
    layout = JobRun(job, "manual__1")
    store = {layout.status_uri: [{"status": "Running", "at": "t1", "attempt": 1, "reason": "attempt 1 started"},
                                 {"status": status.value, "at": "t2", "attempt": 1, "reason": "how it ended"}]}
    return job_page_html(job_page(RunRef("state-note", "manual__1", run_state), job, store.get))


@pytest.mark.parametrize("status", [pytest.param(s, id=s.name.lower()) for s in AIRFLOW_FAILED_BECAUSE])
def test_a_failed_dag_run_of_a_job_that_did_not_fail_says_why(status):
    html = _page(status, "failed")
    assert "id='airflow-state'" in html and "Airflow shows this run as failed" in html


@pytest.mark.parametrize(("status", "run_state"), [
    pytest.param(JobStatus.COMPLETED, "success", id="completed"),
    pytest.param(JobStatus.FAILED, "failed", id="failed-says-it-itself"),
    pytest.param(JobStatus.STOPPED, "running", id="stopped-while-finalize-runs"),
])
def test_no_note_where_airflow_and_the_status_agree(status, run_state):
    assert "id='airflow-state'" not in _page(status, run_state)
