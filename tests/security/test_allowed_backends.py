"""A job runs only on the deployment's allowed backends (issue 29.7, ADR 0019): `{"backend": "local"}` on a Kubernetes deployment is refused."""

from __future__ import annotations

import pytest
import yaml

from sat_tasks.cli.validate import cmd_validate
from sat_tasks.pipeline.steps import resolve_job
from sat_tasks.spec import SpecError

SPEC = {"name": "backend-pick", "learning_type": "on-demand", "framework": "pytorch", "nodes": 1,
        "resources": {"gpus_per_node": 0, "server_type": "cpu"}, "image": {"url": "registry.sat.local/sat/t:1"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"}, "results": {"destination": "s3://sat-demo/r/"},
        "command": "python train.py"}


@pytest.fixture
def deployment(monkeypatch):
    def configure(backend: str, allowed: str = "") -> None:
        monkeypatch.setenv("AIRFLOW__SAT__BACKEND", backend)
        monkeypatch.setenv("AIRFLOW__SAT__ALLOWED_BACKENDS", allowed)
    return configure


@pytest.mark.parametrize(("backend", "allowed", "named", "runs_on"), [
    pytest.param("kubernetes", "", None, "kubernetes", id="the-default-backend"),
    pytest.param("kubernetes", "", "kubernetes", "kubernetes", id="naming-the-deployments-backend"),
    pytest.param("local", "", "local", "local", id="local-deployment"),
    pytest.param("kubernetes", "kubernetes,local", "local", "local", id="an-operator-allows-both"),
])
def test_a_job_runs_on_an_allowed_backend(deployment, backend, allowed, named, runs_on):
    deployment(backend, allowed)
    assert resolve_job({**SPEC, **({"backend": named} if named else {})}, None).backend.value == runs_on


@pytest.mark.parametrize(("backend", "allowed", "named", "rule"), [
    pytest.param("kubernetes", "", "local", "local is not allowed on this deployment: a job may run on kubernetes "
                 "only ([sat] allowed_backends)", id="local-on-kubernetes"),
    pytest.param("local", "", "kubernetes", "kubernetes is not allowed on this deployment: a job may run on local "
                 "only ([sat] allowed_backends)", id="kubernetes-on-local"),
])
def test_a_spec_naming_another_backend_is_refused_at_validate_spec(deployment, backend, allowed, named, rule):
    deployment(backend, allowed)
    with pytest.raises(SpecError) as refused:
        resolve_job({**SPEC, "backend": named}, None, source="conf")
    assert [(p.field, p.rule) for p in refused.value.problems] == [("backend", rule)]


def test_sat_validate_refuses_it_too(deployment, tmp_path, capsys):
    deployment("kubernetes")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "backend": "local"}))

    class Args:
        files, quiet = [str(path)], False

    assert cmd_validate(Args()) == 2
    assert capsys.readouterr().out == (f"{path}: backend: local is not allowed on this deployment: a job may run on "
                                       "kubernetes only ([sat] allowed_backends)\n")
