"""JobRun by role: the layout's URIs without I/O, the records through the one hook they hold."""

from __future__ import annotations

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.io.run_layout import JobRun, RunLayout, RunRecords
from sat_tasks.spec import TrainingJob


def _job(results: str = "s3://out-bucket/results/") -> TrainingJob:
    return TrainingJob.model_validate({
        "name": "layout", "image": {"url": "python:3.11"}, "command": "python train.py",
        "data": {"source": "s3://in-bucket/data/"}, "results": {"destination": results},
    })


def test_the_layout_names_the_run_s_objects_and_needs_no_hook():
    layout = RunLayout(_job(), "manual__1")
    assert layout.results_uri == "s3://out-bucket/results/layout/manual__1/"
    assert layout.attempt_uri(2).startswith(layout.results_uri) and layout.stop_uri.startswith(layout.results_uri)
    assert JobRun(_job(), "manual__1").results_uri == layout.results_uri
    assert JobRun(_job(), "manual__1") == JobRun(_job(), "manual__1")  # a value, as before the split


def test_records_use_the_hook_they_are_given_and_a_job_run_makes_one_on_first_use(monkeypatch, s3_hook):
    from sat_tasks.io import run_layout

    job = _job(results="s3://layout-tests/r/")
    if not s3_hook.check_for_bucket("layout-tests"):
        s3_hook.create_bucket(bucket_name="layout-tests", region_name="us-east-1")
    records = RunRecords(RunLayout(job, "manual__1"), hook=s3_hook)
    record = AttemptRecord(job=job.name, attempt=1, backend="local", node="n1", exit_code=0)
    records.store_record(record)
    assert records.hook() is s3_hook and records.load_record(1) == record and records.load_record(2) is None

    made: list[str] = []
    monkeypatch.setattr(run_layout.storage, "object_storage_hook", lambda conn_id: made.append(conn_id) or s3_hook)
    run = JobRun(job, "manual__1")
    assert run.load_record(1) == record and run.stop_request() is None and run.hook() is s3_hook
    assert len(made) == 1  # one hook per JobRun, made on first use
