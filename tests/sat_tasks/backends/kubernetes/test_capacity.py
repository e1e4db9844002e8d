"""Tests of the Spot capacity check on the kubernetes backend (sat_tasks.backends.kubernetes.capacity).

No cluster: the decision runs on hand-written NodeList/PodList JSON (fixtures/k8s_capacity/)
and the rank pod `pods.render_attempt_manifests` renders; the hook wrapper gets a fake CoreV1Api that
answers with real kubernetes client models built from the same JSON.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from sat_tasks.backends.kubernetes import capacity as k8s_capacity
from sat_tasks.backends.kubernetes.capacity import (
    CORDONED,
    EXCLUDED,
    NOT_READY,
    NOT_SELECTED,
    TAINTED,
)
from sat_tasks.core.handoffs import Action, Decision, Plan, VerdictKind
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import JobStopped
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import steps
from sat_tasks.spec import TrainingJob, parse_spec
from tests.support.paths import SAT_FIXTURES

FIXTURES = SAT_FIXTURES / "k8s_capacity"
BUCKET = "sat-capacity-tests"
RUN_ID = "manual__2026-11-30T10:00:00+00:00"
FAILED_NODE = "spot-h100-f"  # where attempt 1 ran and failed
GPU = "insufficient nvidia.com/gpu"


def _job(**overrides) -> TrainingJob:
    spec = {
        "name": "llama-spot",
        "learning_type": "spot",
        "framework": "pytorch",
        "job_failover": False,
        "nodes": 1,
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/ml/llama-train:1.4.2"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python train.py",
        "spot": {"max_resumes": 3, "max_wait_seconds": 3600, "poll_seconds": 30},
        "backend": "kubernetes",
    }
    spec.update(overrides)
    return parse_spec(spec)


@pytest.fixture
def nodes() -> list[dict]:
    return json.loads((FIXTURES / "nodes.json").read_text())["items"]


@pytest.fixture
def pods() -> list[dict]:
    return json.loads((FIXTURES / "pods.json").read_text())["items"]


def _node(nodes: list[dict], name: str) -> dict:
    return next(n for n in nodes if n["metadata"]["name"] == name)


def _assess(nodes, pods, job=None, exclude=(FAILED_NODE,)):
    job = job or _job()
    pod = k8s_capacity.rank_pod_manifest(job, RUN_ID, Plan(attempt=2, exclude_nodes=list(exclude)))
    return k8s_capacity.assess_capacity(pod, nodes, pods, needed=job.nodes, exclude_nodes=exclude)


def _gpu_pod(name: str, node: str, phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "namespace": "team-x"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"requests": {
                "cpu": "16", "memory": "256Gi", "nvidia.com/gpu": "8"}}}]},
            "status": {"phase": phase}}


# ---- the decision --------------------------------------------------------------------------------
def test_enough_capacity_and_every_rejection_counted(nodes, pods):
    result = _assess(nodes, pods)
    assert result.available and result.fitting == ("spot-h100-a",) and result.total == 10
    assert result.rejected == {
        EXCLUDED: 1,           # spot-h100-f, where attempt 1 failed
        NOT_SELECTED: 2,       # the on-demand node and the B300 node
        NOT_READY: 1,          # spot-h100-c
        CORDONED: 1,           # spot-h100-d
        TAINTED: 1,            # spot-h100-e: nvidia.com/gpu.health NoExecute
        GPU: 2,                # spot-h100-b (8 of 8 used), spot-h100-g (4 of 8, via the init container)
        "insufficient memory": 1,  # spot-h100-h
    }
    head, _, tail = result.summary().partition("; rejected: ")
    assert head == "1 of 10 node(s) fit one rank (need 1)"
    assert sorted(tail.split(", ")) == sorted(f"{count} {reason}" for reason, count in result.rejected.items())


def test_all_nodes_full(nodes, pods):
    pods += [_gpu_pod("other-r0", "spot-h100-a")]
    result = _assess(nodes, pods)
    assert not result.available and result.fitting == ()
    assert result.rejected[GPU] == 3


@pytest.mark.parametrize(("change", "reason"), [
    pytest.param(lambda n: n["status"]["conditions"][-1].update(status="False", reason="KubeletNotReady"),
                 NOT_READY, id="not-ready"),
    pytest.param(lambda n: n["spec"].update(unschedulable=True), CORDONED, id="cordoned"),
    pytest.param(lambda n: n["spec"]["taints"].append({"key": "maintenance", "value": "bios", "effect": "NoSchedule"}),
                 TAINTED, id="untolerated-taint"),
    pytest.param(lambda n: n["spec"]["taints"].append({"key": "sat.ai/capacity", "value": "spot", "effect": "NoExecute"}),
                 TAINTED, id="tolerated-key-other-effect"),
    pytest.param(lambda n: n["metadata"]["labels"].pop("sat.ai/capacity"), NOT_SELECTED, id="not-spot"),
])
def test_the_only_free_node_rejected(nodes, pods, change, reason):
    free = _node(nodes, "spot-h100-a")
    before = _assess(nodes, pods).rejected.get(reason, 0)
    change(free)
    result = _assess(nodes, pods)
    assert not result.available
    assert result.rejected[reason] == before + 1


def test_prefer_no_schedule_and_tolerated_taints_do_not_reject(nodes, pods):
    free = _node(nodes, "spot-h100-a")
    free["spec"]["taints"].append({"key": "spot-interruption-soon", "effect": "PreferNoSchedule"})
    assert {t["key"] for t in free["spec"]["taints"]} >= {"nvidia.com/gpu", "sat.ai/capacity"}  # both tolerated
    assert _assess(nodes, pods).fitting == ("spot-h100-a",)


def test_excluded_failed_node(nodes, pods):
    assert _assess(nodes, pods, exclude=()).fitting == ("spot-h100-a", FAILED_NODE)
    assert _assess(nodes, pods, exclude=(FAILED_NODE,)).rejected[EXCLUDED] == 1
    # Matched by the kubernetes.io/hostname label too (what the pod's anti-affinity uses).
    _node(nodes, FAILED_NODE)["metadata"]["name"] = "ip-10-0-8-16.eu-west-1.compute.internal"
    assert _assess(nodes, pods).rejected[EXCLUDED] == 1


def test_multi_node_job_needs_as_many_free_nodes(nodes, pods):
    job = _job(nodes=2)
    result = _assess(nodes, pods, job=job)
    assert result.fitting == ("spot-h100-a",) and result.needed == 2 and not result.available
    assert result.summary().startswith("1 of 10 node(s) fit one rank (need 2)")
    assert _assess(nodes, pods, job=job, exclude=()).available  # a second free node: enough


def test_gpu_requests_of_other_pods_are_counted(nodes, pods):
    by_name = {p["metadata"]["name"]: p for p in pods}
    # Init containers: the larger of their request and the containers' sum.
    assert k8s_capacity.pod_requests(by_name["notebook-gpu-5c7d9"])["nvidia.com/gpu"] == 4
    result = _assess(nodes, pods)
    assert result.rejected[GPU] == 2
    # Finished, failed and unbound pods hold nothing: spot-h100-a (a Succeeded 8-GPU pod) fits.
    assert "spot-h100-a" in result.fitting
    # Free half of spot-h100-g's GPUs is not enough; free all and it fits.
    pods.remove(by_name["notebook-gpu-5c7d9"])
    assert "spot-h100-g" in _assess(nodes, pods).fitting
    # A terminated pod on a node is ignored; a running one is counted.
    pods.append(_gpu_pod("done", "spot-h100-g", phase="Succeeded"))
    assert "spot-h100-g" in _assess(nodes, pods).fitting
    pods.append(_gpu_pod("busy", "spot-h100-g"))
    assert "spot-h100-g" not in _assess(nodes, pods).fitting


def test_the_rank_pod_is_the_rendered_pod():
    job = _job()
    pod = k8s_capacity.rank_pod_manifest(job, RUN_ID, Plan(attempt=2, exclude_nodes=[FAILED_NODE]))
    assert pod["metadata"]["name"].endswith("-a2-r0")
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "sat.ai/capacity": "spot"}
    assert {"key": "sat.ai/capacity", "operator": "Equal", "value": "spot", "effect": "NoSchedule"} \
        in pod["spec"]["tolerations"]
    assert k8s_capacity.pod_requests(pod)["nvidia.com/gpu"] == 8
    assert k8s_capacity.pod_requests(pod)["memory"] == 544 * 2**30  # memory + /dev/shm


def test_on_demand_pod_selects_only_on_demand_nodes(nodes, pods):
    result = _assess(nodes, pods, job=_job(learning_type="on-demand", job_failover=True, spot={}), exclude=())
    assert result.fitting == ("ondemand-h100-a",)


# ---- the hook wrapper ------------------------------------------------------------------------------
class _FakeCoreV1:
    """list_node / list_namespaced_pod answering with real client models from the fixtures."""

    def __init__(self, error: ApiException | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.error = error

    @staticmethod
    def _models(file: str, kind: str):
        return ApiClient().deserialize(SimpleNamespace(data=(FIXTURES / file).read_text()), kind)

    def list_node(self, **kwargs):
        self.calls.append(("list_node", kwargs))
        if self.error:
            raise self.error
        return self._models("nodes.json", "V1NodeList")

    def list_namespaced_pod(self, namespace, **kwargs):
        self.calls.append(("list_namespaced_pod", {"namespace": namespace, **kwargs}))
        return self._models("pods.json", "V1PodList")


def test_cluster_capacity_asks_the_cluster_through_the_hook(monkeypatch, nodes, pods):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    client, conn_ids = _FakeCoreV1(), []

    def core_v1(self):
        conn_ids.append(self.conn_id)
        return client

    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(core_v1))
    monkeypatch.setenv("AIRFLOW__SAT__KUBERNETES_CONN_ID", "sat_cluster")
    job = _job()
    result = k8s_capacity.cluster_capacity(job, RUN_ID, Plan(attempt=2, exclude_nodes=[FAILED_NODE]), log=lambda _m: None)
    assert conn_ids == ["sat_cluster"]
    # the jobs' namespace's pods only, never every pod of the cluster (ADR 0040)
    assert ("list_namespaced_pod", {"namespace": "sat-jobs",
                                    "field_selector": "status.phase!=Succeeded,status.phase!=Failed"}) in client.calls
    assert result == _assess(nodes, pods)  # the client models round-trip to the API's JSON


def test_cluster_capacity_api_errors():
    said = []
    unavailable = _FakeCoreV1(ApiException(status=503, reason="Service Unavailable"))
    assert k8s_capacity.cluster_capacity(_job(), RUN_ID, Plan(attempt=2), client=unavailable, log=said.append) is None
    assert "503" in said[0] and "trying again" in said[0]
    forbidden = _FakeCoreV1(ApiException(status=403, reason="Forbidden"))
    with pytest.raises(k8s_capacity.CapacityForbidden, match="may not list nodes or the jobs' pods"):
        k8s_capacity.cluster_capacity(_job(), RUN_ID, Plan(attempt=2), client=forbidden, log=said.append)


# ---- steps.capacity_available -------------------------------------------------------------------
@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


def _previous(**changes) -> Decision:
    now = time.time()
    values = {"attempt": 1, "verdict": VerdictKind.PREEMPTED, "action": Action.RESUME, "why": "spot pre-emption",
              "exclude_nodes": [FAILED_NODE], "preempted_at": now, "capacity_at": now + 3600}
    return Decision(**{**values, **changes})


@pytest.mark.parametrize("answer", [True, False])
def test_kubernetes_backend_asks_the_cluster(monkeypatch, bucket, answer):
    calls = []

    def fake(job, run_id, plan, *, client=None, log=print):
        calls.append((job.name, run_id, plan.attempt, list(plan.exclude_nodes)))
        return k8s_capacity.CapacityAssessment(needed=1, fitting=("spot-h100-a",) if answer else (),
                                               rejected={} if answer else {GPU: 1}, total=1)

    monkeypatch.setattr(k8s_capacity, "cluster_capacity", fake)
    said = []
    run_id = f"{RUN_ID}-{answer}"
    # The simulated Spot market of the local backend (`capacity_at`) plays no part here.
    assert steps.capacity_available(_job(), run_id, _previous(), log=said.append) is answer
    assert calls == [("llama-spot", run_id, 2, [FAILED_NODE])]
    assert any("fit one rank" in line for line in said)


def test_kubernetes_backend_keeps_polling_when_the_api_does_not_answer(monkeypatch, bucket):
    monkeypatch.setattr(k8s_capacity, "cluster_capacity", lambda *a, **k: None)
    assert steps.capacity_available(_job(), f"{RUN_ID}-none", _previous(), log=lambda _m: None) is False


def test_kubernetes_backend_without_permission_stops_the_job(monkeypatch, bucket):
    def forbidden(*args, **kwargs):
        raise k8s_capacity.CapacityForbidden("the Kubernetes connection may not list nodes and pods cluster-wide (403 Forbidden)")

    monkeypatch.setattr(k8s_capacity, "cluster_capacity", forbidden)
    job, run_id = _job(), f"{RUN_ID}-forbidden"
    with pytest.raises(JobStopped, match="403"):
        steps.capacity_available(job, run_id, _previous(), log=lambda _m: None)
    last = JobRun(job, run_id).history(lambda _m: None).entries()[-1]
    assert last["status"] == JobStatus.FAILED.value and "403" in last["reason"]


def test_max_wait_budget_still_applies_on_kubernetes(monkeypatch, bucket):
    monkeypatch.setattr(k8s_capacity, "cluster_capacity", lambda *a, **k: pytest.fail("must not ask the cluster"))
    previous = _previous(preempted_at=time.time() - 7200)
    with pytest.raises(JobStopped, match="max_wait_seconds"):
        steps.capacity_available(_job(), f"{RUN_ID}-budget", previous, log=lambda _m: None)


def test_local_backend_still_uses_the_local_pool(monkeypatch, bucket):
    monkeypatch.setattr(k8s_capacity, "cluster_capacity", lambda *a, **k: pytest.fail("must not ask the cluster"))
    job = _job(backend="local")
    assert steps.capacity_available(job, f"{RUN_ID}-local", _previous(), log=lambda _m: None) is False
    assert steps.capacity_available(job, f"{RUN_ID}-local", _previous(capacity_at=0), log=lambda _m: None) is True


def test_fixture_nodes_are_what_the_tests_say(nodes):
    """Guard the hand-written fixture: ten distinct 8-GPU nodes that the client's models accept."""
    names = [n["metadata"]["name"] for n in nodes]
    assert len(set(names)) == 10 and all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in nodes)
    models = _FakeCoreV1._models("nodes.json", "V1NodeList")
    assert [m.metadata.name for m in models.items] == names and models.items[2].status.conditions[-1].status == "Unknown"
