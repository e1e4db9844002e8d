"""`sat test`: the pytest command line it builds, and a run in a directory without any pytest configuration."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sat_tasks.cli import build_parser
from sat_tasks.cli.test import pytest_args
from tests.support.paths import REPO

SAT = Path(sys.executable).parent / "sat"
SPEC = REPO / "include" / "examples" / "user-repo" / "jobs" / "tiny-lm.yaml"


def test_paths_become_spec_locations_and_options_pass_through(tmp_path):
    (tmp_path / "jobs").mkdir()
    args = build_parser().parse_args(["test", str(tmp_path / "jobs"), "tests/test_x.py", "-k", "smoke",
                                      "--junitxml", "out.xml", "--max-steps", "8", "--data-sample", "2", "-x"])
    assert pytest_args(args) == [
        "-p", "sat_tasks.testing.plugin", "-p", "no:cacheprovider", "-rfE", "--sat-specs", str(tmp_path / "jobs"),
        "-k", "smoke", "--junitxml", "out.xml", "--sat-max-steps", "8", "--sat-data-sample", "2", "-x",
        str(tmp_path / "jobs"), "tests/test_x.py",
    ]


def test_sat_test_reports_a_bad_spec_by_file_field_and_rule_in_junit_xml(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "team-job.yaml").write_text(SPEC.read_text().replace("learning_type: on-demand",
                                                                              "learning_type: spot"))
    result = subprocess.run([str(SAT), "test", "jobs", "--junitxml", "report.xml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "jobs/team-job.yaml: the spec is invalid" in result.stdout
    assert "job_failover: not allowed with learning_type spot" in result.stdout
    case = ET.parse(tmp_path / "report.xml").getroot().find(".//testcase")
    assert case.get("name") == "dag_integrity" and case.find("failure") is not None
    assert "job_failover: not allowed with learning_type spot" in case.find("failure").text


@pytest.mark.slow
def test_a_failed_rehearsal_names_the_job_the_step_and_what_sat_saw(tmp_path):
    """End to end: a rehearsal whose expectation is wrong fails with SAT's evidence and the job log's tail."""
    shutil.copytree(SPEC.parents[1], tmp_path / "repo")
    spec = tmp_path / "repo" / "jobs" / "tiny-lm.yaml"
    text = spec.read_text()
    text = text.replace("    - {scenario: hardware_fault, at_step: 15}  # fail over, resume from the last checkpoint, complete\n",
                        "")
    spec.write_text(text.replace("{scenario: user_error, at_step: 5}", "{scenario: user_error, at_step: 5, "
                                                                        "expect_status: Completed}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SAT_", "PYTEST_"))}
    result = subprocess.run([str(SAT), "test", "jobs/tiny-lm.yaml", "-k", "rehearse"], cwd=tmp_path / "repo",
                            env=env, capture_output=True, text=True, timeout=1800, check=False)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert ("jobs/tiny-lm.yaml: rehearsal user_error@5 of job tiny-lm (expected: verdict INTERNAL, then stop, final "
            "status 'Completed') failed:") in out, out[-5000:]
    assert "final status 'Pending - internalerror', expected 'Completed'" in out
    assert "verdict INTERNAL" in out and "evidence: " in out  # what the classifier saw
    assert "lines of the job log:" in out and "RehearsedUserError: rehearsed user error at step >= 5" in out
