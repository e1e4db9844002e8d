"""What the Kubernetes backend reads for classify besides the pod (`evidence`): events in the attempt's window, node labels at start.

Against the real `CoreV1Api` over the API server in memory (`tests.support.k8s_api`); no
Object Storage: a rank's record is read with `records._read_rank`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod
from kubernetes.client.exceptions import ApiException

from sat_tasks.backends.kubernetes import evidence
from sat_tasks.backends.kubernetes import records as k8s_records
from sat_tasks.classify import VerdictKind, classify
from sat_tasks.classify.loaders import (
    NODE_LABELS_AT_START_ANNOTATION,
    NODECLAIM_AT_START_ANNOTATION,
)
from sat_tasks.classify.window import WINDOW_AFTER, WINDOW_BEFORE
from sat_tasks.spec import TrainingJob, parse_spec
from tests.support.k8s_api import RecordedCluster

NAMESPACE = "sat-jobs"
POD = "sat-train-1a2b3c4d-a1-r0"
NODE = "ip-10-0-7-21.ec2.internal"
CLAIM = "gpu-spot-x7k2p"
STARTED = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
FINISHED = STARTED + timedelta(hours=2)
SPOT_LABELS = {"kubernetes.io/hostname": NODE, "karpenter.sh/capacity-type": "spot",
               "karpenter.sh/nodepool": "gpu-spot", "node.kubernetes.io/instance-type": "p5.48xlarge"}


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _job() -> TrainingJob:
    return parse_spec({
        "name": "train", "learning_type": "on-demand", "framework": "pytorch", "job_failover": True, "nodes": 1,
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/ml/train:1", "registry_conn_id": "sat_registry_main"},
        "data": {"source": "s3://sat-tests/data/"}, "results": {"destination": "s3://sat-tests/out/"},
        "command": "python train.py", "backend": "kubernetes",
    })


def _pod(*, finished: datetime | None = FINISHED, exit_code: int = 143, labels: dict | None = None,
         annotations: dict | None = None) -> dict:
    state = ({"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": _at(STARTED),
                             "finishedAt": _at(finished)}} if finished else {"running": {"startedAt": _at(STARTED)}})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE, "labels": {"sat.ai/node-rank": "0", **(labels or {})},
                     "annotations": dict(annotations or {})},
        "spec": {"nodeName": NODE, "containers": [{"name": "base", "image": "registry.example.com/ml/train:1"}]},
        "status": {"phase": "Failed" if finished else "Running", "startTime": _at(STARTED),
                   "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _at(STARTED)}],
                   "containerStatuses": [{"name": "base", "ready": False, "restartCount": 0, "image": "x",
                                          "imageID": "", "state": state}]},
    }


def _node(labels: dict | None = None, claim: str | None = CLAIM) -> dict:
    owners = [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim, "uid": "5e1f",
               "blockOwnerDeletion": True}] if claim else []
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": dict(SPOT_LABELS if labels is None else labels),
                         "ownerReferences": owners},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


_SEQ = iter(range(10**6))


def _event(kind: str, name: str, reason: str, at: datetime, *, namespace: str = "default", component: str = "kubelet",
           message: str = "", type_: str = "Normal") -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{next(_SEQ):x}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": "" if namespace == "default" else namespace},
            "reason": reason, "message": message or reason, "type": type_,
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": _at(at), "lastTimestamp": _at(at), "count": 1}


def _rank_record(cluster: RecordedCluster, pod: dict, said: list[str] | None = None):
    log = said.append if said is not None else (lambda _m: None)
    return k8s_records._read_rank(cluster.client(), pod, _job(), 1, NAMESPACE, None, log)[0]


def _reasons(record) -> list[str]:
    return [e["reason"] for e in record.events]


# ---- events in the attempt's window -------------------------------------------------------------
def test_node_events_are_read_within_the_attempt_window_only():
    pod = _pod()
    inside = [
        _event("Node", NODE, "XidBefore", STARTED - WINDOW_BEFORE + timedelta(seconds=5), component="nvidia-dcgm"),
        _event("Node", NODE, "NodeNotReady", FINISHED + timedelta(seconds=40), component="node-controller"),
        _event("Node", NODE, "RemovingNode", FINISHED + WINDOW_AFTER - timedelta(seconds=5),
               component="node-controller"),
    ]
    outside = [
        _event("Node", NODE, "StaleXid", STARTED - timedelta(hours=20), component="nvidia-dcgm"),
        _event("Node", NODE, "NextWorkloadXid", FINISHED + WINDOW_AFTER + timedelta(minutes=1),
               component="nvidia-dcgm"),
        _event("Node", "another-node", "Rebooted", STARTED + timedelta(minutes=5)),
    ]
    cluster = RecordedCluster(pods=[pod], nodes=[_node(claim=None)], events=inside + outside)
    record = _rank_record(cluster, pod)
    assert _reasons(record) == ["XidBefore", "NodeNotReady", "RemovingNode"]
    gets = [(path, query) for method, path, query, _ in cluster.requests if method == "GET"]
    assert ("/api/v1/namespaces/default/events",
            {"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={NODE}"}) in gets


def test_a_running_pod_has_no_end_to_its_window_and_its_own_events_are_all_read():
    pod = _pod(finished=None)
    events = [_event("Pod", POD, "Scheduled", STARTED - timedelta(hours=3), namespace=NAMESPACE,
                     component="default-scheduler"),
              _event("Node", NODE, "NodeNotReady", STARTED + timedelta(days=2), component="node-controller")]
    cluster = RecordedCluster(pods=[pod], nodes=[_node(claim=None)], events=events)
    assert _reasons(_rank_record(cluster, pod)) == ["Scheduled", "NodeNotReady"]


def test_kueue_and_karpenter_events_reach_the_record():
    pod = _pod(labels={"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/managed": "true"})
    pod["status"]["conditions"].append({"type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue",
                                        "message": "Preempted to accommodate a workload", "lastTransitionTime":
                                            _at(FINISHED - timedelta(seconds=30))})
    workload = f"pod-{POD}-5b2e1"
    events = [
        _event("Pod", POD, "Evicted", FINISHED - timedelta(seconds=40), namespace=NAMESPACE, component="karpenter",
               message="Evicted pod: Disrupting Node: Underutilized/Delete"),
        _event("Workload", workload, "Preempted", FINISHED - timedelta(seconds=31), namespace=NAMESPACE,
               component="kueue-admission", message="Preempted to accommodate a workload (UID: 9f3a) due to "
                                                    "prioritization in the ClusterQueue"),
        _event("Workload", "pod-another-pod-0c1d2", "Preempted", FINISHED - timedelta(seconds=31),
               namespace=NAMESPACE, component="kueue-admission"),
        _event("Node", NODE, "DisruptionTerminating", FINISHED - timedelta(seconds=45), component="karpenter",
               message="Disrupting Node: Underutilized/Delete"),
        _event("NodeClaim", CLAIM, "DisruptionTerminating", FINISHED - timedelta(seconds=45), component="karpenter",
               message="Disrupting NodeClaim: Underutilized/Delete"),
    ]
    node = _node()
    node["spec"]["taints"] = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    cluster = RecordedCluster(pods=[pod], nodes=[node], events=events)
    record = _rank_record(cluster, pod)
    by_kind = [(e["involvedObject"]["kind"], e["reason"], e["source"]["component"]) for e in record.events]
    assert by_kind == [("Pod", "Evicted", "karpenter"), ("Node", "DisruptionTerminating", "karpenter"),
                       ("NodeClaim", "DisruptionTerminating", "karpenter"),
                       ("Workload", "Preempted", "kueue-admission")]
    assert record.events[-1]["involvedObject"]["name"] == workload  # not the other pod's Workload
    assert {c["type"] for c in record.pod_conditions} == {"PodScheduled", "TerminationTarget"}
    assert record.node_taints[0]["key"] == "karpenter.sh/disrupted"
    gets = [query.get("fieldSelector") for method, path, query, _ in cluster.requests if path.endswith("/events")]
    assert f"involvedObject.kind=NodeClaim,involvedObject.name={CLAIM}" in gets
    assert "involvedObject.kind=Workload" in gets


@pytest.mark.parametrize("labels, selector", [
    pytest.param({"kueue.x-k8s.io/pod-group-name": "sat-train-1a2b3c4d-a1"},
                 "involvedObject.kind=Workload,involvedObject.name=sat-train-1a2b3c4d-a1", id="pod-group"),
    pytest.param({"kueue.x-k8s.io/workload-name": "wl-7"}, "involvedObject.kind=Workload,involvedObject.name=wl-7",
                 id="named"),
    pytest.param({}, None, id="not-kueue"),
])
def test_which_workload_events_are_asked_for(labels, selector):
    pod = _pod(labels=labels)
    cluster = RecordedCluster(pods=[pod], nodes=[_node(claim=None)])
    _rank_record(cluster, pod)
    asked = [query.get("fieldSelector", "") for _m, path, query, _b in cluster.requests if path.endswith("/events")]
    workload = [s for s in asked if "Workload" in s]
    assert workload == ([selector] if selector else [])


def test_events_are_bounded_per_object_keeping_the_newest():
    pod = _pod()
    many = [_event("Node", NODE, f"Npd{i}", STARTED + timedelta(seconds=i), component="node-problem-detector")
            for i in range(evidence.MAX_EVENTS_PER_OBJECT + 30)]
    cluster = RecordedCluster(pods=[pod], nodes=[_node(claim=None)], events=many)
    said: list[str] = []
    record = _rank_record(cluster, pod, said)
    assert len(record.events) == evidence.MAX_EVENTS_PER_OBJECT
    assert record.events[0]["reason"] == "Npd30" and record.events[-1]["reason"] == f"Npd{len(many) - 1}"
    assert f"node {NODE}: {len(many)} events, kept the newest {evidence.MAX_EVENTS_PER_OBJECT} " \
           "(MAX_EVENTS_PER_OBJECT)" in said


# ---- the node's labels at start -----------------------------------------------------------------
def test_node_labels_captured_at_start_are_kept_when_the_node_is_deleted():
    pod = _pod(exit_code=0, finished=None)
    pod["spec"]["nodeName"] = NODE
    cluster = RecordedCluster(pods=[pod], nodes=[_node()])
    said: list[str] = []
    assert evidence.record_node_at_start(cluster.client(), NAMESPACE, POD, said.append) == SPOT_LABELS
    annotations = cluster.pods[0]["metadata"]["annotations"]
    assert json.loads(annotations[NODE_LABELS_AT_START_ANNOTATION]) == SPOT_LABELS
    assert annotations[NODECLAIM_AT_START_ANNOTATION] == CLAIM
    assert said == [f"pod {POD} runs on node {NODE}: kept its {len(SPOT_LABELS)} labels and its NodeClaim {CLAIM}"]

    # A Spot shutdown: the pod lost its node, the Node object is gone; its NodeClaim's events remain.
    cluster.nodes.clear()
    ended = cluster.pods[0]
    ended["status"]["phase"] = "Running"
    ended["status"]["conditions"].append({"type": "Ready", "status": "False", "reason": "NodeNotReady",
                                          "lastTransitionTime": _at(STARTED + timedelta(minutes=50))})
    cluster.events.append(_event("NodeClaim", CLAIM, "DisruptionTerminating", STARTED + timedelta(minutes=49),
                                 component="karpenter", message="Disrupting NodeClaim: Interruption"))
    cluster.events.append(_event("Node", NODE, "NodeNotReady", STARTED + timedelta(minutes=50),
                                 component="node-controller", message=f"Node {NODE} status is now: NodeNotReady"))
    said.clear()
    record = _rank_record(cluster, ended, said)
    assert record.node_labels == {} and record.node_labels_at_start == SPOT_LABELS
    assert _reasons(record) == ["NodeNotReady", "DisruptionTerminating"]  # by object: the node, its NodeClaim
    assert any("no longer exists" in line for line in said)
    # Stored with the record (what the classify task reads back), and read as Spot capacity.
    assert type(record).model_validate(record.model_dump(mode="json")).node_labels_at_start == SPOT_LABELS
    assert classify(record).kind is VerdictKind.PREEMPTED
    # Without Karpenter's word, the labels kept at start alone tell a Spot reclaim from a node fault.
    node_only = record.model_copy(update={"events": [e for e in record.events
                                                     if e["involvedObject"]["kind"] == "Node"]})
    assert classify(node_only).kind is VerdictKind.PREEMPTED
    assert classify(node_only.model_copy(update={"node_labels_at_start": {}})).kind is VerdictKind.HARDWARE


def test_labels_are_captured_once_and_not_before_the_pod_has_a_node():
    pending = _pod(finished=None)
    del pending["spec"]["nodeName"]
    cluster = RecordedCluster(pods=[pending], nodes=[_node()])
    assert evidence.record_node_at_start(cluster.client(), NAMESPACE, POD, lambda _m: None) is None
    assert NODE_LABELS_AT_START_ANNOTATION not in cluster.pods[0]["metadata"]["annotations"]

    cluster.pods[0]["spec"]["nodeName"] = NODE
    assert evidence.record_node_at_start(cluster.client(), NAMESPACE, POD, lambda _m: None) == SPOT_LABELS
    cluster.nodes[0]["metadata"]["labels"]["karpenter.sh/capacity-type"] = "on-demand"  # relabelled later
    assert evidence.record_node_at_start(cluster.client(), NAMESPACE, POD, lambda _m: None) == SPOT_LABELS
    assert [m for m, *_ in cluster.requests].count("PATCH") == 1


def test_labels_that_cannot_be_kept_never_fail_the_launch(monkeypatch):
    pod = _pod(finished=None)
    cluster = RecordedCluster(pods=[pod], nodes=[_node()])
    client = cluster.client()

    def forbidden(*_a, **_k):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(client, "patch_namespaced_pod", forbidden)
    said: list[str] = []
    assert evidence.record_node_at_start(client, NAMESPACE, POD, said.append) == SPOT_LABELS
    assert said and "could not keep the labels" in said[0] and "403" in said[0]
    cluster.nodes.clear()
    said.clear()
    assert evidence.record_node_at_start(client, NAMESPACE, POD, said.append) is None
    assert said == [f"node {NODE}: not readable (404 Not Found); it no longer exists"]
    assert evidence.record_node_at_start(client, NAMESPACE, "no-such-pod", said.append) is None


@pytest.mark.parametrize("fails", [pytest.param(False, id="started"), pytest.param(True, id="did-not-start")])
def test_launch_keeps_the_node_labels_once_the_pod_started(monkeypatch, fails):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from sat_tasks.backends.kubernetes.operator import SatTrainingPodOperator

    cluster = RecordedCluster(pods=[_pod(finished=None)], nodes=[_node()])
    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(lambda self: cluster.client()))

    def provider_wait(self, pod):
        if fails:
            raise RuntimeError("Pod took too long to start")

    monkeypatch.setattr(KubernetesPodOperator, "await_pod_start", provider_wait)
    operator = SatTrainingPodOperator(attempt=1, previous_decide_task_id=None, namespace=NAMESPACE)
    pod = V1Pod(metadata=V1ObjectMeta(name=POD, namespace=NAMESPACE))
    if fails:
        with pytest.raises(RuntimeError, match="too long"):
            operator.await_pod_start(pod)
    else:
        operator.await_pod_start(pod)
    kept = cluster.pods[0]["metadata"]["annotations"][NODE_LABELS_AT_START_ANNOTATION]
    assert json.loads(kept) == SPOT_LABELS
