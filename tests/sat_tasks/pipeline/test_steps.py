"""The task functions' own rules: finalize names the task that really failed, and why."""

from __future__ import annotations

import pytest

from sat_tasks.core.status import (
    TERMINAL,
    JobStatus,
    airflow_failed_because,
    airflow_run_state,
)
from sat_tasks.errors import JobStopped
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import steps
from sat_tasks.spec import parse_spec

BUCKET = "sat-steps-tests"


@pytest.fixture
def job(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return parse_spec({"name": "steps-job", "image": {"url": "registry.example.com/x:1"},
                       "data": {"source": f"s3://{BUCKET}/data/"}, "results": {"destination": f"s3://{BUCKET}/r/"},
                       "command": "python train.py"}).with_backend("local")


def test_finalize_names_the_failed_task_and_the_error_it_noted(job):
    run_id = "manual__finalize-names"
    JobRun(job, run_id).history(lambda _m: None).record(JobStatus.RUNNING, "attempt 1 started", attempt=1)
    steps.record_task_failure(job, run_id, "attempt_1.classify", 3, TimeoutError("the execution API did not answer"))
    with pytest.raises(JobStopped) as stopped:
        steps.finalize(job, run_id, failed_tasks=["attempt_1.classify", "upload_results"], log=lambda _m: None)
    message = str(stopped.value)
    assert "ended as Failed" in message
    assert "attempt_1.classify failed (try 3): TimeoutError: the execution API did not answer" in message
    assert "upload_results failed (see its log: it failed before SAT's code ran)" in message
    last = JobRun(job, run_id).history(lambda _m: None).entries()[-1]
    assert last["status"] == "Failed" and "attempt_1.classify failed" in last["reason"]


def test_without_a_validated_job_finalize_says_which_task_failed_not_that_the_spec_was_bad():
    with pytest.raises(JobStopped, match=r"no validated job: validate_spec failed \(see its log\)"):
        steps.finalize(None, "manual__x", failed_tasks=["validate_spec"], log=lambda _m: None)
    with pytest.raises(JobStopped, match="validate_spec did not run"):
        steps.finalize(None, "manual__x", failed_tasks=[], log=lambda _m: None)


def test_a_terminal_status_is_not_rewritten(job):
    run_id = "manual__terminal"
    history = JobRun(job, run_id).history(lambda _m: None)
    history.record(JobStatus.INTERNAL_ERROR, "internal error in attempt 1 (no retry): ValueError: bad")
    with pytest.raises(JobStopped, match="ended as Pending - internalerror: internal error"):
        steps.finalize(job, run_id, failed_tasks=["attempt_1.launch"], log=lambda _m: None)
    assert history.entries()[-1]["status"] == "Pending - internalerror"


@pytest.mark.parametrize("status", [pytest.param(s, id=s.name.lower()) for s in sorted(TERMINAL, key=lambda s: s.value)])
def test_only_a_completed_job_is_a_successful_dag_run_and_the_others_say_why(job, status):
    """ADR 0025: Airflow's success is for a Completed job; Stopped and Pending - * fail, saying why Airflow shows them so."""
    run_id = f"manual__end-{status.name.lower()}"
    JobRun(job, run_id).history(lambda _m: None).record(status, "how it ended")
    because = airflow_failed_because(status.value)
    if status is JobStatus.COMPLETED:
        assert airflow_run_state(status.value) == "success" and because is None
        assert steps.finalize(job, run_id, log=lambda _m: None)["status"] == "Completed"
        return
    assert airflow_run_state(status.value) == "failed"
    with pytest.raises(JobStopped) as stopped:  # finalize fails: the DAG run is failed
        steps.finalize(job, run_id, log=lambda _m: None)
    assert str(stopped.value).startswith(f"job steps-job ended as {status.value}: how it ended")
    if status is JobStatus.FAILED:
        assert because is None  # the status says it
    else:
        assert because.startswith("Airflow shows this run as failed") and str(stopped.value).endswith(because)
