"""A run never ends Completed without its outputs, and its tasks run where its files are (issue 48.1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sat_tasks.core.handoffs import Action, Decision, VerdictKind
from sat_tasks.errors import JobStopped
from sat_tasks.io import object_storage as storage
from sat_tasks.io import run_location
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import outputs, steps
from sat_tasks.spec import parse_spec

BUCKET = "sat-outputs-tests"
QUIET = lambda _m: None
UPLOAD = [Decision(attempt=1, verdict=VerdictKind.SUCCEEDED, action=Action.UPLOAD, why="exit 0").to_xcom()]


def _job(s3_hook, command: str):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return parse_spec({"name": "outputs-job", "image": {"url": "registry.example.com/x:1"},
                       "data": {"source": f"s3://{BUCKET}/data/"}, "results": {"destination": f"s3://{BUCKET}/r/"},
                       "command": command}).with_backend("local")


def _trained(job, run_id: str, files: dict[str, bytes]) -> JobRun:
    """A run staged here (its marker written) whose training wrote `files` to its output directory."""
    run = JobRun(job, run_id)
    run.data_dir.mkdir(parents=True, exist_ok=True)
    run_location.mark(run, QUIET)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (run.output_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run.output_dir / name).write_bytes(data)
    return run


def _last(run: JobRun) -> dict:
    return run.history(QUIET).entries()[-1]


def test_outputs_that_reached_object_storage_end_the_job_completed(s3_hook):
    job = _job(s3_hook, 'python train.py --output_dir "$SAT_OUTPUT_DIR"')
    run = _trained(job, "manual__outputs-ok", {"model.safetensors": b"w" * 1000, "ckpt/step-1/state.json": b"{}"})
    result = steps.upload_results(job, run.run_id, UPLOAD, log=QUIET)
    assert result["files"] == 2 and result["bytes_total"] == 1002, result
    assert outputs.stored_objects(s3_hook, run.output_uri) == {"model.safetensors": 1000, "ckpt/step-1/state.json": 2}
    assert _last(run)["status"] == "Completed"


def test_an_output_the_upload_left_out_fails_the_job_naming_the_file(s3_hook, monkeypatch):
    job = _job(s3_hook, "python train.py")
    run = _trained(job, "manual__outputs-lost", {"model.safetensors": b"w" * 1000, "tokenizer.json": b"t" * 10})
    backend = steps.backend_for(job)

    def upload_one(run_, log):  # an upload that lost a file on its way (what a worker without the files does)
        storage.write_json(run_.hook(), run_.output_uri + "tokenizer.json", "x" * 8)
        return {"source": str(run_.output_dir), "files": 1, "bytes_total": 10}

    monkeypatch.setattr(backend, "upload_outputs", upload_one)
    with pytest.raises(JobStopped) as stopped:
        steps.upload_results(job, run.run_id, UPLOAD, log=QUIET)
    message = str(stopped.value)
    assert "1 of 2 output file(s) not uploaded: model.safetensors (1000 B)" in message
    assert "tokenizer.json (10 B written, 10 B uploaded)" not in message  # the same size: not a problem
    last = _last(run)
    assert last["status"] == "Failed" and "model.safetensors (1000 B)" in last["reason"], last


def test_a_job_that_declares_outputs_and_wrote_none_fails(s3_hook):
    job = _job(s3_hook, 'python train.py --output_dir "$SAT_OUTPUT_DIR"')
    run = _trained(job, "manual__outputs-none", {})
    with pytest.raises(JobStopped, match=r"the training wrote no output: its command names \$SAT_OUTPUT_DIR"):
        steps.upload_results(job, run.run_id, UPLOAD, log=QUIET)
    assert _last(run)["status"] == "Failed"


def test_a_job_that_declares_no_outputs_completes_without_any(s3_hook):
    job = _job(s3_hook, 'echo "on $SAT_NODE"')
    run = _trained(job, "manual__outputs-undeclared", {})
    steps.upload_results(job, run.run_id, UPLOAD, log=QUIET)
    assert _last(run)["status"] == "Completed"


def test_the_problems_name_short_files_and_a_report_that_read_more_than_was_stored():
    job = parse_spec({"name": "outputs-job", "image": {"url": "r.example.com/x:1"}, "data": {"source": "s3://bkt/d/"},
                      "results": {"destination": "s3://bkt/r/"}, "command": "python t.py"})
    written = {f"f{i:02}": 5 for i in range(12)}
    problems = outputs.output_problems(job, written, {"f00": 4}, {"files": 12, "source": "/pod/output"})
    assert problems[0].startswith("11 of 12 output file(s) not uploaded: f01 (5 B), ") and "and 1 more" in problems[0]
    assert problems[1] == "1 output file(s) uploaded with another size: f00 (5 B written, 4 B uploaded)"
    assert problems[2] == "the upload read 12 file(s) from /pod/output, but Object Storage holds 1"
    # the Kubernetes way: no output directory on this worker, the upload pod's report and the listing agree
    assert outputs.output_problems(job, None, {"model.bin": 7}, {"files": 1, "source": "/pod/output"}) == []


def test_a_task_on_a_worker_without_the_runs_files_fails_naming_where_they_are(s3_hook, tmp_path, monkeypatch):
    job = _job(s3_hook, 'python train.py --output_dir "$SAT_OUTPUT_DIR"')
    run = _trained(job, "manual__elsewhere", {"model.safetensors": b"w"})
    marker = json.loads((run.run_dir / run_location.MARKER_NAME).read_text())
    assert storage.read_json(s3_hook, run_location.object_uri(run)) == marker
    run_location.check(run, QUIET)  # the worker that staged it
    staged_dir = run.run_dir

    other = tmp_path / "other-worker-work"  # a second worker: its own work directory, without the run's files
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(other))
    assert JobRun(job, run.run_id).run_dir != staged_dir
    for task in (lambda: steps.upload_results(job, run.run_id, UPLOAD, log=QUIET),
                 lambda: steps.validate_data(job, run.run_id, {}, log=QUIET),
                 lambda: steps.cleanup_run(job, run.run_id, log=QUIET)):
        with pytest.raises(run_location.RunFilesElsewhere) as elsewhere:
            task()
        message = str(elsewhere.value)
        assert f"work directory {other}" in message and "finds no marker" in message, message
        assert f"staged on {marker['host']} in {marker['run_dir']}" in message, message
        assert "workers that share one work directory" in message and "Kubernetes backend" in message
    assert not storage.read_json(s3_hook, run.output_uri + "model.safetensors")  # nothing uploaded from there

    # a work directory the workers share: the second worker sees the marker, and the task runs
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(Path(marker["work_dir"])))
    steps.upload_results(job, run.run_id, UPLOAD, log=QUIET)
    assert _last(run)["status"] == "Completed"


def test_a_run_staged_again_elsewhere_takes_the_new_place(s3_hook):
    job = _job(s3_hook, "python train.py")
    run = _trained(job, "manual__restaged", {})
    (run.run_dir / run_location.MARKER_NAME).write_text(json.dumps({"token": "an-older-staging"}))
    with pytest.raises(run_location.RunFilesElsewhere, match="finds another run's marker"):
        run_location.check(run, QUIET)
    run_location.mark(run, QUIET)
    run_location.check(run, QUIET)


def test_a_run_whose_backend_staged_nothing_here_is_not_checked(s3_hook):
    job = _job(s3_hook, "python train.py")
    run = JobRun(job, "manual__staged-in-a-pod")
    assert run_location.mark(run, QUIET) is None  # no data directory on this worker (a pod's claim)
    assert storage.read_json(s3_hook, run_location.object_uri(run)) is None
    run_location.check(run, QUIET)
