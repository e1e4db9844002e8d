"""Kubernetes and the node quarantine: the pods' anti-affinity, and the optional cordon + taint against the recorded API."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote, urlparse

import pytest

from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import quarantine
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.handoffs import Plan
from sat_tasks.spec import parse_spec
from tests.support.k8s_api import RecordedCluster, _Response, _status

SETTINGS = KubernetesSettings()
RUN_ID = "manual__2026-12-01T08:00:00+00:00"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def job(**fields):
    return parse_spec({"name": "quarantine-job", "backend": "kubernetes", "job_failover": True,
                       "image": {"url": "registry.example.com/team/train:1.0"},
                       "resources": {"gpus_per_node": 8, "memory": "512Gi", "shared_memory": "64Gi",
                                     "server_type": "g2"},
                       "data": {"source": "s3://data/corpus/"}, "results": {"destination": "s3://results/out/"},
                       "command": "python train.py", **fields})


def hostname_expressions(pod: dict) -> list[dict]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == "kubernetes.io/hostname"]


@pytest.mark.parametrize(("exclude", "quarantined", "values"), [
    pytest.param([], ["bad-2", "bad-1"], ["bad-1", "bad-2"], id="quarantined-only"),
    pytest.param(["gpu-7"], ["bad-1", "gpu-7"], ["bad-1", "gpu-7"], id="with-failed-attempts"),
])
def test_pods_may_not_land_on_a_quarantined_node(exclude, quarantined, values):
    import kubernetes_validate

    for nodes in (1, 2):
        manifests = k8s_pods.render_attempt_manifests(job(nodes=nodes), run_id=RUN_ID, plan=Plan(attempt=2, exclude_nodes=exclude),
                                                      settings=SETTINGS, quarantined_nodes=quarantined)
        for pod in (m for m in manifests if m["kind"] == "Pod"):
            assert hostname_expressions(pod) == [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                                  "values": values}]
            kubernetes_validate.validate(pod, "1.37.0", strict=True)


def test_the_operator_builds_its_pod_with_the_quarantine():
    from sat_tasks.backends.kubernetes.operator import build_pod_operator_kwargs

    pod = build_pod_operator_kwargs(job(), run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS,
                                    quarantined_nodes=["bad-1"])["full_pod_spec"]
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert any(e.key == "kubernetes.io/hostname" and e.values == ["bad-1"] for e in terms[0].match_expressions)


class NodeCluster(RecordedCluster):
    """The recorded API server, plus what a cordon needs: PATCH of a node (a strategic merge of its spec)."""

    def __init__(self, *args, forbidden_nodes: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.forbidden_nodes = forbidden_nodes
        self.patches: list[tuple[str, str, dict]] = []

    def request(self, method, url, fields=None, body=None, headers=None, **kwargs):
        path = unquote(urlparse(url).path)
        node = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
        if node and self.forbidden_nodes:
            return _status(403, "Forbidden", f'nodes "{node.group(1)}" is forbidden')
        if node and method == "PATCH":
            patch = json.loads(body) if isinstance(body, (str, bytes)) else body
            self.patches.append((node.group(1), (headers or {}).get("Content-Type", ""), patch))
            target = next(n for n in self.nodes if n["metadata"]["name"] == node.group(1))
            for key, value in patch.get("spec", {}).items():
                if value is None:
                    target["spec"].pop(key, None)
                else:
                    target["spec"][key] = value
            target["metadata"]["resourceVersion"] = str(int(target["metadata"]["resourceVersion"]) + 1)
            return _Response(200, json.dumps(target))
        return super().request(method, url, fields=fields, body=body, headers=headers, **kwargs)


def node(name: str, *, taints=(GPU_TAINT,), unschedulable: bool | None = None) -> dict:
    spec: dict = {"taints": [dict(t) for t in taints]}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "7"}, "spec": spec}


def test_cordon_taints_once_and_a_release_undoes_only_what_sat_did():
    import kubernetes_validate

    cluster = NodeCluster(nodes=[node("gpu-1")])
    core, lines = cluster.client(), []
    assert quarantine.cordon_node(core, "gpu-1", lines.append) is True
    spec = cluster.nodes[0]["spec"]
    assert spec["unschedulable"] is True
    assert spec["taints"] == [GPU_TAINT, {"key": "sat.io/quarantined", "value": "true", "effect": "NoSchedule"}]
    (_name, content_type, patch), = cluster.patches
    assert content_type == "application/strategic-merge-patch+json" and patch["metadata"]["resourceVersion"] == "7"
    kubernetes_validate.validate(cluster.nodes[0], "1.37.0", strict=True)
    assert quarantine.cordon_node(core, "gpu-1", lines.append) is False  # already cordoned: no second patch
    assert len(cluster.patches) == 1

    assert quarantine.uncordon_node(core, "gpu-1", lines.append) is True
    assert cluster.nodes[0]["spec"] == {"unschedulable": False, "taints": [GPU_TAINT]}
    assert "uncordoned" in lines[-1]


def test_a_node_an_administrator_cordoned_stays_cordoned():
    cluster = NodeCluster(nodes=[node("gpu-2", unschedulable=True)])
    lines: list[str] = []
    assert quarantine.uncordon_node(cluster.client(), "gpu-2", lines.append) is False
    assert cluster.patches == [] and "SAT did not cordon it" in lines[-1]


def test_without_rbac_on_nodes_the_node_is_only_avoided():
    cluster = NodeCluster(nodes=[node("gpu-3")], forbidden_nodes=True)
    lines: list[str] = []
    assert quarantine.cordon_node(cluster.client(), "gpu-3", lines.append) is False
    assert "403 Forbidden" in lines[-1] and "get and patch on nodes" in lines[-1]
    assert quarantine.cordon_node(cluster.client(), "gone", lambda _: None) is False


@pytest.mark.parametrize(("switch", "patched"), [pytest.param("true", 1, id="on"), pytest.param("false", 0, id="off")])
def test_a_launch_cordons_the_quarantined_nodes_only_with_the_switch(monkeypatch, switch, patched):
    monkeypatch.setenv("AIRFLOW__SAT__QUARANTINE_CORDON", switch)
    monkeypatch.setattr("sat_tasks.io.node_ledger.quarantined_nodes", lambda job, hook, log: ["gpu-4"])
    cluster = NodeCluster(nodes=[node("gpu-4")])
    assert quarantine.quarantined_for_launch(job(), None, lambda _: None, core=cluster.client()) == ["gpu-4"]
    assert len(cluster.patches) == patched
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "kubernetes")
    assert quarantine.uncordon_released("gpu-4", lambda _: None, core=cluster.client()) is bool(patched)
