"""The warm pool on Kubernetes, part two: the PriorityClass ensured at keep time, and the run's claim kept so the
next run's staging pod copies the unchanged objects from it; through the task functions against a recorded API."""

from __future__ import annotations

import json

import pytest
import yaml

from sat_tasks.backends import kubernetes as k8s_backend
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import staging as k8s_staging
from sat_tasks.backends.kubernetes import warm as k8s_warm
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.status import JobStatus
from sat_tasks.io import warm_pool
from sat_tasks.io.staging import REPORT_PREFIX
from sat_tasks.pipeline import steps
from sat_tasks.pipeline import warm_pool as pipeline_warm
from tests.support.k8s_priority import PriorityCluster

K8S_VERSION = "1.37.0"  # as tests/sat_tasks/backends/kubernetes/test_pods.py
NAMESPACE = "sat-jobs"
PRIORITY_PATH = "/apis/scheduling.k8s.io/v1/priorityclasses"
VALIDATION = {"success": True, "suite_name": "text_corpus", "results": [], "summary_lines": ["ok"]}


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _staging_kubelet(pod: dict) -> tuple[int, str]:
    """What the staging pod prints: reused = the objects it was told it may copy; a placeholder just runs."""
    if pod["metadata"]["labels"].get(k8s_names.LABEL_COMPONENT) != "staging":
        return 0, ""
    args = pod["spec"]["containers"][0]["command"]
    objects = json.loads(args[args.index("--reuse-objects") + 1]) if "--reuse-objects" in args else None
    data = {"files": 3, "transferred": 3, "skipped": 0}
    if objects is not None:
        data.update(transferred=3 - len(objects), skipped=len(objects), reused=len(objects),
                    redownloaded=3 - len(objects))
    return 0, f"staging 3 objects\n{REPORT_PREFIX}{json.dumps({'data': data, 'validation': VALIDATION})}\n"


def _cluster(monkeypatch, **kwargs) -> PriorityCluster:
    cluster = PriorityCluster(kubelet=_staging_kubelet, **kwargs)
    monkeypatch.setattr(k8s_backend.BACKEND, "_client", cluster.client())
    monkeypatch.setattr(k8s_backend.BACKEND, "_namespace", NAMESPACE)
    return cluster


@pytest.fixture
def cluster(monkeypatch) -> PriorityCluster:
    """A cluster without the warm PriorityClass, where SAT may create it."""
    return _cluster(monkeypatch)


def _requests(cluster, method: str, path: str) -> list:
    return [body for m, p, _, body in cluster.requests if m == method and p == path]


def _first_run(warm_job, lines, *, node="gpu-node-7", status=JobStatus.COMPLETED):
    """A run staged on the cluster (cold), ended `status`, its cleanup_run done; (job, run_id)."""
    job = warm_job.job(backend="kubernetes")
    run_id = warm_job.run_id()
    steps.stage_data(job, run_id, log=lines.append)
    warm_job.complete(job, run_id, node=node, status=status)
    steps.cleanup_run(job, run_id, log=lines.append)
    return job, run_id


# ---- the PriorityClass ---------------------------------------------------------------------------
def test_the_priority_class_is_created_when_absent_then_the_placeholder(warm_job, cluster, lines):
    job, _ = _first_run(warm_job, lines)
    assert _requests(cluster, "POST", PRIORITY_PATH) == [k8s_warm.render_priority_class()]
    assert [p["metadata"]["name"] for p in cluster.priority_classes] == ["sat-warm-pool"]
    assert "warm pool: created PriorityClass sat-warm-pool (value -10, preemptionPolicy Never)" in lines
    kinds = [kind for kind, _ in cluster.created]
    assert kinds.index("PriorityClass") < len(kinds) - 1 and kinds[-1] == "Pod"  # the class, then the placeholder
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job).placeholders == [k8s_warm.placeholder_name(job,
                                                                                                      "gpu-node-7")]


def test_a_priority_class_already_there_is_read_not_created_again(warm_job, monkeypatch, lines):
    cluster = _cluster(monkeypatch, priority_classes=[k8s_warm.render_priority_class()])
    _first_run(warm_job, lines)
    assert _requests(cluster, "GET", f"{PRIORITY_PATH}/sat-warm-pool") == [None]
    assert _requests(cluster, "POST", PRIORITY_PATH) == []
    assert len(cluster.priority_classes) == 1


def test_a_priority_class_made_by_someone_else_in_between_is_fine():
    from kubernetes.client.exceptions import ApiException

    class Racing:
        def read_priority_class(self, name):
            raise ApiException(status=404, reason="Not Found")

        def create_priority_class(self, body):
            raise ApiException(status=409, reason="Conflict")

    said = []
    assert k8s_warm.ensure_priority_class(Racing(), said.append) is True and said == []


@pytest.mark.parametrize("forbidden", [pytest.param({"get"}, id="read-forbidden"),
                                       pytest.param({"create"}, id="create-forbidden")])
def test_where_sat_may_not_make_the_priority_class_one_line_says_so_and_no_placeholder_is_made(
        forbidden, warm_job, monkeypatch, lines):
    cluster = _cluster(monkeypatch, forbidden_priority=forbidden)
    job, run_id = _first_run(warm_job, lines)
    verb = "read" if "get" in forbidden else "create"
    said = [line for line in lines if "PriorityClass" in line]
    assert said == [(f"warm pool: SAT may not {verb} PriorityClass sat-warm-pool (403 Forbidden): an operator must "
                     "apply it once (`sat workspace render --warm-pool | kubectl apply -f -`); no placeholder pod "
                     "holds the node, the staged data is kept")]
    assert not any(k8s_warm.LABEL_WARM in body["metadata"]["labels"]
                   for body in _requests(cluster, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods"))
    assert _requests(cluster, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods")  # (the staging pod was made)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)  # the run is still kept: its data, its claim
    assert state.placeholders == [] and state.claim == k8s_names.run_volume_claim_name(job, run_id)
    assert state.nodes == ["gpu-node-7"] and len(state.objects) == 3


def test_sat_workspace_render_warm_pool_prints_the_priority_class(capsys):
    from sat_tasks.cli import main

    assert main(["workspace", "render", "--warm-pool"]) == 0
    out = capsys.readouterr().out
    (priority,) = [m for m in yaml.safe_load_all(out) if m]
    assert priority == k8s_warm.render_priority_class()
    _validate(priority)
    assert main(["workspace", "render"]) == 2
    assert "a workspace NAME, or --warm-pool, is needed" in capsys.readouterr().err


# ---- the kept claim ------------------------------------------------------------------------------
def test_a_kept_run_keeps_its_claim_and_records_it(warm_job, cluster, lines):
    job, run_id = _first_run(warm_job, lines)
    claim = k8s_names.run_volume_claim_name(job, run_id)
    assert [c["metadata"]["name"] for c in cluster.claims] == [claim]
    assert not any(m == "DELETE" and "persistentvolumeclaims" in p for m, p, _, _ in cluster.requests)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    assert state.claim == claim and state.namespace == NAMESPACE
    assert sorted(state.objects) == [warm_job.prefix + f"part-0{i}.txt" for i in range(3)]
    assert f"warm pool: volume claim {claim} kept (the next run copies its unchanged objects from it)" in lines


@pytest.mark.parametrize("status", [pytest.param(JobStatus.FAILED, id="failed"),
                                    pytest.param(None, id="stopped-by-a-person")])
def test_a_run_not_kept_warm_deletes_its_claim_as_before(status, warm_job, cluster, lines):
    job = warm_job.job(backend="kubernetes")
    run_id = warm_job.run_id()
    steps.stage_data(job, run_id, log=lines.append)
    run = warm_job.complete(job, run_id, node="gpu-node-7", status=status or JobStatus.COMPLETED)
    if status is None:
        from sat_tasks.io.object_storage import write_json

        write_json(warm_job.hook, run.stop_uri, {"by": "alice"})
    deleted = steps.cleanup_run(job, run_id, log=lines.append)
    assert f"persistentvolumeclaim/{k8s_names.run_volume_claim_name(job, run_id)}" in deleted
    assert cluster.claims == [] and warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_a_retried_cleanup_run_does_not_release_its_own_claim(warm_job, cluster, lines):
    job, run_id = _first_run(warm_job, lines)
    steps.cleanup_run(job, run_id, log=lines.append)  # the task retried
    assert [c["metadata"]["name"] for c in cluster.claims] == [k8s_names.run_volume_claim_name(job, run_id)]
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job).claim == cluster.claims[0]["metadata"]["name"]


# ---- the next run ---------------------------------------------------------------------------------
def test_the_next_runs_staging_pod_copies_from_the_warm_claim_then_releases_it(warm_job, cluster, lines):
    job, first = _first_run(warm_job, lines)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    lines.clear()
    second = warm_job.run_id()
    staged = steps.stage_data(job, second, log=lines.append)

    (pod,) = [body for kind, body in cluster.created
              if kind == "Pod" and body["metadata"]["name"] == k8s_staging.staging_pod_name(job, second)]
    _validate(pod)
    (container,) = pod["spec"]["containers"]
    volumes = {v["name"]: v["persistentVolumeClaim"] for v in pod["spec"]["volumes"]}
    assert volumes["warm"] == {"claimName": state.claim, "readOnly": True}
    assert volumes["run"] == {"claimName": k8s_names.run_volume_claim_name(job, second)}
    (warm_mount,) = [m for m in container["volumeMounts"] if m["name"] == "warm"]
    assert warm_mount == {"name": "warm", "mountPath": k8s_staging.POD_WARM_DATA_DIR, "readOnly": True,
                          "subPath": k8s_names.run_volume_subpaths(job, first)["data"]}
    args = container["command"]
    assert args[args.index("--reuse-dir") + 1] == k8s_staging.POD_WARM_DATA_DIR
    assert json.loads(args[args.index("--reuse-objects") + 1]) == state.objects
    assert "--validate" in args  # staging's own checks still run

    assert staged["data"]["reused"] == 3 and staged["data"]["redownloaded"] == 0
    assert "warm pool: reused staged data (3 objects unchanged, 0 re-downloaded)" in lines
    assert (f"warm pool: the staging pod mounts volume claim {state.claim} of run {first} read-only at "
            f"{k8s_staging.POD_WARM_DATA_DIR}: 3 object(s) it staged are copied from it where unchanged") in lines
    # once staged, the warm claim and the placeholder go: nothing of the warm run is left
    deletes = [p for m, p, _, _ in cluster.requests if m == "DELETE"]
    assert f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{state.claim}" in deletes
    assert f"/api/v1/namespaces/{NAMESPACE}/pods/{state.placeholders[0]}" in deletes
    assert [c["metadata"]["name"] for c in cluster.claims] == [k8s_names.run_volume_claim_name(job, second)]
    assert f"warm pool: released persistentvolumeclaim/{state.claim} (handed over to run {second})" in lines
    assert not any(p["metadata"]["name"] == state.placeholders[0] for p in cluster.pods)


def test_a_warm_claim_deleted_by_hand_is_skipped_and_the_data_downloaded(warm_job, cluster, lines):
    job, first = _first_run(warm_job, lines)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    cluster.claims.clear()  # someone deleted it
    lines.clear()
    second = warm_job.run_id()
    staged = steps.stage_data(job, second, log=lines.append)
    (pod,) = [body for kind, body in cluster.created
              if kind == "Pod" and body["metadata"]["name"] == k8s_staging.staging_pod_name(job, second)]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["run"] and "--reuse-dir" not in pod["spec"]["containers"][0][
        "command"]
    assert f"warm pool: volume claim {state.claim} of run {first} is gone: the data is downloaded" in lines
    assert staged["data"]["transferred"] == 3 and "reused" not in staged["data"]


def test_a_staging_pod_without_a_warm_claim_is_as_before(warm_job):
    job = warm_job.job(backend="kubernetes")
    pod = k8s_staging.build_staging_pod(job, "manual__1", namespace=NAMESPACE, settings=KubernetesSettings())
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["run"]
    assert not any(a.startswith("--reuse") for a in pod["spec"]["containers"][0]["command"])


# ---- release ---------------------------------------------------------------------------------------
def test_release_deletes_the_placeholders_and_the_claim_and_skips_what_is_gone(warm_job, cluster, lines):
    job, _ = _first_run(warm_job, lines)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    released = warm_pool.release_job(job, warm_job.hook, pipeline_warm.release_state, lines.append)
    assert released == [f"warm-state/{job.name}", f"pod/{state.placeholders[0]}",
                        f"persistentvolumeclaim/{state.claim}"]
    assert cluster.claims == [] and not any(p["metadata"]["name"] == state.placeholders[0] for p in cluster.pods)
    before = len(cluster.requests)
    assert pipeline_warm.release_state(state, lines.append) == []  # again: all 404, skipped
    assert [(m, p) for m, p, _, _ in cluster.requests[before:]] == [
        ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{state.placeholders[0]}"),
        ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{state.claim}"),
        # the kept run's image pull Secret (ADR 0032; this job has no registry login: none was made)
        ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/{k8s_names.registry_secret_name_of_claim(state.claim)}")]


def test_release_for_capacity_deletes_the_claim_too(warm_job, cluster, lines, monkeypatch):
    job, _ = _first_run(warm_job, lines)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job).model_copy(update={"workspace": "team-a"})
    warm_pool.WarmPoolStore(warm_job.hook).save(job, state)
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_URI", warm_pool.warm_root(job))
    released = k8s_warm.release_for_capacity("team-a", 1, lines.append, client=cluster.client(), namespace=NAMESPACE)
    assert released == [f"warm-state/{job.name}", f"pod/{state.placeholders[0]}",
                        f"persistentvolumeclaim/{state.claim}"]
    assert cluster.claims == []


def test_expiry_at_the_next_run_deletes_the_claim_and_stages_cold(warm_job, cluster, lines):
    import time

    job, _ = _first_run(warm_job, lines)
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    warm_pool.WarmPoolStore(warm_job.hook).save(job, state.model_copy(update={"expires_at": time.time() - 1}))
    lines.clear()
    second = warm_job.run_id()
    staged = steps.stage_data(job, second, log=lines.append)
    assert f"warm pool: released persistentvolumeclaim/{state.claim}" in lines
    assert "reused" not in staged["data"]
    assert [c["metadata"]["name"] for c in cluster.claims] == [k8s_names.run_volume_claim_name(job, second)]


def test_the_kept_claim_is_the_one_the_attempts_mounted(warm_job):
    """The claim a kept run records is the run's own (the attempts' pods mount it), rendered schema-valid."""
    job = warm_job.job(backend="kubernetes")
    claim = k8s_pods.render_run_volume_claim(job, run_id="manual__1", namespace=NAMESPACE,
                                             settings=KubernetesSettings())
    _validate(claim)
    assert claim["metadata"]["name"] == k8s_names.run_volume_claim_name(job, "manual__1")
