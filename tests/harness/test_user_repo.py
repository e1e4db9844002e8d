"""The example user repository through SAT's plugin, as a user's CI runs it: `pytest` in that directory (a subprocess).

`make test` runs the DAG integrity tests of both specs, the smoke run of one and the user's
own test against that run; every run of both specs, rehearsals included, is `slow` (about
four more runs through Airflow, minutes on a loaded machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.support.paths import REPO

USER_REPO = REPO / "include" / "examples" / "user-repo"
FAST = ["jobs/tiny-lm-spot.yaml::dag_integrity", "jobs/tiny-lm.yaml::dag_integrity", "jobs/tiny-lm.yaml::smoke",
        "tests/test_tiny_lm.py::test_smoke_run_learns_and_keeps_its_checkpoints"]


def run_user_repo(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """`pytest ARGS` in the example repository, with the environment of a user's CI (none of SAT's test settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SAT_", "PYTEST_"))}
    (tmp_path / "tmp").mkdir()
    env.update(TMPDIR=str(tmp_path / "tmp"), PYTHONDONTWRITEBYTECODE="1")
    report = tmp_path / "junit.xml"
    before = litter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "--junitxml", str(report), *args], cwd=USER_REPO, env=env, capture_output=True,
                            text=True, timeout=1800, check=False)
    outcomes = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):  # classname: jobs.tiny-lm.yaml, tests.test_x
            module = case.get("classname")
            path = module[:-5].replace(".", "/") + ".yaml" if module.endswith(".yaml") else module.replace(".", "/") + ".py"
            name = f"{path}::{case.get('name')}"
            failed = case.find("failure") is not None or case.find("error") is not None
            outcomes[name] = "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
    assert litter() == before, "the run left files in the example repository"
    return result, outcomes


def litter() -> set[str]:
    """What a pytest run may leave in a repository (caches, bytecode): none of it may be new after a run."""
    return {str(p) for p in USER_REPO.rglob("*") if p.name in (".pytest_cache", "__pycache__")}


def assert_all_passed(result: subprocess.CompletedProcess, outcomes: dict[str, str], expected: list[str], tmp_path):
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert sorted(outcomes) == sorted(expected) and set(outcomes.values()) == {"passed"}, outcomes
    assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("sat-test-")] == []  # cleaned up


def test_integrity_of_both_specs_a_smoke_run_and_the_users_own_test(tmp_path):
    result, outcomes = run_user_repo(tmp_path, "-k", "dag_integrity or (tiny-lm.yaml and smoke) or test_smoke_run")
    assert_all_passed(result, outcomes, FAST, tmp_path)


@pytest.mark.slow
def test_every_generated_test_of_the_example_repository_passes(tmp_path):
    result, outcomes = run_user_repo(tmp_path)
    assert_all_passed(result, outcomes, FAST + [
        "jobs/tiny-lm-spot.yaml::smoke", "jobs/tiny-lm-spot.yaml::rehearse[spot_reclaim@15]",
        "jobs/tiny-lm.yaml::rehearse[hardware_fault@15]", "jobs/tiny-lm.yaml::rehearse[user_error@5]"], tmp_path)
