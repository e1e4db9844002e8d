"""A job DAG file's parse budget, and the skip reports that `sat_job_spec_errors.py` turns into an import error."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

from sat_tasks.airflow.parse_budget import (
    NAMED_SKIPPED,
    ParseBudget,
    SkipReport,
    build_seconds,
    parse_budget,
    read_reports,
    record_pass,
    report_dir,
)


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("import_timeout", "processor_timeout", "seconds"), [
    pytest.param(30.0, 50.0, 15.0, id="airflow-defaults"),
    pytest.param(60.0, 50.0, 15.0, id="import-longer-than-processor"),
    pytest.param(10.0, 50.0, 8.0, id="short-import"),
    pytest.param(30.0, 0.0, 24.0, id="no-processor-limit"),
    pytest.param(0.0, 0.0, float("inf"), id="no-limit"),
])
def test_build_seconds_leave_room_to_serialize(import_timeout, processor_timeout, seconds):
    assert build_seconds(import_timeout, processor_timeout) == pytest.approx(seconds)


def test_the_budget_comes_from_airflows_timeouts(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "12")
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT", "100")
    budget = parse_budget("/dags/sat_jobs_00.py", started=time.monotonic() - 20)
    assert budget.seconds == pytest.approx(9.6)
    assert budget.exhausted() and not ParseBudget(9.6).exhausted()


def _report(file="sat_jobs_03.py", skipped=("/jobs/a.yaml", "/jobs/b.yaml")):
    return SkipReport(file, tuple(skipped), built=40, spent_seconds=20.1, budget_seconds=20.0)


def test_a_pass_that_skipped_is_logged_and_kept_until_a_pass_finishes(caplog):
    record_pass("/jobs", _report())
    assert "sat_jobs_03.py: stopped after 20.1s of its 20.0s parse budget (40 done); 2 spec file(s)" in caplog.text
    assert "/jobs/b.yaml" in caplog.text
    assert read_reports("/jobs") == [_report()]
    assert read_reports("/other-jobs") == []
    record_pass("/jobs", _report(skipped=()))
    assert read_reports("/jobs") == []


def test_reports_of_other_files_and_old_reports_are_ignored():
    record_pass("/jobs", _report("sat_jobs_03.py"))
    record_pass("/jobs", _report("sat_jobs_99.py"))
    assert [r.dag_file for r in read_reports("/jobs", {"sat_jobs_03.py"})] == ["sat_jobs_03.py"]
    old = time.time() - 7200
    for path in report_dir("/jobs").glob("*.json"):
        os.utime(path, (old, old))
    assert read_reports("/jobs") == []


def test_reports_in_a_folder_others_may_write_are_not_trusted():
    record_pass("/jobs", _report())
    os.chmod(report_dir("/jobs").parent, 0o777)
    assert read_reports("/jobs") == []
    os.chmod(report_dir("/jobs").parent, 0o700)
    assert read_reports("/jobs") == [_report()]


def test_a_damaged_report_is_skipped():
    record_pass("/jobs", _report())
    (report_dir("/jobs") / "sat_jobs_04.json").write_text(json.dumps({"dag_file": "sat_jobs_04.py"}))
    assert read_reports("/jobs") == [_report()]


def test_a_report_names_a_few_skipped_files_and_counts_the_rest(caplog):
    many = _report(skipped=[f"/jobs/spec-{i:05d}.yaml" for i in range(5000)])
    lines = many.lines()
    assert lines[1:3] == ["  /jobs/spec-00000.yaml", "  /jobs/spec-00001.yaml"]
    assert f"  ... and {5000 - NAMED_SKIPPED} more spec file(s)" in lines and len(lines) == NAMED_SKIPPED + 2
    assert "5000 spec file(s) were left out" in lines[0]
    record_pass("/jobs", many)
    assert "/jobs/spec-04999.yaml" not in caplog.text and "(all 5000 listed in " in caplog.text
    assert read_reports("/jobs")[0].skipped == many.skipped  # the report keeps every one
    assert _report().lines()[1:] == ["  /jobs/a.yaml", "  /jobs/b.yaml"]
