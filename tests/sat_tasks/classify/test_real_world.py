"""The classifier on failures that people posted in public threads (tests/sat_tasks/fixtures/real_world).

Each YAML file is one case: the source URL, the thread's conclusion and which pod fields the
case implies are in its header comment; `expected` is what the thread concluded, in SAT's
verdict kinds. `ranks` holds one pod per node rank (combined as the Kubernetes backend does).
`record` holds attempt-record fields the pod cannot carry (e.g. `node_labels_at_start`, which the
launcher reads when the attempt starts).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sat_tasks.classify import (
    VerdictKind,
    classify,
    combine_rank_records,
    record_from_pod,
)
from sat_tasks.core.attempt import AttemptRecord
from tests.support.paths import SAT_FIXTURES

REAL_WORLD = SAT_FIXTURES / "real_world"
CASES = sorted(REAL_WORLD.glob("*.yaml"))
KINDS_OF_EVIDENCE = {
    "nvidia-runtime", "gpu-unusable", "eviction", "spot", "multi-rank", "exception-lines", "ambiguous", "xid",
    "infiniband", "oom", "image", "deadline", "node-notready",
    # issue 27: rule families, and the near-misses that must not match them
    "cuda-error", "kernel-log", "collective", "preemption-source", "near-miss",
}
XIDS_REQUIRED = {13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 74, 79, 92, 94, 95, 119, 120}


def load_case(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def record_of(case: dict[str, Any]) -> AttemptRecord:
    def one(part: dict[str, Any]) -> AttemptRecord:
        return record_from_pod(part["pod"], job="real-world", attempt=1, log=part.get("log"),
                               node_log=part.get("node_log"), events=part.get("events"), node=part.get("node"))

    if "ranks" in case:
        return combine_rank_records([one(rank) for rank in case["ranks"]], log=lambda _line: None)
    return one(case).model_copy(update=case.get("record") or {})


@pytest.mark.parametrize("path", [pytest.param(path, id=path.stem) for path in CASES])
def test_real_world_case(path: Path, monkeypatch: pytest.MonkeyPatch):
    case = load_case(path)
    for key, value in (case.get("config") or {}).items():
        monkeypatch.setenv(f"AIRFLOW__SAT__{key.upper()}", value)
    expected = case["expected"]
    verdict = classify(record_of(case))
    assert verdict.kind is VerdictKind(expected["kind"]), verdict
    joined = "\n".join([*verdict.evidence, verdict.reason])
    for needle in expected["evidence_contains"]:
        assert needle in joined, f"{needle!r} not in {verdict}"
    assert verdict.reason.startswith("ambiguous") is expected["ambiguous"], verdict.reason


def test_real_world_cases_cover_every_kind_of_evidence_and_the_xid_table():
    cases = [load_case(path) for path in CASES]
    assert len(cases) >= 40
    assert {case["kind_of_evidence"] for case in cases} == KINDS_OF_EVIDENCE
    xids = {int(match) for path in CASES for match in re.findall(r"Xid \([^)]*\): (\d+)", path.read_text())}
    assert XIDS_REQUIRED <= xids
    for path in CASES:
        header = path.read_text().splitlines()[:3]
        assert header[0].startswith("# Source: http") and header[1].startswith("# Conclusion: "), path.name
        assert header[2].startswith("# Pod fields filled"), path.name


@pytest.mark.parametrize("path", [pytest.param(path, id=path.stem) for path in CASES
                                  if load_case(path)["kind_of_evidence"] == "spot"])
def test_spot_cases_carry_node_labels_and_only_real_taints(path: Path):
    """The node's labels are `node_labels`; `node_taints` holds the node's taints, plus (with a
    `source`) only the Spot labels the pod's own nodeSelector/affinity asked for."""
    case = load_case(path)
    node = case.get("node") or {}
    record = record_of(case)
    assert record.node_labels == (node.get("metadata") or {}).get("labels", {})
    real = [taint for taint in record.node_taints if "source" not in taint]
    assert real == (node.get("spec") or {}).get("taints", [])
    spec = case["pod"].get("spec") or {}
    assert {t["source"] for t in record.node_taints if "source" in t} <= (
        {"pod nodeSelector"} if spec.get("nodeSelector") else set()) | (
        {"pod node affinity"} if spec.get("affinity") else set())


def test_spot_capacity_alone_is_not_a_preemption_but_a_lost_spot_node_is():
    node = {"metadata": {"name": "n", "labels": {"karpenter.sh/capacity-type": "spot"}}}
    lost = {"status": {"reason": "NodeLost", "message": "node n which was running pod train-0 is unresponsive"}}
    assert classify(record_from_pod(lost, job="j", attempt=1, node=node)).kind is VerdictKind.PREEMPTED
    assert classify(record_from_pod(lost, job="j", attempt=1)).kind is VerdictKind.HARDWARE
    xid79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    lost_with_xid = record_from_pod(lost, job="j", attempt=1, node=node, node_log=[xid79])
    assert classify(lost_with_xid).kind is VerdictKind.HARDWARE  # a device failed first
    ok = {"status": {"containerStatuses": [{"name": "base", "state": {"terminated": {"exitCode": 0}}}]}}
    assert classify(record_from_pod(ok, job="j", attempt=1, node=node)).kind is VerdictKind.SUCCEEDED


def test_on_prem_spot_pool_comes_from_the_sat_config(monkeypatch: pytest.MonkeyPatch):
    pod = {"spec": {"nodeName": "n"}, "status": {"containerStatuses": [{"name": "base", "state": {"running": {}}}]}}
    node = {"metadata": {"name": "n", "labels": {"pool": "preemptible"}},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    monkeypatch.delenv("AIRFLOW__SAT__SPOT_NODE_LABELS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONFIG", "/nonexistent/airflow.cfg")
    assert classify(record_from_pod(pod, job="j", attempt=1, node=node)).kind is VerdictKind.HARDWARE
    monkeypatch.setenv("AIRFLOW__SAT__SPOT_NODE_LABELS", "other=x, pool=preemptible")
    assert classify(record_from_pod(pod, job="j", attempt=1, node=node)).kind is VerdictKind.PREEMPTED
    monkeypatch.setenv("AIRFLOW__SAT__SPOT_NODE_LABELS", "pool")  # a key alone: any value
    assert classify(record_from_pod(pod, job="j", attempt=1, node=node)).kind is VerdictKind.PREEMPTED
