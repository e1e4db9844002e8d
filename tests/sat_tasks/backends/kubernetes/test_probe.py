"""The suspect node's health check on a cluster: a probe pod bound to the node (ADR 0004, issue 43 item 3).

Through the real client against the in-memory API server (tests.support.k8s_api): the pod that is
created, what its printed result decides, and that it is deleted whatever happened. One kubelet
runs the pod's own command on this host (`python -m sat_tasks.io.node_probe NODE`), so the reader
parses what the command really prints.
"""

from __future__ import annotations

import pytest

from sat_tasks.backends.kubernetes.probe import (
    PROBE_COMPONENT,
    build_probe_pod,
    probe_node,
)
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.backends.kubernetes.staging import HelperPodFailed
from sat_tasks.core.health_check import Check, CheckStatus, Health, ProbeResult
from sat_tasks.spec import parse_spec
from tests.support.k8s_api import RecordedCluster, run_pod_here
from tests.support.pod_security import violations

NAMESPACE = "sat-jobs"
RUN_ID = "manual__2026-12-07T09:00:00+00:00"
SETTINGS = KubernetesSettings()
JOB = parse_spec({
    "name": "probe-job", "nodes": 2, "job_failover": True, "backend": "kubernetes",
    "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "512Gi", "shared_memory": "64Gi"},
    "image": {"url": "registry.example.com/team/train:1.0"}, "data": {"source": "s3://sat-probe/data/"},
    "results": {"destination": "s3://sat-probe/results/"}, "command": "python train.py",
})


def _result(node: str, status: CheckStatus) -> str:
    check = Check(name="ecc:gpu3", status=status, detail="2 uncorrectable ECC error(s) since the driver loaded")
    return ProbeResult(node=node, at=1.0, probe="nvml", checks=[check]).model_dump_json()


def _probe(cluster: RecordedCluster, node: str = "gpu-7", **kwargs) -> ProbeResult:
    return probe_node(JOB, RUN_ID, node, client=cluster.client(), namespace=NAMESPACE, settings=SETTINGS,
                      log=lambda line: None, poll_seconds=0.01, **kwargs)


def test_the_probe_pod_is_bound_to_the_node_asks_for_no_gpu_and_is_restricted():
    pod = build_probe_pod(JOB, RUN_ID, "gpu-7", namespace=NAMESPACE, settings=SETTINGS)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert spec["nodeName"] == "gpu-7"  # no scheduling: it runs on the node even once SAT cordoned it
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert container["command"] == ["python", "-m", "sat_tasks.io.node_probe", "gpu-7"]
    assert container["image"] == SETTINGS.staging_image
    assert "nvidia.com/gpu" not in str(container["resources"])  # the failed attempt's pods may hold the GPUs
    assert violations(pod, "restricted") == []
    assert spec["automountServiceAccountToken"] is False and "volumes" not in spec
    assert not any("valueFrom" in e for e in container["env"])  # no Secret of any kind
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == PROBE_COMPONENT


@pytest.mark.parametrize(("exit_code", "status", "health"), [
    pytest.param(1, CheckStatus.FAIL, Health.FAULTY, id="a-failed-check-exits-1-and-is-an-answer"),
    pytest.param(0, CheckStatus.PASS, Health.HEALTHY, id="healthy"),
])
def test_what_the_pod_printed_is_the_result_and_the_pod_is_deleted(exit_code, status, health):
    cluster = RecordedCluster(kubelet=lambda pod: (exit_code, "probing...\n" + _result("gpu-7", status) + "\n"))
    result = _probe(cluster)
    assert result.health is health and result.node == "gpu-7"
    created = [body for kind, body in cluster.created if kind == "Pod"]
    assert [p["spec"]["nodeName"] for p in created] == ["gpu-7"]
    assert cluster.pods == []  # deleted after it was read


def test_a_pod_without_a_result_raises_and_is_deleted():
    cluster = RecordedCluster(kubelet=lambda pod: (1, "Traceback: ImportError: no module named pynvml\n"))
    with pytest.raises(HelperPodFailed, match="gave no result .*ImportError"):
        _probe(cluster)
    assert cluster.pods == []


def test_a_pod_that_never_starts_gives_up_at_the_start_deadline_and_is_deleted():
    """A node that cannot run a bound pod (gone, NotReady) keeps classify waiting a minute, not the whole probe's."""
    cluster = RecordedCluster()  # no kubelet: the pod stays Pending
    ticks = iter(range(0, 10_000, 10))
    with pytest.raises(HelperPodFailed, match="did not start on gpu-7 within 60s"):
        _probe(cluster, sleep=lambda s: None, clock=lambda: float(next(ticks)))
    assert cluster.pods == []
    reads = [q for method, path, q, _ in cluster.requests if method == "GET" and path.endswith("-probe")]
    assert 3 <= len(reads) <= 8  # polled until the start deadline (60 s of 10 s ticks), not the 420 s one


def test_the_pods_own_command_prints_what_the_reader_parses():
    result = _probe(RecordedCluster(kubelet=run_pod_here), node="gpu-3")
    assert result.node == "gpu-3" and result.checks
    assert result.health is Health.UNKNOWN  # this host has no GPU: nothing read, nothing decided
