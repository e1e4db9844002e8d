"""The warm pool on Kubernetes: placeholder pods and their PriorityClass (schema-validated), kept and released
through the real client against a recorded API server."""

from __future__ import annotations

import time

import pytest

from sat_tasks.backends import kubernetes as k8s_backend
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import warm as k8s_warm
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.handoffs import Plan
from sat_tasks.io import warm_pool
from sat_tasks.pipeline import steps
from sat_tasks.pipeline import warm_pool as pipeline_warm
from tests.support.k8s_priority import PriorityCluster

K8S_VERSION = "1.37.0"  # as tests/sat_tasks/backends/kubernetes/test_pods.py
SETTINGS = KubernetesSettings()
NAMESPACE = "sat-jobs"
GPU_JOB = {"resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "1500Gi", "shared_memory": "64Gi",
                         "cpu": "96"},
           "image": {"url": "registry.example.com/team/train:1.0", "registry_conn_id": "sat_registry_main"},
           "backend": "kubernetes"}


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.fixture
def cluster(monkeypatch) -> PriorityCluster:
    cluster = PriorityCluster(priority_classes=[k8s_warm.render_priority_class()])
    monkeypatch.setattr(k8s_backend.BACKEND, "_client", cluster.client())
    monkeypatch.setattr(k8s_backend.BACKEND, "_namespace", NAMESPACE)
    return cluster


def _placeholders(job, nodes=("gpu-node-7",)):
    return k8s_warm.render_placeholder_pods(job, run_id="manual__1", nodes=list(nodes), namespace=NAMESPACE,
                                            settings=SETTINGS)


def test_the_priority_class_and_the_placeholders_are_schema_valid(warm_job):
    priority = k8s_warm.render_priority_class()
    _validate(priority)
    assert priority["value"] < 0 and priority["preemptionPolicy"] == "Never" and priority["globalDefault"] is False
    for job in (warm_job.job(**GPU_JOB), warm_job.job(backend="kubernetes")):
        for pod in _placeholders(job, nodes=("gpu-node-7", "gpu-node-8")):
            _validate(pod)


def test_a_placeholder_holds_what_the_attempt_pod_asks_for_on_its_node(warm_job):
    job = warm_job.job(**GPU_JOB)
    (pod,) = _placeholders(job)
    (attempt,) = [m for m in k8s_pods.render_attempt_manifests(job, settings=SETTINGS, run_id="manual__1",
                                                               plan=Plan(attempt=1)) if m["kind"] == "Pod"]
    spec, attempt_spec = pod["spec"], attempt["spec"]
    assert spec["priorityClassName"] == k8s_warm.PRIORITY_CLASS
    assert spec["nodeSelector"]["kubernetes.io/hostname"] == "gpu-node-7"
    assert spec["nodeSelector"][SETTINGS.gpu_product_label] == "NVIDIA-H100-80GB-HBM3"
    (container,) = spec["containers"]
    (training,) = [c for c in attempt_spec["containers"] if c["name"] == "base"] or attempt_spec["containers"][:1]
    assert container["resources"] == training["resources"]  # the same requests: the node fits the next run
    assert container["image"] == job.image.url  # keeps the job's image pulled on the node
    assert spec["imagePullSecrets"] == attempt_spec["imagePullSecrets"]
    assert {t["key"] for t in spec["tolerations"]} >= {SETTINGS.gpu_taint_key}
    # no run labels: the run's cleanup (by run label selector) does not delete it
    assert "sat.ai/run-id" not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"][k8s_warm.LABEL_WARM] == "placeholder"


def test_a_completed_run_leaves_placeholders_and_the_next_run_start_releases_them(warm_job, cluster, lines):
    job = warm_job.job(backend="kubernetes")
    first = warm_job.run_id()
    warm_job.complete(job, first, node="gpu-node-7")
    steps.cleanup_run(job, first, log=lines.append)
    created = [body for method, path, _, body in cluster.requests
               if method == "POST" and path == f"/api/v1/namespaces/{NAMESPACE}/pods"]
    assert [b["metadata"]["name"] for b in created] == [k8s_warm.placeholder_name(job, "gpu-node-7")]
    assert created[0]["spec"]["priorityClassName"] == "sat-warm-pool"
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    assert state.placeholders == [k8s_warm.placeholder_name(job, "gpu-node-7")] and state.namespace == NAMESPACE
    assert len(cluster.pods) == 1

    # keep-alive over: the next run's start releases it (a DELETE of the placeholder, of the kept claim and of
    # the run's pull Secret (ADR 0032), here already gone: skipped), nothing is left
    before = len(cluster.requests)  # cleanup_run's own deletes (by label selector, ADR 0040) came before
    claim = warm_pool.claim(job, warm_job.run_id(), warm_job.hook, pipeline_warm.release_state, log=lines.append,
                            now=time.time() + 601)
    assert claim is None
    deletes = [path for method, path, _, _ in cluster.requests[before:] if method == "DELETE"]
    assert deletes == [f"/api/v1/namespaces/{NAMESPACE}/pods/{state.placeholders[0]}",
                       f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{state.claim}",
                       f"/api/v1/namespaces/{NAMESPACE}/secrets/{k8s_names.registry_secret_name(job, first)}"]
    assert cluster.pods == [] and warm_pool.WarmPoolStore(warm_job.hook).load(job) is None
    assert f"warm pool: released pod/{state.placeholders[0]}" in lines


def test_a_claim_in_time_hands_the_node_over_and_deletes_the_placeholder(warm_job, cluster, lines):
    job = warm_job.job(backend="kubernetes")
    first = warm_job.run_id()
    warm_job.complete(job, first, node="gpu-node-7")
    steps.cleanup_run(job, first, log=lines.append)
    claim = warm_pool.claim(job, warm_job.run_id(), warm_job.hook, pipeline_warm.release_state, log=lines.append)
    # on Kubernetes the staged data is in the kept claim (copied from it by the next staging pod)
    assert claim.node == ["gpu-node-7"] and claim.data_dir is None and claim.volume == claim.state.claim
    assert pipeline_warm.release_state(claim.state, lines.append) == [f"pod/{claim.state.placeholders[0]}"]
    assert cluster.pods == []


def test_a_preempted_placeholder_is_skipped_on_release(warm_job, cluster, lines):
    job = warm_job.job(backend="kubernetes")
    run_id = warm_job.run_id()
    warm_job.complete(job, run_id, node="gpu-node-7")
    steps.cleanup_run(job, run_id, log=lines.append)
    cluster.pods.clear()  # the scheduler preempted it for a pod of normal priority
    assert warm_pool.release_job(job, warm_job.hook, pipeline_warm.release_state, lines.append) == [
        f"warm-state/{job.name}"]
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_a_newer_run_replaces_the_older_warm_state_and_its_placeholders(warm_job, cluster, lines):
    job = warm_job.job(backend="kubernetes")
    first, second = warm_job.run_id(), warm_job.run_id()
    warm_job.complete(job, first, node="gpu-node-7")
    steps.cleanup_run(job, first, log=lines.append)
    warm_job.complete(job, second, node="gpu-node-9")  # it ran beside the first (started before it was warm)
    steps.cleanup_run(job, second, log=lines.append)
    assert [p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in cluster.pods] == ["gpu-node-9"]
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job).run_id == second


def test_release_for_capacity_deletes_the_workspaces_placeholders(warm_job, cluster, lines, monkeypatch):
    job = warm_job.job(backend="kubernetes")
    run_id = warm_job.run_id()
    warm_job.complete(job, run_id, node="gpu-node-7")
    steps.cleanup_run(job, run_id, log=lines.append)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_URI", warm_pool.warm_root(job))
    workspace = getattr(job, "workspace", None)
    if workspace is None:  # a job outside a workspace is under "-": the workspace's call does not touch it
        assert k8s_warm.release_for_capacity("team-a", 1, lines.append, client=cluster.client(),
                                             namespace=NAMESPACE) == []
        assert len(cluster.pods) == 1
        state = state.model_copy(update={"workspace": "team-a"})
        warm_pool.WarmPoolStore(warm_job.hook).save(job, state)
    released = k8s_warm.release_for_capacity("team-a", 1, lines.append, client=cluster.client(), namespace=NAMESPACE)
    assert released == [f"warm-state/{job.name}", f"pod/{state.placeholders[0]}"]
    assert cluster.pods == []
