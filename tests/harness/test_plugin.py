"""The pytest plugin as a repository sees it: inert until opted in, then one test per spec and scenario (pytester)."""

from __future__ import annotations

import shutil

import pytest

from tests.support.paths import REPO

pytest_plugins = ("pytester",)

USER_REPO = REPO / "include" / "examples" / "user-repo"
GENERATED = [
    "jobs/tiny-lm-spot.yaml::dag_integrity",
    "jobs/tiny-lm-spot.yaml::smoke",
    "jobs/tiny-lm-spot.yaml::rehearse[spot_reclaim@15]",
    "jobs/tiny-lm.yaml::dag_integrity",
    "jobs/tiny-lm.yaml::smoke",
    "jobs/tiny-lm.yaml::rehearse[hardware_fault@15]",
    "jobs/tiny-lm.yaml::rehearse[user_error@5]",
]


@pytest.fixture
def user_repo(pytester: pytest.Pytester):
    """A copy of the example user repository as pytester's working directory."""
    shutil.copytree(USER_REPO, pytester.path, dirs_exist_ok=True)
    return pytester


def collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def test_without_opting_in_no_spec_is_collected_and_the_fixtures_say_how_to_opt_in(pytester: pytest.Pytester):
    shutil.copytree(USER_REPO / "jobs", pytester.path / "jobs")
    pytester.makepyfile(test_mine="def test_run(sat_job_run):\n    sat_job_run('jobs/tiny-lm.yaml')\n")
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # test_mine only: nothing from jobs/
    assert "SAT's fixtures need spec folders: set `sat_specs = <folder>`" in result.stdout.str()


def test_sats_own_configuration_collects_none_of_its_demo_specs(pytester: pytest.Pytester):
    """SAT's suite loads the plugin too (it is installed), but sets no sat_specs: include/jobs stays out."""
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                                "--rootdir", str(REPO), str(REPO / "include" / "jobs"))
    assert collected(result) == [] and result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_one_line_generates_integrity_smoke_and_rehearsal_tests(user_repo: pytest.Pytester):
    items, _ = user_repo.inline_genitems("-p", "no:cacheprovider")
    spec_items = [item for item in items if item.nodeid.startswith("jobs/")]
    assert [item.nodeid for item in spec_items] == GENERATED
    assert [item.nodeid for item in items[len(spec_items):]] == [
        "tests/test_tiny_lm.py::test_smoke_run_learns_and_keeps_its_checkpoints"]
    # -m selects them by kind
    assert [[m.name for m in item.iter_markers()] for item in spec_items] == [
        ["sat_integrity"], ["sat_smoke"], ["sat_rehearsal"], ["sat_integrity"], ["sat_smoke"], ["sat_rehearsal"],
        ["sat_rehearsal"]]


def test_spec_folders_are_collected_even_when_testpaths_leaves_them_out(user_repo: pytest.Pytester):
    user_repo.path.joinpath("pytest.ini").write_text("[pytest]\nsat_specs = jobs\ntestpaths = tests\n")
    result = user_repo.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert collected(result) == ["tests/test_tiny_lm.py::test_smoke_run_learns_and_keeps_its_checkpoints"] + GENERATED


def test_an_invalid_spec_fails_its_integrity_test_with_field_and_rule(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nsat_specs = jobs\n")
    (pytester.path / "jobs").mkdir()
    spec = (USER_REPO / "jobs" / "tiny-lm.yaml").read_text().replace("name: tiny-lm", "name: Tiny_LM")
    (pytester.path / "jobs" / "broken.yaml").write_text(spec.replace("job_failover: true", "job_failover: maybe"))
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)  # no smoke or rehearsal test for a spec that cannot run
    text = result.stdout.str()
    assert "jobs/broken.yaml: the spec is invalid (2 problem(s)); fix the fields named:" in text
    assert "name: must be 3-63 chars of lowercase letters" in text and "job_failover:" in text
    assert "Traceback" not in text  # the problems, not pytest's view of the harness


def test_a_missing_spec_folder_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\nsat_specs = no-such-folder\n")
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "sat_specs: no such folder or file" in result.stderr.str()
