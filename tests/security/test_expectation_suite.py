"""A job's `data.expectation_suite` names a suite inside the project's suites directory, nothing else on the worker."""

from __future__ import annotations

import pytest

from sat_tasks.io.validation import ExpectationSuiteError, expectations_dir, resolve_suite_path
from sat_tasks.spec import SpecError, parse_spec


def spec_with_suite(suite: str) -> dict:
    return {"name": "tiny-job", "learning_type": "on-demand", "framework": "pytorch", "nodes": 1,
            "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "8Gi", "shared_memory": "1Gi"},
            "image": {"url": "registry.example.com/team/train:1.0"},
            "data": {"source": "s3://sat-demo/datasets/tiny-corpus/", "expectation_suite": suite},
            "results": {"destination": "s3://sat-demo/results/"}, "command": "python train.py"}


@pytest.mark.parametrize("suite", [
    pytest.param("/etc/passwd", id="absolute"),
    pytest.param("../../../etc/passwd", id="dotdot"),
    pytest.param("team/../../x", id="dotdot-inside"),
    pytest.param("~/suite.json", id="home"),
    pytest.param("./suite", id="dot"),
    pytest.param("team\\suite", id="backslash"),
])
def test_a_suite_outside_the_suites_directory_is_refused_with_the_field_and_rule(suite: str) -> None:
    with pytest.raises(SpecError, match=r"data\.expectation_suite: must be a suite name or a relative path inside"):
        parse_spec(spec_with_suite(suite), source="job.yaml")


@pytest.mark.parametrize("suite", [pytest.param("text_corpus", id="name"),
                                   pytest.param("team/corpus.json", id="relative-path")])
def test_names_inside_the_suites_directory_are_kept(suite: str) -> None:
    assert parse_spec(spec_with_suite(suite), source="job.yaml").data.expectation_suite == suite


def test_the_worker_never_resolves_a_suite_above_its_directory() -> None:
    with pytest.raises(ExpectationSuiteError, match=r"must be a relative path inside .*expectations"):
        resolve_suite_path("../../../../etc/passwd")
    assert resolve_suite_path(None).parent == expectations_dir()
