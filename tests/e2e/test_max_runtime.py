"""The stopping condition `max_runtime_seconds` (SageMaker's MaxRuntimeInSeconds; issue 45 item 7), end to end.

Local backend, embedded S3, dag.test(): a job whose training would run ~150 s is given 20 s of
Running time (room for a slow start on a busy machine: the trainer must have imported and
committed a step before the stop comes). It is stopped as a person's Stop would stop it: SIGTERM, the engine's final
checkpoint, status Stopped with the reason, results uploaded. A backend that does not pass a
stop request on refuses the field at validation, naming it.
"""

from __future__ import annotations

import pytest

from sat_tasks.spec import SpecError
from tests.e2e.test_job_dags import SCRIPTS, job_log, make_job, run, statuses


@pytest.fixture(scope="module")
def scripts(s3_hook, demo_bucket, airflow_db):
    """The stand-in trainers in the demo bucket, under test-scripts/ (as test_job_dags's fixture puts them)."""
    for path in SCRIPTS.glob("*.py"):
        s3_hook.load_file(filename=path, key=f"test-scripts/{path.name}", bucket_name=demo_bucket, replace=True)


def test_a_job_past_its_maximum_runtime_is_stopped_with_a_final_checkpoint(scripts, s3_hook):
    job = make_job("e2e-max-runtime", max_runtime_seconds=20,
                   env={"FAKE_STEPS": "1500", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.1"})
    report, attempts = run(job)
    assert report["status"] == "Stopped", statuses(report)
    assert [a["verdict"] for a in attempts] == ["STOPPED"]
    ended = report["history"][-1]
    assert "max_runtime_seconds (20 s of Running time used up)" in ended["reason"], ended
    assert "the job's stopping condition" in ended["reason"], ended
    assert attempts[0]["last_committed_step"] is not None  # the final checkpoint
    text = job_log(s3_hook, job, report)
    assert "attempt 1 ended: exit status 143" in text  # SIGTERM, as a person's Stop sends it


def test_a_backend_that_does_not_pass_a_stop_request_on_refuses_the_field(monkeypatch):
    from sat_tasks.pipeline.steps import resolve_job

    monkeypatch.setenv("AIRFLOW__SAT__ALLOWED_BACKENDS", "local,kubernetes")
    spec = make_job("max-runtime-k8s", max_runtime_seconds=60).to_dict()
    with pytest.raises(SpecError) as refused:
        resolve_job({**spec, "backend": "kubernetes"}, None)
    assert [p.field for p in refused.value.problems] == ["max_runtime_seconds"]
    assert "does not pass a run's stop request" in refused.value.problems[0].rule
    assert resolve_job({**spec, "backend": "local"}, None).max_runtime_seconds == 60
