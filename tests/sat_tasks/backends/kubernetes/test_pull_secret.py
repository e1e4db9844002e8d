"""The run's image pull Secret (ADR 0032): made from the job's registry login before any pod of the run,
referenced by every pod (staging, training, upload, warm placeholders), deleted with the run, and the
password in no log, XCom, error message or rendered manifest.

The real code runs against the real `CoreV1Api` over the in-memory API server (`tests.support.k8s_api`),
which here also applies a Secret's patched data (a merge patch, as the API server does).
"""

from __future__ import annotations

import base64
import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

from sat_tasks.backends.kubernetes import KubernetesBackend
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pull_secret as k8s_pull_secret
from sat_tasks.backends.kubernetes import staging as k8s_staging
from sat_tasks.backends.kubernetes import warm as k8s_warm
from sat_tasks.backends.kubernetes.operator import make_launch_operators
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.cli.render import register as register_render
from sat_tasks.core.warm_pool import WarmState
from sat_tasks.errors import JobStopped
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.spec import TrainingJob, parse_spec
from tests.sat_tasks.backends.kubernetes.test_launch_path import (
    STAGED,
    UPLOADED,
    _kubelet,
)
from tests.support.k8s_api import RecordedCluster, _body, _Response, _status
from tests.support.task_instance import spec_ti

BUCKET = "sat-pull-secret"
NAMESPACE = "sat-jobs"
RUN_ID = "manual__2026-12-02T08:00:00+00:00"
PASSWORD = "pull-password-7f3a9c"
DOCKERCONFIG = "kubernetes.io/dockerconfigjson"


class SecretCluster(RecordedCluster):
    """The in-memory API server, applying a Secret's merge patch to its data too (`echo`: errors quote the body)."""

    def __init__(self, *args, echo_status: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.echo_status = echo_status

    def request(self, method, url, fields=None, body=None, headers=None, **kwargs):
        path = url.split("?", 1)[0]
        if self.echo_status and "/secrets" in path and method in ("POST", "PATCH"):
            self.requests.append((method, path, {}, _body(body)))
            return _status(self.echo_status, "Invalid", f"Secret is invalid: {json.dumps(_body(body))}")
        response = super().request(method, url, fields=fields, body=body, headers=headers, **kwargs)
        if method == "PATCH" and "/secrets/" in path and response.status == 200:
            name = path.rsplit("/", 1)[1]
            (target,) = [s for s in self.secrets if s["metadata"]["name"] == name]
            target.setdefault("data", {}).update(_body(body).get("data") or {})
            response = _Response(200, json.dumps(target))
        return response


def _job(tmp_path, *, nodes: int = 2, login: str | None = "own") -> tuple[TrainingJob, str]:
    name = f"pull-{nodes}-nodes"
    image = {"url": "registry.example.com/ml/llama-train:1.4.2"}
    if login:
        image["registry_conn_id"] = f"sat_registry_{name}" if login == "own" else login
    spec = {
        "name": name, "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "nodes": nodes, "command": "python train.py", "backend": "kubernetes",
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi",
                      "cpu": "500m"},
        "image": image,
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    # As validate_spec returns it: scoped to the spec file's own DAG (its name), as `sat render` scopes it.
    return scoped(parse_spec(spec), name), str(path)


def _login(monkeypatch, conn_id: str, password: str = PASSWORD, host: str = "registry.example.com") -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "docker", "host": host, "login": "team-robot", "password": password}))


def _rendered(spec_path: str, capsys) -> str:
    """What `sat render SPEC --run-id RUN_ID` prints."""
    import argparse

    parser = argparse.ArgumentParser(prog="sat")
    register_render(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["render", spec_path, "--run-id", RUN_ID, "--namespace", NAMESPACE])
    capsys.readouterr()
    assert args.func(args) == 0
    return capsys.readouterr().out


def _decoded(secret: dict) -> dict:
    return json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))


def _pull_secrets(cluster: RecordedCluster) -> list[dict]:
    return [s for s in cluster.secrets if s.get("type") == DOCKERCONFIG]


@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


@pytest.fixture
def k8s(monkeypatch):
    cluster = SecretCluster(kubelet=_kubelet)
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    monkeypatch.setattr(k8s_staging.time, "sleep", lambda _s: None)
    monkeypatch.setattr(KubernetesSettings, "from_sat_config", classmethod(
        lambda cls: KubernetesSettings(staging_pull_secret="sat-airflow-image-pull")))
    return cluster


def _run_everything(job: TrainingJob, cluster: RecordedCluster, said: list[str]) -> tuple[KubernetesBackend, list]:
    """stage_data, attempt 1 (every rank's launch with the provider's execute), upload_results."""
    backend = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)
    run = JobRun(job, RUN_ID)
    assert backend.stage(run, said.append) == STAGED
    pushed = []
    for operator in make_launch_operators(attempt=1, previous_decide_task_id=None, job=job, namespace=NAMESPACE):
        ti = spec_ti(operator.task_id, job.to_dict(), dag_id="path-job")
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
        pushed.append(ti.pushed)
    assert backend.upload_outputs(run, said.append) == UPLOADED
    return backend, pushed


def test_the_runs_pull_secret_exists_before_every_pod_which_all_reference_it_and_cleanup_deletes_it(
        tmp_path, k8s, bucket, monkeypatch, capsys, caplog):
    job, spec_path = _job(tmp_path)
    _login(monkeypatch, job.image.registry_conn_id)  # the job's own login: no shared list needed
    monkeypatch.delenv("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS")
    caplog.set_level(logging.DEBUG, logger="kubernetes")  # the client logs the answers it reads at DEBUG
    said: list[str] = []
    backend, pushed = _run_everything(job, k8s, said)

    name = k8s_names.registry_secret_name(job, RUN_ID)
    kinds = [(kind, body["metadata"]["name"]) for kind, body in k8s.created]
    assert kinds.index(("Secret", name)) < min(i for i, (kind, _) in enumerate(kinds) if kind == "Pod")
    (secret,) = _pull_secrets(k8s)
    assert secret["type"] == DOCKERCONFIG and set(secret["data"]) == {".dockerconfigjson"}
    auth = base64.b64encode(f"team-robot:{PASSWORD}".encode()).decode()
    assert _decoded(secret) == {"auths": {"registry.example.com": {
        "username": "team-robot", "password": PASSWORD, "auth": auth}}}
    assert secret["metadata"]["labels"] == {**k8s_names.run_labels(job, RUN_ID),
                                            "app.kubernetes.io/component": "registry-login"}

    pods = [body for kind, body in k8s.created if kind == "Pod"]
    purposes = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert purposes == ["staging", "training", "training", "upload"]
    for pod in pods:  # every pod of the run; SAT's own image keeps its own Secret too
        refs = [ref["name"] for ref in pod["spec"]["imagePullSecrets"]]
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        assert refs == ([name] if component == "training" else ["sat-airflow-image-pull", name]), pod

    # Created once by stage_data, then each rank's launch and the upload find it (409) and patch it.
    posts = [body for method, path, _, body in k8s.requests
             if method == "POST" and path.endswith("/secrets") and body["metadata"]["name"] == name]
    patches = [body for method, path, _, body in k8s.requests if method == "PATCH" and path.endswith(f"/{name}")]
    assert len(posts) == 4 and len(patches) == 3 and [n for k, n in kinds if k == "Secret"].count(name) == 1
    assert all(p["data"] == secret["data"] and p["metadata"]["labels"] == secret["metadata"]["labels"]
               for p in patches)

    # The password, and the encoded forms of it, are in no log line, XCom or rendered manifest.
    deleted = backend.cleanup_run(JobRun(job, RUN_ID), said.append)
    assert f"secret/{name}" in deleted and _pull_secrets(k8s) == [] and k8s.secrets == []
    rendered = _rendered(spec_path, capsys)
    assert name in rendered  # the reference is printed, the Secret is not
    leaks = (PASSWORD, auth, secret["data"][".dockerconfigjson"])
    assert "response body" in caplog.text  # the client's DEBUG lines are captured (the pods' answers)
    for where, text in {"log": "\n".join(said), "xcom": json.dumps(pushed), "render": rendered,
                        "logging": caplog.text, "stdout": capsys.readouterr().out}.items():
        assert [leak for leak in leaks if leak in text] == [], where
    assert any(f"image pull Secret {NAMESPACE}/{name} created" in line for line in said)
    # the attempt's Object Storage credentials (ADR 0020) are not in the client's DEBUG lines either
    keys = [v for kind, body in k8s.created if kind == "Secret" for v in (body.get("stringData") or {}).values()]
    assert keys and not any(key in caplog.text for key in keys)


def test_a_job_without_a_registry_login_makes_no_pull_secret(tmp_path, k8s, bucket):
    job, _ = _job(tmp_path, nodes=1, login=None)
    said: list[str] = []
    backend, _ = _run_everything(job, k8s, said)
    assert _pull_secrets(k8s) == []
    assert not any(body.get("type") == DOCKERCONFIG for kind, body in k8s.created if kind == "Secret")
    for kind, pod in k8s.created:
        if kind == "Pod":
            assert k8s_names.registry_secret_name(job, RUN_ID) not in json.dumps(pod)
    deleted = backend.cleanup_run(JobRun(job, RUN_ID), said.append)
    # the run's cleanup deletes the attempt's credentials Secret (ADR 0020) and no pull Secret
    assert [d for d in deleted if d.startswith("secret/")] == [
        f"secret/{k8s_names.attempt_credentials_name(job, RUN_ID, 1)}"] and k8s.secrets == []
    assert not any("image pull Secret" in line for line in said)


def test_a_changed_login_updates_the_secret_before_the_next_pod(tmp_path, k8s, bucket, monkeypatch):
    job, _ = _job(tmp_path, nodes=1, login="sat_registry_main")  # shared (conftest)
    client = k8s.client()
    k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=client, namespace=NAMESPACE, log=lambda _m: None)
    _login(monkeypatch, "sat_registry_main", password="rotated-password-2b")
    said: list[str] = []
    assert k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=client, namespace=NAMESPACE,
                                              log=said.append) == k8s_names.registry_secret_name(job, RUN_ID)
    (secret,) = _pull_secrets(k8s)
    assert _decoded(secret)["auths"]["registry.example.com"]["password"] == "rotated-password-2b"
    assert said == [(f"image pull Secret {NAMESPACE}/{secret['metadata']['name']} updated: registry login "
                     "sat_registry_main for registry.example.com, the login of 'team-robot'")]


def test_a_login_for_another_registry_gives_a_secret_without_credentials(tmp_path, k8s, monkeypatch):
    """Credentials go only to the host the connection names (issue 29.3): the image is elsewhere."""
    job, _ = _job(tmp_path, nodes=1, login="sat_registry_main")
    _login(monkeypatch, "sat_registry_main", host="other-registry.example.org")
    k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=k8s.client(), namespace=NAMESPACE, log=lambda _m: None)
    (secret,) = _pull_secrets(k8s)
    assert _decoded(secret) == {"auths": {}}


@pytest.mark.parametrize("login, message", [
    pytest.param("someone_elses_registry", "must be the job's own 'sat_registry_pull-1-nodes'", id="not-own-not-shared"),
])
def test_a_login_the_job_may_not_use_makes_no_secret(tmp_path, k8s, monkeypatch, login, message):
    job, _ = _job(tmp_path, nodes=1, login=login)
    _login(monkeypatch, login)
    with pytest.raises(JobStopped, match=message) as raised:
        k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=k8s.client(), namespace=NAMESPACE)
    assert PASSWORD not in str(raised.value) and k8s.secrets == [] and k8s.requests == []


def test_a_login_without_a_host_makes_no_secret(tmp_path, k8s, monkeypatch):
    job, _ = _job(tmp_path, nodes=1)
    monkeypatch.setenv(f"AIRFLOW_CONN_{job.image.registry_conn_id.upper()}", json.dumps(
        {"conn_type": "docker", "login": "team-robot", "password": PASSWORD}))
    with pytest.raises(JobStopped, match="has no host") as raised:
        k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=k8s.client(), namespace=NAMESPACE)
    assert PASSWORD not in str(raised.value) and k8s.requests == []


@pytest.mark.parametrize("status", [400, 403])
def test_an_api_error_names_the_secret_and_the_status_but_never_the_body(tmp_path, monkeypatch, status, caplog):
    """An API server that quotes the refused body in its answer: the error keeps its status and reason only."""
    job, _ = _job(tmp_path, nodes=1, login="sat_registry_main")
    _login(monkeypatch, "sat_registry_main")
    cluster = SecretCluster(echo_status=status)
    caplog.set_level(logging.DEBUG, logger="kubernetes")
    with pytest.raises(k8s_pull_secret.PullSecretFailed) as raised:
        k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=cluster.client(), namespace=NAMESPACE)
    sent = cluster.requests[-1][3]["data"][".dockerconfigjson"]
    assert PASSWORD in base64.b64decode(sent).decode()  # the server was sent the login, and quoted it
    message = str(raised.value)
    assert message.startswith(f"could not create the image pull Secret {NAMESPACE}/"
                              f"{k8s_names.registry_secret_name(job, RUN_ID)} for registry login sat_registry_main: "
                              f"{status} ")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    for text in (message, repr(raised.value), caplog.text):
        assert PASSWORD not in text and sent not in text


def test_a_run_kept_warm_keeps_its_pull_secret_for_the_placeholders_until_release(tmp_path, k8s):
    job, _ = _job(tmp_path, nodes=1, login="sat_registry_main")
    client = k8s.client()
    name = k8s_pull_secret.ensure_pull_secret(job, RUN_ID, client=client, namespace=NAMESPACE, log=lambda _m: None)
    backend = KubernetesBackend(client=client, namespace=NAMESPACE)
    assert backend.cleanup_run(JobRun(job, RUN_ID), lambda _m: None, keep_warm=True) == []
    assert [s["metadata"]["name"] for s in _pull_secrets(k8s)] == [name]
    (placeholder,) = k8s_warm.render_placeholder_pods(job, run_id=RUN_ID, nodes=["gpu-node-7"], namespace=NAMESPACE,
                                                      settings=KubernetesSettings())
    assert placeholder["spec"]["imagePullSecrets"] == [{"name": name}]
    state = WarmState(job=job.name, backend="kubernetes", run_id=RUN_ID, kept_at=0, expires_at=1, spec_hash="x",
                      data_source=job.data.source, namespace=NAMESPACE,
                      claim=k8s_names.run_volume_claim_name(job, RUN_ID))
    assert k8s_warm.release_warm(client, NAMESPACE, state, lambda _m: None) == [f"secret/{name}"]
    assert k8s.secrets == []
