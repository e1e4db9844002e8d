"""Who ended the process, decided before any text is read (issue 43 item 1, ADR 0004).

Every reclaimer is a family, not a list: a controller nobody listed (its own DisruptionTarget
reason, its own event wording, its managedFields manager) is still a controller, and an
interruption from outside with no evidence of a fault is PREEMPTED, "interrupted:", with no
ledger entry. A lost node is HARDWARE only when it was not reclaimed.
"""

from __future__ import annotations

import json

import pytest

from sat_tasks.classify import (
    VerdictKind,
    classify,
    explain,
    node_evidence,
    record_from_pod,
)
from sat_tasks.classify.ended import Ender, who_ended
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.node_health import diagnose, fault_events, suspect_node

PRE, HW, INT = VerdictKind.PREEMPTED, VerdictKind.HARDWARE, VerdictKind.INTERNAL
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def record(**fields) -> AttemptRecord:
    return AttemptRecord(**{"job": "j", "attempt": 1, "backend": "kubernetes", "node": "gpu-1", **fields})


def event(reason: str, message: str, component: str = "", kind: str = "Pod") -> dict:
    found = {"type": "Normal", "reason": reason, "message": message,
             "involvedObject": {"kind": kind, "name": "gpu-1" if kind == "Node" else "train-0"}}
    if component:
        found["source"] = {"component": component}
    return found


def disruption(reason: str, message: str = "") -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}


NOT_READY = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]


# ---- a controller through the API: any controller, any wording ---------------------------------
@pytest.mark.parametrize("fields", [
    # cluster-autoscaler's scale-down: its own event on the pod, the pod deleted
    pytest.param({"events": [event("ScaleDown", "deleting pod for node scale down", "cluster-autoscaler")],
                  "end_facts": {"deletion_timestamp": "2026-01-01T00:00:00Z"}}, id="cluster-autoscaler"),
    # the descheduler: eviction API and its own event
    pytest.param({"pod_conditions": [disruption("EvictionByEvictionAPI", "Eviction API: evicting")],
                  "events": [event("Descheduled", "pod evicted from gpu-1 node by sigs.k8s.io/descheduler",
                                   "sigs.k8s.io/descheduler")]}, id="descheduler"),
    # a batch scheduler's preemption (Volcano's wording)
    pytest.param({"events": [event("Evict", "Pod is evicted, because of preempt", "volcano")]},
                 id="batch-scheduler-preempt"),
    # a controller's own DisruptionTarget reason that nobody listed
    pytest.param({"pod_conditions": [disruption("TerminationByRayAutoscaler", "worker group scaled in")]},
                 id="unlisted-disruption-reason"),
    # a deletion by a manager that wrote the disruption (managedFields), nothing else
    pytest.param({"end_facts": {"deletion_timestamp": "2026-01-01T00:00:00Z",
                                "managers": [{"manager": "kubelet", "operation": "Update", "disruption": False},
                                             {"manager": "tpu-reclaimer", "operation": "Update", "disruption": True}]}},
                 id="managed-fields-manager"),
    # a bare deletion through the API
    pytest.param({"end_facts": {"deletion_timestamp": "2026-01-01T00:00:00Z"}}, id="bare-deletion"),
])
@pytest.mark.parametrize("exit_code", [143, 137, None])
def test_a_controller_interruption_with_no_fault_is_resumed_without_blame(fields, exit_code):
    rec = record(exit_code=exit_code, **fields)
    who = who_ended(rec)
    assert who.who is Ender.CONTROLLER and who.outside, who
    verdict = classify(rec)
    assert verdict.kind is PRE and verdict.reason.startswith("interrupted:"), verdict
    # no failover, no ledger entry: the relocation and the ledger see nothing to record
    diagnosis = diagnose(suspect_node(verdict), [], [], job="j", run_id="r")
    assert diagnosis.verdict.kind is PRE and fault_events(diagnosis, job="j", run_id="r", now=1.0) == []


def test_the_controllers_own_event_names_it():
    rec = record(exit_code=143, pod_conditions=[disruption("EvictionByEvictionAPI")],
                 events=[event("Descheduled", "pod evicted from gpu-1 node by sigs.k8s.io/descheduler",
                               "sigs.k8s.io/descheduler")])
    assert "sigs.k8s.io/descheduler" in who_ended(rec).by and "sigs.k8s.io/descheduler" in classify(rec).reason


def test_the_managed_fields_manager_is_named():
    rec = record(exit_code=143, end_facts={"deletion_timestamp": "2026-01-01T00:00:00Z",
                                           "managers": [{"manager": "tpu-reclaimer", "disruption": True}]})
    assert "tpu-reclaimer" in who_ended(rec).by and "tpu-reclaimer" in classify(rec).reason


@pytest.mark.parametrize(("fields", "kind"), [
    # the process ended itself before (or regardless of) the controller: its own status decides
    pytest.param({"exit_code": 1, "log_tail": ["Traceback (most recent call last):", "KeyError: 'x'"],
                  "pod_conditions": [disruption("EvictionByEvictionAPI")]}, INT, id="own-exit-first"),
    # a device fault beside the interruption: the fault decides
    pytest.param({"exit_code": 143, "node_log": [XID79], "pod_conditions": [disruption("EvictionByEvictionAPI")]},
                 HW, id="device-fault-first"),
    # the controller acted because the node was broken (node repair): the node's fault
    pytest.param({"exit_code": 143, "events": [event("Evicted", "node repair: node is unhealthy", "node-repairer")]},
                 HW, id="controller-on-a-node-fault"),
    # a clean exit after a controller's condition is a completion
    pytest.param({"exit_code": 0, "pod_conditions": [disruption("EvictionByEvictionAPI")]},
                 VerdictKind.SUCCEEDED, id="clean-exit"),
    # near-misses: what failed to happen, the kubelet's Killing, the scheduler's placement
    pytest.param({"exit_code": 1, "events": [event("ScaleDownFailed", "failed to delete node", "cluster-autoscaler")]},
                 INT, id="near-miss-scale-down-failed"),
    pytest.param({"exit_code": 1, "events": [event("Scheduled", "Successfully assigned", "default-scheduler")]},
                 INT, id="near-miss-scheduled"),
    pytest.param({"exit_code": 1, "events": [event("Killing", "Stopping container base", "kubelet")]},
                 INT, id="near-miss-kubelet-killing"),
])
def test_near_misses_of_the_controller_family(fields, kind):
    assert classify(record(**fields)).kind is kind


def test_an_unnamed_component_or_the_kubelet_is_not_a_controller():
    rec = record(exit_code=137, events=[event("Killing", "Stopping container base")])
    assert who_ended(rec).who is Ender.OUTSIDE
    rec = record(exit_code=137, events=[event("Evicted", "The node was low on resource: memory.", "kubelet")])
    assert who_ended(rec).who is not Ender.CONTROLLER


# ---- the kubelet or the runtime -----------------------------------------------------------------
@pytest.mark.parametrize(("fields", "kind"), [
    pytest.param({"exit_code": 137, "termination_reason": "OOMKilled"}, INT, id="oom-kill"),
    pytest.param({"exit_code": 137, "termination_reason": "Evicted",
                  "termination_message": "The node was low on resource: memory."}, HW, id="pressure-eviction"),
    pytest.param({"exit_code": 143, "pod_conditions": [disruption("TerminationByKubelet",
                                                                  "The node was low on resource: memory.")]},
                 HW, id="pressure-disruption"),
])
def test_the_kubelet_or_the_runtime(fields, kind):
    rec = record(**fields)
    assert who_ended(rec).who is Ender.RUNTIME
    assert classify(rec).kind is kind


# ---- the node: HARDWARE unless it was reclaimed ----------------------------------------------------
def test_a_lost_node_is_hardware_when_it_was_not_reclaimed():
    rec = record(exit_code=None, node_conditions=NOT_READY, node_labels={"pool": "gpu"})
    assert who_ended(rec).who is Ender.NODE and who_ended(rec).reclaimed is None
    assert classify(rec).kind is HW
    gone = record(exit_code=None, node_labels_at_start={"eks.amazonaws.com/capacityType": "ON_DEMAND"})
    assert who_ended(gone).who is Ender.NODE
    assert classify(gone).kind is HW


@pytest.mark.parametrize("fields", [
    # the autoscaler took the node away: its event on the Node
    pytest.param({"node_conditions": NOT_READY, "events": [event(
        "ScaleDown", "node removed by cluster autoscaler", "cluster-autoscaler", kind="Node")]}, id="autoscaler-event"),
    # ...or its taint on the node
    pytest.param({"node_conditions": NOT_READY, "node_taints": [
        {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}]},
        id="autoscaler-taint"),
    # a Spot node gone: its labels at the start say so
    pytest.param({"node_labels_at_start": {"cloud.google.com/gke-spot": "true"}}, id="spot-gone"),
])
def test_a_reclaimed_node_is_an_interruption(fields):
    rec = record(exit_code=None, **fields)
    who = who_ended(rec)
    assert who.who in (Ender.NODE, Ender.CONTROLLER) and who.reclaimed, who
    verdict = classify(rec)
    assert verdict.kind is PRE, verdict


def test_a_reclaimed_node_with_a_device_fault_is_hardware():
    rec = record(exit_code=None, node_log=[XID79], node_labels_at_start={"cloud.google.com/gke-spot": "true"})
    assert classify(rec).kind is HW


# ---- something outside, unnamed ----------------------------------------------------------------
@pytest.mark.parametrize("fields", [{"exit_code": 143}, {"exit_code": 137, "signal": 9}, {"exit_code": -15},
                                    {"exit_code": None}])
def test_an_unnamed_outside_kill_with_no_evidence_is_an_interruption(fields):
    verdict = classify(record(**fields))
    assert verdict.kind is PRE and verdict.reason.startswith("interrupted:")


def test_a_record_whose_backend_says_the_node_is_not_gone_is_not_a_lost_node():
    # The local backend never records the node's labels at the end (AttemptRecord.node_labels): its labels at the
    # start beside none at the end say nothing of the node being gone, and its runner says so (`end_facts.node_gone:
    # False`). Found by the outside-SIGTERM rehearsal (tests/e2e/test_rehearsals.py): it was HARDWARE with "the Node
    # object was gone" against a healthy node.
    local = {"backend": "local", "node": "local-node-0", "exit_code": 143,
             "log_tail": ["SIGTERM: final checkpoint at step 8"], "end_facts": {"node_gone": False},
             "node_labels_at_start": {"sat.local/node": "local-node-0", "sat.local/capacity-type": "on-demand"}}
    rec = record(**local)
    assert who_ended(rec).who is Ender.OUTSIDE
    verdict = classify(rec)
    assert verdict.kind is PRE and verdict.reason.startswith("interrupted:"), verdict
    assert node_evidence(rec) == []
    # the local node-loss fault still says so through the node's Ready condition
    lost = record(**{**local, "exit_code": 137, "signal": 9}, node_conditions=NOT_READY)
    assert who_ended(lost).who is Ender.NODE and classify(lost).kind is HW
    # and a record with the same fields whose backend said nothing of the node is still a node gone (nothing was
    # read of it at the end: the Kubernetes backend's when the Node object could not be read)
    assert who_ended(record(**{**local, "backend": "kubernetes", "end_facts": {}})).who is Ender.NODE


def test_an_unnamed_outside_kill_after_the_jobs_own_error_is_the_jobs():
    oom = "Memory cgroup out of memory: Killed process 4242 (python)"
    assert classify(record(exit_code=137, node_log=[oom])).kind is INT


def test_the_process_itself():
    for code in (1, 2, 139):
        assert who_ended(record(exit_code=code)).who is Ender.PROCESS


# ---- the record, the pod and --explain ----------------------------------------------------------
def test_old_records_without_end_facts_still_load():
    data = record(exit_code=1).model_dump(mode="json")
    data.pop("end_facts")
    assert AttemptRecord.model_validate(data).end_facts == {}
    assert AttemptRecord.model_validate_json(json.dumps(data)).end_facts == {}


def test_record_from_pod_keeps_the_deletion_and_the_managers():
    pod = {"metadata": {"name": "train-0", "deletionTimestamp": "2026-01-01T00:00:00Z",
                        "deletionGracePeriodSeconds": 30,
                        "managedFields": [
                            {"manager": "kubelet", "operation": "Update", "subresource": "status",
                             "fieldsV1": {"f:status": {"f:phase": {}}}},
                            {"manager": "my-queue-controller", "operation": "Update", "subresource": "status",
                             "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"DisruptionTarget"}': {}}}}}]},
           "spec": {"nodeName": "gpu-1"},
           "status": {"containerStatuses": [{"name": "base", "state": {"terminated": {"exitCode": 143}}}]}}
    rec = record_from_pod(pod, job="j", attempt=1)
    assert rec.end_facts["deletion_timestamp"] == "2026-01-01T00:00:00Z"
    assert [m["manager"] for m in rec.end_facts["managers"] if m["disruption"]] == ["my-queue-controller"]
    verdict = classify(rec)
    assert verdict.kind is PRE and "my-queue-controller" in verdict.reason


def test_explain_decides_who_first():
    why = explain(record(exit_code=143, pod_conditions=[disruption("EvictionByEvictionAPI")]))
    assert why.steps[0][0] == "0 who ended it" and "a controller through the API" in why.steps[0][1]
    assert why.who is not None and why.who.who is Ender.CONTROLLER


def test_teardown_network_noise_does_not_turn_a_controllers_interruption_into_a_fault():
    noise = "host:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.3.23<44321> with status=12"
    rec = record(exit_code=143, log_tail=[noise], pod_conditions=[disruption("PreemptionByKueue")])
    assert classify(rec).kind is PRE
    # ...but an unnamed kill beside a network error is not called an interruption
    assert classify(record(exit_code=143, log_tail=[noise])).kind is HW


# ---- every public preemption reaches PREEMPTED by who ended it, not by a named reason alone --------------------
def _preempted_real_world():
    from tests.sat_tasks.classify.test_real_world import CASES, load_case

    for path in CASES:
        case = load_case(path)
        if case["expected"]["kind"] == "PREEMPTED":
            yield pytest.param(case, id=path.stem)


@pytest.mark.parametrize("case", list(_preempted_real_world()))
def test_every_public_preemption_is_an_interruption_by_who_ended_it(case, monkeypatch: pytest.MonkeyPatch):
    """Whatever named rule also fires (a Spot event, Kueue's condition, a shutdown message), who ended the process
    alone says it was interrupted from outside and not for a fault of the node: an autoscaler, a descheduler, a
    batch scheduler, a Ray or TPU reclaim, a provider's notice in its own words -- so one nobody listed still is."""
    from tests.sat_tasks.classify.test_real_world import record_of

    for key, value in (case.get("config") or {}).items():
        monkeypatch.setenv(f"AIRFLOW__SAT__{key.upper()}", value)
    who = who_ended(record_of(case))
    assert who.outside and not who.node_fault, who
    assert who.who in (Ender.CONTROLLER, Ender.OUTSIDE) or (who.who is Ender.NODE and who.reclaimed), who


@pytest.mark.parametrize("events", [
    # the scheduler could not preempt: nobody was preempted
    pytest.param([event("FailedScheduling", "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: "
                        "0/4 nodes are available: 4 No preemption victims found for incoming pod.",
                        "default-scheduler")], id="failed-scheduling-preemption"),
    # the descheduler's refused eviction
    pytest.param([event("EvictionFailed", "pod eviction from gpu-1 node by sigs.k8s.io/descheduler failed: Cannot "
                        "evict pod as it would violate the pod's disruption budget.", "sigs.k8s.io/descheduler")],
                 id="eviction-failed"),
    # Volcano's wording without a source, but the job exited on its own
    pytest.param([event("Evict", "Pod is evicted, because of preempt")], id="volcano-evict-own-exit"),
])
def test_a_preemption_word_in_an_event_does_not_make_the_processs_own_exit_an_interruption(events):
    rec = record(exit_code=1, events=events, log_tail=["Traceback (most recent call last):", "ValueError: bad"])
    assert who_ended(rec).who is Ender.PROCESS
    assert classify(rec).kind is INT


@pytest.mark.parametrize("line", [
    "job preempted by the scheduler, requeueing",
    ("WARNING 03-14 10:12:41 scheduler.py:1057] Sequence group 12 is preempted by PreemptionMode.RECOMPUTE mode "
     "because there is not enough KV cache space."),
    "Spot interruption notice received; saving a checkpoint",
])
def test_a_job_that_prints_preempted_and_exits_1_stays_internal(line):
    rec = record(exit_code=1, log_tail=[line, "Traceback (most recent call last):", "RuntimeError: bad state"])
    assert who_ended(rec).who is Ender.PROCESS
    verdict = classify(rec)
    assert verdict.kind is INT, verdict
