"""The Kubernetes launch path creates, and cleanup deletes, exactly what `sat render` prints.

The real code runs (the backend's staging, each rank's launch operator with the provider's
own `execute`, the attempt's cleanup, the upload pod, the run's cleanup) against the
real `CoreV1Api`, whose HTTP layer is an API server in memory (`tests.support.k8s_api`):
every request is recorded with its body, and a tiny kubelet "runs" each created pod.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

from sat_tasks.backends.kubernetes import KubernetesBackend
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import staging as k8s_staging
from sat_tasks.backends.kubernetes.operator import make_launch_operators
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.cli.render import register as register_render
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.io.staging import REPORT_PREFIX
from sat_tasks.spec import TrainingJob, parse_spec
from tests.support.k8s_api import RecordedCluster
from tests.support.task_instance import spec_ti

BUCKET = "sat-launch-path"
NAMESPACE = "sat-jobs"
RUN_ID = "manual__2026-12-01T08:00:00+00:00"
STAGED = {"data": {"files": 3, "transferred": 3}, "validation": {"success": True, "summary_lines": []}}
UPLOADED = {"files": 4, "transferred": 4}


def _job(nodes: int, tmp_path) -> tuple[TrainingJob, str]:
    spec = {
        "name": f"path-{nodes}-nodes", "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "nodes": nodes, "command": "python train.py", "backend": "kubernetes",
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi",
                      "cpu": "500m"},
        "image": {"url": "registry.example.com/ml/llama-train:1.4.2", "registry_conn_id": "sat_registry_main"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
    }
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    # As validate_spec returns it: scoped to the spec file's own DAG (its name), as `sat render` scopes it.
    return scoped(parse_spec(spec), spec["name"]), str(path)


def _kubelet(pod: dict) -> tuple[int, str]:
    """Helper pods print their report; training pods train."""
    component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
    if component == "staging":
        return 0, f"staged 3 files\n{REPORT_PREFIX}{json.dumps(STAGED)}\n"
    if component == "upload":
        return 0, f"uploaded 4 files\n{REPORT_PREFIX}{json.dumps(UPLOADED)}\n"
    return 0, "Starting dataset initialization\n{'loss': 1.0}\n"


def _rendered(spec_path: str, capsys) -> list[dict]:
    """What `sat render SPEC --run-id RUN_ID` prints, as the objects it lists."""
    import argparse

    parser = argparse.ArgumentParser(prog="sat")
    register_render(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["render", spec_path, "--run-id", RUN_ID, "--namespace", NAMESPACE])
    capsys.readouterr()
    assert args.func(args) == 0
    return [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]


def _as_applied(obj):
    """A manifest as the API server stores it: an empty list or object, or hostNetwork false, is the
    field's default, the same as leaving it out (the provider's operator fills such defaults in)."""
    if isinstance(obj, dict):
        kept = {k: _as_applied(v) for k, v in obj.items() if not (k == "hostNetwork" and v is False)}
        return {k: v for k, v in kept.items() if v not in (None, [], {})}
    if isinstance(obj, list):
        return [_as_applied(v) for v in obj]
    return obj


def _diff(got, want, path="") -> list[str]:
    """Where two manifests differ (for the failure message)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for key in sorted(set(got) | set(want)) for d in _diff(got.get(key), want.get(key), f"{path}.{key}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (a, b) in enumerate(zip(got, want)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: created {got!r}, rendered {want!r}"]


@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


@pytest.mark.parametrize("nodes", [pytest.param(1, id="1-node"), pytest.param(3, id="3-nodes")])
def test_launch_creates_and_cleanup_deletes_exactly_what_sat_render_prints(nodes, tmp_path, capsys, monkeypatch,
                                                                             bucket):
    job, spec_path = _job(nodes, tmp_path)
    rendered = _rendered(spec_path, capsys)
    mirror = [ref["value"] for doc in rendered if doc["kind"] == "Pod" for ref in doc["spec"]["containers"][0]["env"]
              if ref["name"] == "CKPT_MIRROR_URL"]
    # The run's prefix as ADR 0024 has it: <destination>/<dag_id>/<job>/<run>/, not the legacy <job>/<run>/.
    assert mirror and all(url.startswith(f"s3://{BUCKET}/results/{job.name}/{job.name}/") for url in mirror), mirror
    cluster = RecordedCluster(kubelet=_kubelet)
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    monkeypatch.setattr(k8s_staging.time, "sleep", lambda _s: None)
    monkeypatch.setattr(KubernetesSettings, "from_sat_config", classmethod(lambda cls: KubernetesSettings()))
    backend = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)
    run = JobRun(job.with_backend("kubernetes"), RUN_ID)
    said: list[str] = []

    # stage_data, then attempt 1: every rank's launch task, the provider's execute included.
    assert backend.stage(run, said.append) == STAGED
    for operator in make_launch_operators(attempt=1, previous_decide_task_id=None, job=job,
                                          namespace=NAMESPACE):
        ti = spec_ti(operator.task_id, job.to_dict(), dag_id=job.name)
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
        assert ti.pushed["pod_name"].endswith(f"-r{operator.node_rank}")

    # Every object `sat render` prints was created, in apply order, with the same body. The
    # provider adds its own labels to a pod (dag_id, task_id, try_number, ...); nothing else.
    created = [(kind, body) for kind, body in cluster.created if kind != "Secret" and (
        kind != "Pod" or body["metadata"]["labels"].get("app.kubernetes.io/component") == "training")]
    # Not rendered: the attempt's Object Storage credentials (ADR 0020), one Secret its pods reference,
    # and the run's image pull Secret (ADR 0032, tested in test_pull_secret.py), made by stage_data.
    pull = [body for kind, body in cluster.created if kind == "Secret" and body["type"] == "kubernetes.io/dockerconfigjson"]
    assert [body["metadata"]["name"] for body in pull] == [k8s_names.registry_secret_name(job, RUN_ID)]
    secrets = [body for kind, body in cluster.created if kind == "Secret" and body not in pull]
    assert len(secrets) == 1 and set(secrets[0]["stringData"]) == {"access_key_id", "secret_access_key",
                                                                   "session_token"}
    assert all(ref["valueFrom"]["secretKeyRef"]["name"] == secrets[0]["metadata"]["name"]
               for doc in rendered if doc["kind"] == "Pod" for ref in doc["spec"]["containers"][0]["env"]
               if ref["name"].startswith("AWS_") and "valueFrom" in ref)
    assert [(kind, body["metadata"]["name"]) for kind, body in created] == [
        (doc["kind"], doc["metadata"]["name"]) for doc in rendered]
    for (kind, body), doc in zip(created, rendered):
        if kind == "Pod":
            added = set(body["metadata"]["labels"]) - set(doc["metadata"]["labels"])
            assert added <= {"dag_id", "task_id", "run_id", "try_number", "kubernetes_pod_operator",
                             "airflow_version", "airflow_kpo_in_cluster", "map_index"}, added
            body = {**body, "metadata": {**body["metadata"], "labels": {
                k: v for k, v in body["metadata"]["labels"].items() if k not in added}}}
        assert _as_applied(body) == _as_applied(doc), "\n".join(_diff(_as_applied(body), _as_applied(doc)))
    assert sum(kind == "Service" for kind, _ in cluster.created) == (1 if nodes > 1 else 0)

    # The attempt's cleanup, then the run's end: outputs uploaded from the claim, then nothing left.
    deleted = backend.cleanup_attempt(run, 1, said.append)
    assert sorted(deleted) == sorted([f"{doc['kind'].lower()}/{doc['metadata']['name']}" for doc in rendered
                                      if doc["kind"] in ("Pod", "Service", "NetworkPolicy")]
                                     + [f"secret/{secrets[0]['metadata']['name']}"])
    assert sum(doc["kind"] == "NetworkPolicy" for doc in rendered) == (1 if nodes > 1 else 0)
    assert backend.upload_outputs(run, said.append) == UPLOADED
    upload_pod = next(body for kind, body in cluster.created
                      if body["metadata"]["labels"].get("app.kubernetes.io/component") == "upload")
    assert upload_pod["spec"]["containers"][0]["command"][3:] == [
        "upload", "--source", "/opt/sat/output", "--dest", run.output_uri]
    deleted = backend.cleanup_run(run, said.append)
    assert deleted == [f"secret/{pull[0]['metadata']['name']}", f"persistentvolumeclaim/{rendered[0]['metadata']['name']}"]
    assert cluster.pods == [] and cluster.services == [] and cluster.claims == [] and cluster.secrets == []
    assert cluster.network_policies == []
    # Secrets are deleted by label selector, never listed: a list returns every Secret's data (ADR 0040)
    assert not [path for method, path, _, _ in cluster.requests if method == "GET" and path.endswith("/secrets")]
    assert backend.cleanup_run(run, said.append) == []  # idempotent


def test_a_shared_claim_named_by_pvc_name_is_never_deleted(tmp_path, bucket):
    """`pvc_name` swaps in a long-lived claim: it carries no run labels, so the run's cleanup leaves it."""
    job, _ = _job(1, tmp_path)
    shared = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
              "metadata": {"name": "team-shared", "namespace": NAMESPACE, "labels": {"team": "ml"}},
              "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}}}
    cluster = RecordedCluster(claims=[shared])
    backend = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)
    assert backend.cleanup_run(JobRun(job, RUN_ID), lambda _m: None) == []
    assert cluster.claims == [shared]
