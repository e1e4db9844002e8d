"""Job DAGs by shard: together the shards build what one pass over every spec builds; a spent budget says what it skipped."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from sat_tasks.airflow.job_dags import (
    JobDagFileErrors,
    asset_scheduled_jobs,
    load_job_dags,
    load_shard_dags,
    spec_problems,
)
from sat_tasks.airflow.parse_budget import ParseBudget
from sat_tasks.airflow.shards import JOB_DAG_FILES, shard_of
from sat_tasks.spec import SpecFileErrors

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
