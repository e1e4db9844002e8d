"""Job DAGs by shard: together the shards build what one pass over every spec builds; a spent budget says what it skipped."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from sat_tasks.airflow.job_dags import (
    PROBLEM_LINES,
    JobDagFileErrors,
    asset_scheduled_jobs,
    load_job_dags,
    load_shard_dags,
    spec_problems,
)
from sat_tasks.airflow.parse_budget import (
    NAMED_SKIPPED,
    ParseBudget,
    SkipReport,
    read_verdicts,
    report_dir,
)
from sat_tasks.airflow.shards import JOB_DAG_FILES, shard_of
from sat_tasks.spec import SpecFileErrors, loading
from sat_tasks.spec.loading import spec_dag_id

ROOT = Path(__file__).resolve().parents[3]
DEMO = yaml.safe_load((ROOT / "include" / "jobs" / "tiny-llama-demo.yaml").read_text())


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()


def _write(jobs: Path, file: str, name: str) -> Path:
    jobs.mkdir(exist_ok=True)
    (jobs / file).write_text(yaml.safe_dump({**DEMO, "name": name}))
    return jobs / file


def _files_in_two_shards() -> tuple[str, str]:
    """Two spec file names, the first sorting first, in different shards."""
    first = "a-first.yaml"
    second = next(f"b-{i}.yaml" for i in range(100) if shard_of(f"b-{i}.yaml") != shard_of(first))
    return first, second


def test_every_spec_is_built_by_exactly_one_shard(tmp_path):
    jobs = tmp_path / "jobs"
    for i in range(3):
        _write(jobs, f"job-{i}.yaml", f"job-{i}")
    (jobs / "bad.yaml").write_text("name: [unclosed\n")
    built = [load_shard_dags(jobs, k, fileloc=f"/dags/sat_jobs_{k:02d}.py").dags for k in range(JOB_DAG_FILES)]
    ids = [dag_id for dags in built for dag_id in dags]
    assert sorted(ids) == sorted(load_job_dags(jobs, build=False).jobs) == [f"job-{i}" for i in range(3)]
    for k, dags in enumerate(built):
        assert all(shard_of(f"{dag_id}.yaml") == k for dag_id in dags)
        assert all(dag.fileloc == f"/dags/sat_jobs_{k:02d}.py" for dag in dags.values())


def test_a_name_taken_by_an_earlier_file_in_another_shard_has_no_second_dag(tmp_path):
    jobs = tmp_path / "jobs"
    first, second = _files_in_two_shards()
    _write(jobs, first, "same-name")
    _write(jobs, second, "same-name")
    assert list(load_shard_dags(jobs, shard_of(first)).dags) == ["same-name"]
    later = load_shard_dags(jobs, shard_of(second))
    assert later.dags == {} and "already used by an earlier spec file" in later.errors[str(jobs / second)]
    assert "already used by" in str(spec_problems(jobs))


def test_an_invalid_earlier_file_does_not_take_the_name(tmp_path):
    jobs = tmp_path / "jobs"
    first, second = _files_in_two_shards()
    (jobs).mkdir()
    (jobs / first).write_text("name: same-name\ncommand: x\n")  # its hint says same-name, but it is invalid
    _write(jobs, second, "same-name")
    assert list(load_shard_dags(jobs, shard_of(second)).dags) == ["same-name"]


def test_a_spent_budget_builds_nothing_more_and_the_errors_file_names_the_skipped_specs(tmp_path):
    jobs = tmp_path / "jobs"
    first, _ = _files_in_two_shards()
    path = _write(jobs, first, "first-job")
    fileloc = f"/dags/sat_jobs_{shard_of(first):02d}.py"
    spent = load_shard_dags(jobs, shard_of(first), fileloc=fileloc, budget=ParseBudget(0.0))
    assert spent.dags == {} and spent.skipped == [str(path)]
    problems = spec_problems(jobs)
    assert isinstance(problems, JobDagFileErrors) and isinstance(problems, ImportError)
    assert f"sat_jobs_{shard_of(first):02d}.py: stopped after" in str(problems) and f"  {path}" in str(problems)
    finished = load_shard_dags(jobs, shard_of(first), fileloc=fileloc, budget=ParseBudget(60.0))
    assert list(finished.dags) == ["first-job"] and spec_problems(jobs) is None


def test_bad_specs_and_skipped_specs_share_one_import_error(tmp_path):
    jobs = tmp_path / "jobs"
    path = _write(jobs, "a.yaml", "a-job")
    shutil.copy(path, jobs / "b.yaml")
    (jobs / "c.yaml").write_text("name: B\n")
    only_bad = spec_problems(jobs)
    assert type(only_bad) is JobDagFileErrors and isinstance(only_bad, SpecFileErrors)
    assert str(only_bad) == str(SpecFileErrors(load_job_dags(jobs, build=False).errors))
    load_shard_dags(jobs, shard_of("a.yaml"), fileloc="/dags/sat_jobs_13.py", budget=ParseBudget(0.0))
    both = str(spec_problems(jobs))
    assert both.startswith(str(only_bad)) and "sat_jobs_13.py: stopped after" in both


def test_the_errors_file_names_the_specs_it_had_no_time_to_check(tmp_path):
    jobs = tmp_path / "jobs"
    path = _write(jobs, "a.yaml", "a-job")
    problems = spec_problems(jobs, ParseBudget(0.0), fileloc="/dags/sat_job_spec_errors.py")
    assert "sat_job_spec_errors.py: stopped after" in str(problems) and f"  {path}" in str(problems)
    assert spec_problems(jobs, ParseBudget(60.0)) is None


def test_the_watch_file_validates_only_specs_that_may_be_asset_scheduled(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs"
    _write(jobs, "plain.yaml", "plain-job")
    (jobs / "asset.yaml").write_text(yaml.safe_dump({**DEMO, "name": "asset-job",
                                                     "schedule": "asset:s3://sat-demo/datasets/x/"}))
    (jobs / "escaped.yaml").write_text(yaml.safe_dump({**DEMO, "name": "escaped-job"}).replace(
        "name: escaped-job", 'name: escaped-job\nschedule: "\\x61sset:s3://sat-demo/datasets/y/"'))
    validated = []
    real = load_job_dags.__globals__["load_spec_cached"]
    monkeypatch.setitem(load_job_dags.__globals__, "load_spec_cached", lambda p: validated.append(p.name) or real(p))
    found = asset_scheduled_jobs(jobs, "/dags/sat_data_changes.py", ParseBudget(60.0))
    assert sorted(job.name for job in found) == ["asset-job", "escaped-job"]
    assert sorted(validated) == ["asset.yaml", "escaped.yaml"]
    assert spec_problems(jobs) is None
    asset_scheduled_jobs(jobs, "/dags/sat_data_changes.py", ParseBudget(0.0))
    assert "sat_data_changes.py: stopped after" in str(spec_problems(jobs))


def test_the_import_error_stays_small_whatever_the_numbers(tmp_path):
    """The manager reads a child's socket 4 KiB per turn: a message naming thousands of specs got the errors file killed."""
    errors = {f"/jobs/bad-{i:04d}.yaml": f"/jobs/bad-{i:04d}.yaml: name: must match the rule" for i in range(2000)}
    reports = [SkipReport(f"sat_jobs_{k:02d}.py", tuple(f"/jobs/spec-{k}-{i:04d}.yaml" for i in range(300)),
                          built=1, spent_seconds=20.1, budget_seconds=20.0) for k in range(JOB_DAG_FILES)]
    message = str(JobDagFileErrors(errors, reports))
    assert len(message) < 32_000
    assert message.startswith("2000 job spec file(s) are invalid and have no DAG:\n/jobs/bad-0000.yaml: name:")
    assert f"... and {2000 - PROBLEM_LINES} more line(s)" in message and "/jobs/bad-1999.yaml" not in message
    assert all(f"sat_jobs_{k:02d}.py: stopped after 20.1s" in message for k in range(JOB_DAG_FILES))
    assert message.count(f"  ... and {300 - NAMED_SKIPPED} more spec file(s)") == JOB_DAG_FILES
    few = JobDagFileErrors(dict(list(errors.items())[:3]), [])
    assert str(few) == str(SpecFileErrors(few.errors))


def test_the_errors_file_reuses_the_job_dag_files_verdicts_for_unchanged_specs(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs"
    for i in range(4):
        _write(jobs, f"job-{i}.yaml", f"job-{i}")
    _write(jobs, "twin.yaml", "job-0")
    (jobs / "bad.yaml").write_text(yaml.safe_dump({**DEMO, "name": "Bad_Name"}))
    for shard in range(JOB_DAG_FILES):
        load_shard_dags(jobs, shard, fileloc=f"/dags/sat_jobs_{shard:02d}.py", budget=ParseBudget(60.0))
    fresh = str(SpecFileErrors(load_job_dags(jobs, build=False).errors))
    validated = []
    real = loading.load_spec
    monkeypatch.setattr(loading, "load_spec", lambda path: validated.append(Path(path).name) or real(path))
    loading.clear_spec_cache()  # the errors file runs in a process of its own
    assert str(spec_problems(jobs)) == fresh and "bad.yaml: name:" in fresh and "already used by" in fresh
    assert validated == []
    (jobs / "job-2.yaml").write_text(yaml.safe_dump({**DEMO, "name": "job-2", "nodes": 0}))
    assert "job-2.yaml: nodes:" in str(spec_problems(jobs)) and validated == ["job-2.yaml"]


def test_verdicts_that_are_not_what_a_pass_wrote_are_validated_again(tmp_path):
    jobs = tmp_path / "jobs"
    path = _write(jobs, "job-0.yaml", "job-0")
    load_shard_dags(jobs, shard_of(path.name), fileloc="/dags/sat_jobs_00.py", budget=ParseBudget(60.0))
    kept = report_dir(jobs) / "sat_jobs_00.verdicts"
    data = json.loads(kept.read_text())
    data["specs"][str(path)][1] = None  # a verdict with no name and no problems
    kept.write_text(json.dumps(data))
    loading.clear_spec_cache()
    assert spec_problems(jobs) is None
    data["specs"][str(path)][1] = "said-name"
    kept.write_text(json.dumps(data))
    assert spec_dag_id(path, read_verdicts(jobs)) == "said-name"  # what the pass found is taken...
    kept.write_text(json.dumps({**data, "rules": [0]}))  # ...unless it was found under other spec rules
    assert spec_dag_id(path, read_verdicts(jobs)) == "job-0"
