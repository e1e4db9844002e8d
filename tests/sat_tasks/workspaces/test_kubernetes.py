"""Workspaces on Kubernetes, through rendered manifests: the pods' node selector and toleration, Kueue's objects and labels, the Airflow pool."""

from __future__ import annotations

import re

import pytest

from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import workspace as k8s_ws
from sat_tasks.backends.kubernetes.settings import KubernetesSettings, SettingError
from sat_tasks.core.handoffs import Plan
from sat_tasks.spec import parse_spec
from sat_tasks.spec.workspace import parse_workspace
from tests.sat_tasks.workspaces.conftest import WORKSPACE, job_spec

K8S_VERSION = "1.37.0"
RUN_ID = "manual__2026-11-29T18:00:00+00:00"
PLAIN = KubernetesSettings()
KUEUE = KubernetesSettings(kueue=True)
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[0-9]+(m|Ki|Mi|Gi|Ti)?$")


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _pods(job, settings, exclude_nodes: list[str] | None = None) -> list[dict]:
    manifests = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1, exclude_nodes=exclude_nodes or []),
                                                  settings=settings)
    return [m for m in manifests if m["kind"] == "Pod"]


@pytest.mark.parametrize("settings", [pytest.param(PLAIN, id="plain"), pytest.param(KUEUE, id="kueue")])
def test_a_workspace_jobs_pods_run_only_on_its_nodes(settings):
    job = parse_spec(job_spec())
    pods = _pods(job, settings, exclude_nodes=["gpu-node-3"])
    assert len(pods) == 2
    for pod in pods:
        _validate(pod)
        spec = pod["spec"]
        assert spec["nodeSelector"]["sat.ai/workspace"] == "team-a"
        assert {"effect": "NoSchedule", "key": "sat.ai/workspace", "operator": "Equal", "value": "team-a"} \
            in spec["tolerations"]
        # failover inside the workspace: the failed node is still excluded, on top of the workspace's selector
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-node-3"]} in term["matchExpressions"]


def test_with_kueue_the_pods_name_the_workspaces_queue_and_form_one_group():
    job = parse_spec(job_spec())
    pods = _pods(job, KUEUE)
    groups = {pod["metadata"]["labels"][k8s_ws.KUEUE_POD_GROUP_LABEL] for pod in pods}
    assert len(groups) == 1  # admitted whole: both ranks or none
    for pod in pods:
        assert pod["metadata"]["labels"][k8s_ws.KUEUE_QUEUE_LABEL] == "team-a"
        assert pod["metadata"]["annotations"][k8s_ws.KUEUE_POD_GROUP_COUNT] == "2"
    (single,) = _pods(parse_spec(job_spec(nodes=1)), KUEUE)
    assert single["metadata"]["labels"][k8s_ws.KUEUE_QUEUE_LABEL] == "team-a"
    assert k8s_ws.KUEUE_POD_GROUP_LABEL not in single["metadata"]["labels"]


def test_without_kueue_or_a_workspace_the_pods_carry_no_queue():
    for pod in _pods(parse_spec(job_spec()), PLAIN):
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
    other = parse_spec(job_spec(workspace=None))
    for pod in _pods(other, KUEUE):
        assert "sat.ai/workspace" not in pod["spec"].get("nodeSelector", {})
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
        assert not any(t["key"] == "sat.ai/workspace" for t in pod["spec"].get("tolerations", []))


def test_node_patches_label_and_taint_the_workspaces_nodes():
    ws = parse_workspace(WORKSPACE)
    manifests = k8s_ws.render_workspace_manifests(ws, nodes=["gpu-a", "gpu-b"], settings=PLAIN, namespace="team-ns")
    assert [m["kind"] for m in manifests] == ["Node", "Node"]  # no Kueue: the Airflow pool queues
    for manifest, node in zip(manifests, ["gpu-a", "gpu-b"]):
        _validate(manifest)
        assert manifest["metadata"] == {"name": node, "labels": {"sat.ai/workspace": "team-a"}}
        assert manifest["spec"]["taints"] == [{"effect": "NoSchedule", "key": "sat.ai/workspace", "value": "team-a"}]
    notes = "\n".join(k8s_ws.operator_notes(ws, namespace="team-ns", settings=PLAIN, kueue=False))
    assert "airflow pools set sat-workspace-team-a 3" in notes and "kubectl taint node NODE sat.ai/workspace=team-a" in notes


def _kueue_objects(ws, namespace="team-ns") -> dict[str, dict]:
    manifests = k8s_ws.render_workspace_manifests(ws, settings=PLAIN, kueue=True, namespace=namespace)
    assert [m["kind"] for m in manifests] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    return {m["kind"]: m for m in manifests}


def test_kueue_objects_have_the_crds_shape_and_point_at_each_other():
    """No CRD schema offline: the fields Kueue v1beta1 requires, their types, and the references between them."""
    ws = parse_workspace(WORKSPACE)
    objects = _kueue_objects(ws)
    for obj in objects.values():
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta1"
        assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
        assert DNS_1123_SUBDOMAIN.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 253
    flavor, cq, lq = objects["ResourceFlavor"], objects["ClusterQueue"], objects["LocalQueue"]
    assert "namespace" not in flavor["metadata"] and "namespace" not in cq["metadata"]  # cluster-scoped
    assert set(flavor["spec"]) <= {"nodeLabels", "nodeTaints", "tolerations", "topologyName"}
    assert flavor["spec"]["nodeLabels"] == {"sat.ai/workspace": "team-a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert flavor["spec"]["nodeTaints"] == [{"effect": "NoSchedule", "key": "sat.ai/workspace", "value": "team-a"}]
    assert set(cq["spec"]) <= {"namespaceSelector", "queueingStrategy", "resourceGroups", "cohort", "preemption",
                               "flavorFungibility", "admissionChecks", "stopPolicy", "fairSharing"}
    assert cq["spec"]["queueingStrategy"] in ("StrictFIFO", "BestEffortFIFO")
    assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "team-ns"}}
    (group,) = cq["spec"]["resourceGroups"]
    (flavor_quota,) = group["flavors"]
    assert flavor_quota["name"] == flavor["metadata"]["name"]
    assert [r["name"] for r in flavor_quota["resources"]] == group["coveredResources"]
    for resource in flavor_quota["resources"]:
        assert set(resource) == {"name", "nominalQuota"} and QUANTITY.match(resource["nominalQuota"])
    assert lq["metadata"]["namespace"] == "team-ns" and lq["spec"] == {"clusterQueue": cq["metadata"]["name"]}
    assert lq["metadata"]["name"] == k8s_ws.local_queue_name("team-a")


def test_the_quota_is_the_node_count_times_the_per_node_allocation_and_follows_an_edit():
    ws = parse_workspace(WORKSPACE)

    def quota(workspace) -> dict[str, str]:
        (group,) = _kueue_objects(workspace)["ClusterQueue"]["spec"]["resourceGroups"]
        return {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}

    assert quota(ws) == {"pods": "3", "cpu": "300", "memory": "4800Gi", "nvidia.com/gpu": "24"}
    assert quota(ws.with_nodes(5)) == {"pods": "5", "cpu": "500", "memory": "8000Gi", "nvidia.com/gpu": "40"}
    cpu_only = parse_workspace({**WORKSPACE, "resources": {"server_type": "cpu", "cpu": "500m", "memory": "3Gi"}})
    assert quota(cpu_only) == {"pods": "3", "cpu": "1500m", "memory": "9Gi"}


def test_without_kueue_rank_0s_launch_takes_a_pool_slot_per_node(monkeypatch):
    from airflow.sdk import DAG

    from sat_tasks.backends.kubernetes import KubernetesBackend

    job = parse_spec(job_spec(backend="kubernetes"))
    with DAG(dag_id="ws_pool", schedule=None):
        ops = KubernetesBackend().launch_operators(attempt=1, previous_decide_task_id=None, job=job)
    assert [(op.pool, op.pool_slots) for op in ops] == [("sat-workspace-team-a", 2), ("default_pool", 1)]
    monkeypatch.setenv("AIRFLOW__SAT__K8S_KUEUE", "true")  # Kueue queues instead: no pool
    with DAG(dag_id="ws_kueue", schedule=None):
        ops = KubernetesBackend().launch_operators(attempt=1, previous_decide_task_id=None, job=job)
    assert {op.pool for op in ops} == {"default_pool"}


def test_the_kueue_setting_must_be_a_boolean(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__K8S_KUEUE", "maybe")
    with pytest.raises(SettingError, match=r"\[sat\] k8s_kueue = 'maybe': must be true or false"):
        KubernetesSettings.from_sat_config()
    monkeypatch.setenv("AIRFLOW__SAT__K8S_KUEUE", "yes")
    assert KubernetesSettings.from_sat_config().kueue is True


# ---- a failover inside the workspace waits for healthy room, and says so ---------------------------
def _node(name: str, workspace: str | None = "team-a") -> dict:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    taints = [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "present"}]
    if workspace:
        labels["sat.ai/workspace"] = workspace
        taints.append({"effect": "NoSchedule", "key": "sat.ai/workspace", "value": workspace})
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "200", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _busy_pod(node: str) -> dict:
    return {"metadata": {"name": f"other-on-{node}", "namespace": "sat-jobs"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x", "resources": {
                "requests": {"nvidia.com/gpu": "8", "cpu": "8", "memory": "64Gi"}}}]},
            "status": {"phase": "Running"}}


class FakeCoreV1:
    """list_node / list_namespaced_pod answering with real client models; records each call."""

    def __init__(self, nodes: list[dict], pods: list[dict]):
        self.nodes, self.pods, self.calls = nodes, pods, []

    @staticmethod
    def _models(items: list[dict], kind: str):
        import json
        from types import SimpleNamespace

        from kubernetes.client import ApiClient

        return ApiClient().deserialize(SimpleNamespace(data=json.dumps({"items": items})), kind)

    def list_node(self, **kwargs):
        self.calls.append("list_node")
        return self._models(self.nodes, "V1NodeList")

    def list_namespaced_pod(self, namespace, **kwargs):
        self.calls.append("list_namespaced_pod")
        return self._models(self.pods, "V1PodList")


class MemoryHistory:
    def __init__(self):
        from sat_tasks.core.status import StatusHistory

        self.entries: list[dict] = []
        self.history = StatusHistory(load=lambda: self.entries, save=lambda e: setattr(self, "entries", e),
                                     log=lambda _line: None)


def _failover_job():
    return parse_spec(job_spec(backend="kubernetes", job_failover=True))


def NO_WARM(workspace, nodes, log, client):
    return []


def test_a_failover_releases_the_workspaces_warm_placeholders_before_it_waits():
    """Warm placeholders hold the healthy nodes: they are released, and the failover goes at once."""
    from sat_tasks.backends.kubernetes.workspace_wait import await_workspace_nodes

    client = FakeCoreV1([_node("ws-a"), _node("ws-b"), _node("ws-c")], [_busy_pod("ws-b"), _busy_pod("ws-c")])
    asked: list[tuple[str, int]] = []

    def release(workspace, nodes, log, api):
        assert api is client
        asked.append((workspace, nodes))
        client.pods = []  # the placeholders on ws-b and ws-c are deleted
        return ["warm-state/nightly", "pod/sat-warm-nightly-r0", "pod/sat-warm-nightly-r1"]

    memory = MemoryHistory()
    plan = Plan(attempt=2, exclude_nodes=["ws-a"], failovers=1)
    assert await_workspace_nodes(_failover_job(), RUN_ID, plan, client=client, history=memory.history,
                                 deadline_seconds=600, poll_seconds=5, sleep=lambda _s: pytest.fail("waited"),
                                 release_warm=release) is False
    assert asked == [("team-a", 2)] and memory.entries == []  # no wait, nothing to record


def test_a_failover_waits_as_failoverinprogress_until_its_workspace_has_healthy_room():
    from sat_tasks.backends.kubernetes.workspace_wait import await_workspace_nodes

    # 3 workspace nodes: ws-a failed (excluded), ws-b busy with another job, ws-c free; a node outside it is free too
    client = FakeCoreV1([_node("ws-a"), _node("ws-b"), _node("ws-c"), _node("outside", workspace=None)],
                        [_busy_pod("ws-b")])
    memory = MemoryHistory()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        client.pods = []  # the other job ends: capacity returns

    plan = Plan(attempt=2, exclude_nodes=["ws-a"], failovers=1)
    assert await_workspace_nodes(_failover_job(), RUN_ID, plan, client=client, history=memory.history,
                                 deadline_seconds=600, poll_seconds=5, sleep=sleep, release_warm=NO_WARM) is True
    (entry,) = memory.entries
    assert entry["status"] == "Pending - failoverinprogress" and entry["attempt"] == 2
    assert "waits for healthy nodes in workspace team-a (excluded: ws-a)" in entry["reason"]
    # the node outside the workspace does not count: its label is not the workspace's
    assert "1 of 4 node(s) fit one rank (need 2)" in entry["reason"] and "1 excluded" in entry["reason"]
    assert slept == [5] and client.calls.count("list_node") == 2


def test_a_failover_without_healthy_room_fails_at_the_deadline_and_a_first_attempt_never_asks():
    from sat_tasks.backends.kubernetes.workspace_wait import WorkspaceFailoverTimeout, await_workspace_nodes

    client = FakeCoreV1([_node("ws-a"), _node("ws-b")], [])
    memory = MemoryHistory()
    with pytest.raises(WorkspaceFailoverTimeout, match=r"\[sat\] workspace_wait_seconds.*0 of 2 node\(s\) fit"):
        await_workspace_nodes(_failover_job(), RUN_ID, Plan(attempt=3, exclude_nodes=["ws-a", "ws-b"], failovers=2),
                              client=client, history=memory.history, deadline_seconds=0, sleep=lambda _s: None,
                              release_warm=NO_WARM)
    assert [e["status"] for e in memory.entries] == ["Pending - failoverinprogress", "Failed"]
    untouched = FakeCoreV1([], [])
    assert not await_workspace_nodes(_failover_job(), RUN_ID, Plan(attempt=1), client=untouched, history=None,
                                     deadline_seconds=0)
    assert untouched.calls == []


def test_the_launch_task_fails_red_when_the_failover_finds_no_room(monkeypatch):
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import AirflowFailException

    from sat_tasks.backends.kubernetes.operator import make_launch_operators

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "0")
    job = _failover_job()
    with DAG(dag_id="ws_wait", schedule=None):
        _rank0, rank1 = make_launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=job)
    rank1.__dict__["client"] = FakeCoreV1([_node("ws-a")], [])  # the provider's cached CoreV1Api
    with pytest.raises(AirflowFailException, match="waits for healthy nodes in workspace team-a"):
        rank1.await_workspace(job, RUN_ID, Plan(attempt=2, exclude_nodes=["ws-a"], failovers=1))


# ---- the generic DAG (spec with the run) has no workspace pool -------------------------------------
def test_without_kueue_a_multi_node_generic_dag_run_is_refused_and_a_one_node_run_is_told_what_queues_it(
        sat_dirs, workspace_data, monkeypatch):
    from sat_tasks.core.status import JobStatus
    from sat_tasks.errors import JobStopped
    from sat_tasks.io.workspaces import WorkspaceStore
    from sat_tasks.pipeline.steps import check_workspace
    from tests.sat_tasks.workspaces.test_store_and_queue import FakeRun

    WorkspaceStore().create(workspace_data)
    two = FakeRun(parse_spec(job_spec(backend="kubernetes")))
    with pytest.raises(JobStopped, match=r"a 2-node job started with its spec in the run .* cannot queue for the "
                                         r"workspace's nodes on Kubernetes without Kueue.*pool sat-workspace-team-a"
                                         r"\) or turn Kueue on \(\[sat\] k8s_kueue = true\)"):
        check_workspace(two.job, two, spec_with_run=True)
    assert two.statuses()[-1][0] == JobStatus.FAILED.value
    check_workspace(two.job, FakeRun(two.job))  # its own DAG: rank 0 queues in the pool
    lines = []
    one = FakeRun(parse_spec(job_spec(backend="kubernetes", nodes=1)))
    check_workspace(one.job, one, lines.append, spec_with_run=True)
    assert one.entries == [] and any("queues through the Kubernetes scheduler" in line for line in lines)
    local = FakeRun(parse_spec(job_spec(backend="local")))
    check_workspace(local.job, local, spec_with_run=True)  # the local slot board queues every run
    monkeypatch.setenv("AIRFLOW__SAT__K8S_KUEUE", "true")  # Kueue admits the pod group whole
    check_workspace(two.job, FakeRun(two.job), spec_with_run=True)
