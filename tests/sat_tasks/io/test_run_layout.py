"""JobRun by role: the layout's URIs without I/O, the records through the one hook they hold."""

from __future__ import annotations

import pytest

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


# ---- the results prefix: injective, scoped by DAG (issue 29.4, ADR 0024) --------------------------
RUN_IDS = ["manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00_00_00_00_00", "manual__2026-01-01T00:00:00_00:00",
           "a+b", "a:b", "a_b", "a%3Ab", "a/b", ".", "..", "x.", "é"]


def test_distinct_run_ids_get_distinct_prefixes_and_the_key_gives_the_run_id_back():
    from sat_tasks.config import run_id_of_key, run_key, safe_run_id

    assert len({safe_run_id(r) for r in RUN_IDS}) < len(RUN_IDS)  # the legacy rule folds ids together
    layouts = [RunLayout.of(_job(), "sat_training_job", run_id) for run_id in RUN_IDS]
    assert len({layout.results_uri for layout in layouts}) == len(RUN_IDS)
    assert len({layout.run_dir for layout in layouts}) == len(RUN_IDS)
    for run_id in RUN_IDS:
        key = run_key(run_id)
        assert "/" not in key and key not in (".", "..") and not key.startswith(".")
        assert run_id_of_key(key) == run_id


def test_the_prefix_is_scoped_by_the_dag_so_a_generic_twin_cannot_share_a_job_dag_s():
    from sat_tasks.io.run_layout import results_prefix

    victim = RunLayout.of(_job().model_copy(update={"name": "tiny-llama-demo"}), "tiny-llama-demo", "manual__1")
    assert victim.results_uri == "s3://out-bucket/results/tiny-llama-demo/tiny-llama-demo/manual__1/"
    # The generic DAG's person picks the job name, the run id and the destination; none of them reaches it.
    twins = [RunLayout.of(_job(results=dest).model_copy(update={"name": name}), "sat_training_job", run_id)
             for dest in ("s3://out-bucket/results/", "s3://out-bucket/results/tiny-llama-demo",
                          "s3://out-bucket/results/tiny-llama-demo/tiny-llama-demo")
             for name in ("tiny-llama-demo", "manual-1", "layout") for run_id in ("manual__1", "tiny-llama-demo")]
    assert victim.results_uri not in {twin.results_uri for twin in twins}
    assert all(twin.results_uri.split("/")[-4] == "sat_training_job" for twin in twins)
    assert results_prefix("s3://b/r", "d", "j", "r:1") == "s3://b/r/d/j/r%3A1/"


def test_a_job_without_a_recorded_dag_keeps_the_legacy_prefix_and_the_spec_s_own_dag_id_is_replaced():
    legacy = RunLayout(_job(), "manual__2026-01-01T00:00:00+00:00")
    assert legacy.dag_id is None and legacy.results_uri == "s3://out-bucket/results/layout/manual__2026-01-01T00_00_00_00_00/"
    forged = RunLayout.of(_job(), "tiny-llama-demo", "r")
    again = RunLayout.of(forged.job, "sat_training_job", "r")
    assert again.dag_id == "sat_training_job" and "/tiny-llama-demo/" not in again.results_uri


@pytest.mark.parametrize(("layout", "dag_id", "owned"), [
    pytest.param(RunLayout.of(_job(), "sat_training_job", "r"), "sat_training_job", True, id="scoped-own"),
    pytest.param(RunLayout.of(_job(), "tiny-llama-demo", "r"), "sat_training_job", False, id="scoped-other-dag"),
    pytest.param(RunLayout(_job().model_copy(update={"name": "tiny-llama-demo"}), "r"), "tiny-llama-demo", True,
                 id="legacy-job-dag-own"),
    pytest.param(RunLayout(_job().model_copy(update={"name": "tiny-llama-demo"}), "r"), "sat_training_job", False,
                 id="legacy-generic-twin-of-a-job-dag"),
    pytest.param(RunLayout(_job(), "r"), "sat_training_job", True, id="legacy-generic-other-name"),
])
def test_ownership_a_run_reaches_only_its_own_dag_s_objects(layout, dag_id, owned):
    from sat_tasks.io.run_layout import ownership_problem

    assert (ownership_problem(layout, dag_id, {"tiny-llama-demo", "layout-b"}) is None) is owned


def test_objects_under_an_encoded_run_key_round_trip_through_the_embedded_store(s3_hook):
    job = _job(results="s3://layout-tests/r/")
    if not s3_hook.check_for_bucket("layout-tests"):
        s3_hook.create_bucket(bucket_name="layout-tests", region_name="us-east-1")
    one, two = (RunRecords(RunLayout.of(job, "sat_training_job", run_id), hook=s3_hook)
                for run_id in ("manual__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00_00_00_00_00"))
    one.store_record(AttemptRecord(job=job.name, attempt=1, backend="local", node="n1", exit_code=0))
    assert one.load_record(1).node == "n1" and two.load_record(1) is None
    bucket, prefix = one.layout.results_uri[len("s3://"):].split("/", 1)
    assert s3_hook.list_keys(bucket_name=bucket, prefix=prefix) == [prefix + "attempts/attempt-1.json"]
