"""Issue 29.1: a training process (local runner, warm interpreter, metrics sidecar) sees none of the service's secrets."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from ckpt_engine import contract
from sat_tasks.backends.local import runner as local_runner
from sat_tasks.backends.local import warm as local_warm
from sat_tasks.backends.local.runner import LocalAttempt
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.runtime_env import TrainingPaths, host_environment, training_environment
from sat_tasks.service import secrets as service_secrets
from sat_tasks.service.stack import SERVICE_MARK_ENV
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

JOB_ENV = {"FROM_THE_JOB": "job-value-7"}
RUN_KEYS = {"AWS_ACCESS_KEY_ID": "run-key-id", "AWS_SECRET_ACCESS_KEY": "run-secret-key"}  # the launcher's


@pytest.fixture
def service_secrets_env(monkeypatch, tmp_path) -> dict[str, str]:
    """The environment `make up` gives its components (the secrets as `sat up` sets them), planted in this process's."""
    kept = service_secrets.DeploymentSecrets(jwt_secret="planted-jwt-secret", fernet_key="planted-fernet-key",
                                             api_secret_key="planted-api-secret", admin_password="planted-admin")
    planted = {
        **service_secrets.component_env(kept, tmp_path / "home"),  # JWT, Fernet, API secret, the passwords file
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://sat:planted-db-password@db/airflow",
        "AIRFLOW_CONN_SAT_OBJECT_STORAGE": '{"conn_type": "aws", "password": "planted-service-s3-secret"}',
        "AWS_SECRET_ACCESS_KEY": "planted-host-aws-secret",  # the host's own keys: the launcher passes the run's
        SERVICE_MARK_ENV: str(tmp_path / "home"),
        "LC_ALL": "C.UTF-8",
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    return planted


def _leaked(env_text: str, planted: dict[str, str]) -> list[str]:
    """The planted variables (but the allowed ones) whose value appears in `env_text`."""
    allowed = host_environment(planted)
    return [name for name, value in planted.items() if name not in allowed and value in env_text]


def _training_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    job = parse_spec({**BASE, "env": JOB_ENV})
    paths = TrainingPaths(str(tmp_path / "data"), str(tmp_path / "out"), str(tmp_path / "code"), str(tmp_path / "v"))
    env = training_environment(job, paths, Plan(attempt=1), node="n1")
    return {**env, **RUN_KEYS, **extra}


class _SidecarSpy:
    """Stands in for the metrics sidecar: keeps the environment the runner gives it, starts nothing."""

    seen: ClassVar[list[dict[str, str]]] = []

    def __init__(self, env: dict[str, str], log_file: Path) -> None:
        _SidecarSpy.seen.append(dict(env))

    def start(self) -> None:
        return None


def test_a_local_attempt_whose_command_is_env_prints_none_of_the_service_secrets(
        tmp_path, monkeypatch, service_secrets_env):
    _SidecarSpy.seen = []
    monkeypatch.setattr(local_runner, "MetricsSidecar", _SidecarSpy)
    (tmp_path / "code").mkdir()
    env = _training_env(tmp_path, **{contract.METRICS_DIR_ENV: str(tmp_path / "metrics")})
    record = LocalAttempt(job="good-job.v1", attempt=1, node="n1", command="env", env=env, cwd=tmp_path / "code",
                          output_dir=tmp_path / "out", job_log=tmp_path / "job.log", node_dir=tmp_path / "nodes" / "n1",
                          startup_timeout=0, poll_seconds=0.05).run(lambda _: None)
    assert record.exit_code == 0
    log = (tmp_path / "job.log").read_text()
    assert _leaked(log, service_secrets_env) == []
    assert not [line for line in log.splitlines() if line.startswith("AIRFLOW")]  # not the test's own either
    printed = dict(line.split("=", 1) for line in log.splitlines() if "=" in line and not line.startswith(" "))
    assert "PATH" in printed and printed["FROM_THE_JOB"] == "job-value-7"
    assert printed[contract.JOB_NAME_ENV] == "good-job.v1" and printed[contract.ATTEMPT_ENV] == "1"
    assert printed["AWS_SECRET_ACCESS_KEY"] == "run-secret-key"  # the run's keys for the mirror, not the host's
    assert printed["LC_ALL"] == "C.UTF-8" and printed[SERVICE_MARK_ENV] == service_secrets_env[SERVICE_MARK_ENV]
    # the metrics sidecar gets the attempt's environment: the same allow-list
    (sidecar_env,) = _SidecarSpy.seen
    assert _leaked("\n".join(f"{k}={v}" for k, v in sidecar_env.items()), service_secrets_env) == []
    assert sidecar_env[contract.METRICS_DIR_ENV] == str(tmp_path / "metrics") and "PATH" in sidecar_env
    assert sidecar_env["AWS_ACCESS_KEY_ID"] == "run-key-id" and sidecar_env["FROM_THE_JOB"] == "job-value-7"


def test_the_warm_interpreter_starts_without_the_service_secrets(tmp_path, monkeypatch, service_secrets_env):
    """Its children keep its environment in /proc/<pid>/environ whatever os.environ they are given."""
    started: list[tuple[list, dict]] = []

    def run(argv, **kwargs):  # `warm.spawn_detached`: `sh` starts the server in the background, prints its pid
        started.append((argv, kwargs))
        return SimpleNamespace(stdout="4242\n")

    monkeypatch.setattr(local_warm.subprocess, "run", run)
    job = parse_spec({**BASE, "env": JOB_ENV, "command": "python train.py"})
    assert local_warm._start_interpreter(SimpleNamespace(job=job), until=0.0)["interpreter_pid"] == 4242
    argv, kwargs = started[0]
    assert argv[0] == "/bin/sh" and "serve" in argv
    env = kwargs["env"]  # `sh` and the server it starts get this environment and no other
    assert _leaked("\n".join(f"{k}={v}" for k, v in env.items()), service_secrets_env) == []
    assert not [name for name in env if name.startswith("AIRFLOW")]
    assert env["FROM_THE_JOB"] == "job-value-7" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize(("host", "kept"), [
    pytest.param({"PATH": "/bin", "HOME": "/h", "LANG": "C", "TZ": "UTC", "LC_CTYPE": "C"},
                 {"PATH", "HOME", "LANG", "TZ", "LC_CTYPE"}, id="the-basics-kept"),
    pytest.param({"AIRFLOW__CORE__FERNET_KEY": "x", "AIRFLOW_CONN_X": "y", "AWS_PROFILE": "p", "HF_TOKEN": "t",
                  "HTTPS_PROXY": "http://u:p@proxy", "PATH": "/bin"}, {"PATH"}, id="secrets-and-the-rest-dropped"),
])
def test_host_environment_keeps_the_allow_list_only(host, kept):
    assert set(host_environment(host)) == kept


def test_the_deployment_mark_survives_so_make_down_finds_training_processes():
    assert host_environment({SERVICE_MARK_ENV: "/home/sat"}) == {SERVICE_MARK_ENV: "/home/sat"}

