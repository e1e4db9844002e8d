"""The health check of a suspect node on a cluster: a probe pod pinned to the node (ADR 0004, issue 43 item 3).

After a HARDWARE or SUSPECT_NODE verdict, classify asks the backend to probe the attempt's node
(`Backend.probe_node`). On Kubernetes that is a short pod, bound to the node by `nodeName` (no
scheduling: it runs on a node SAT cordoned, and tolerates every taint, as a node's own
monitoring pods do), running `python -m sat_tasks.io.node_probe NODE` in SAT's staging image
(which has `sat_tasks`): NVML's counters, DCGM's quick diagnostic where `dcgmi` is installed,
a small kernel per device. It asks for no GPU (the failed attempt's pods may still hold them);
`NVIDIA_VISIBLE_DEVICES=all` lets the NVIDIA container runtime show it every device, as DCGM's
exporter sees them. The pod's last JSON line is the `ProbeResult`; the probe exits 1 when a
check failed, so a Failed pod with that line is an answer, not an error. The pod fits the Pod
Security "restricted" profile (ADR 0040): no privilege, no capability, no host path, no token.

A pod that cannot start, or gives no result within `PROBE_TIMEOUT_S`, raises `HelperPodFailed`:
`io.node_ledger.diagnose_attempt` logs it and the probe decides nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.settings import (
    KubernetesSettings,
    container_security_context,
    pod_security_context,
)
from sat_tasks.backends.kubernetes.staging import (
    HELPER_CONTAINER,
    HelperPodFailed,
    _await_pod,
    _delete,
    _delete_leftover,
    _read_log,
)
from sat_tasks.core.handoffs import Log
from sat_tasks.core.health_check import ProbeResult
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api

PROBE_CONTAINER = HELPER_CONTAINER  # the helper pods' container, which `staging._read_log` reads
PROBE_TIMEOUT_S = 420.0  # DCGM's quick diagnostic (300 s at most) and the kernel (120 s) fit in it
# A pod bound by nodeName starts within seconds on a live node; one still Pending after
# `[sat] k8s_probe_start_seconds` says the node cannot run anything (gone, NotReady, its kubelet down):
# the probe gives up and decides nothing.
PROBE_COMPONENT = "node-probe"


def probe_pod_name(job: TrainingJob, run_id: str) -> str:
    """`sat-<job>-<run hash>-probe`: one probe at a time per run (classify runs one attempt at a time)."""
    return names.helper_pod_name(job, run_id, "probe")


def build_probe_pod(job: TrainingJob, run_id: str, node: str, *, namespace: str,
                    settings: KubernetesSettings) -> dict[str, Any]:
    """The probe pod of `node`: bound to it, tolerating its taints, restricted, in SAT's staging image."""
    pull = [{"name": settings.staging_pull_secret}] if settings.staging_pull_secret else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_pod_name(job, run_id), "namespace": namespace,
                     "labels": {**names.run_labels(job, run_id), names.LABEL_COMPONENT: PROBE_COMPONENT},
                     "annotations": {names.ANNOTATION_RUN_ID: run_id}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],  # the quarantine's taint, GPU and Spot taints alike
            "containers": [{
                "name": PROBE_CONTAINER,
                "image": settings.staging_image,
                "command": ["python", "-m", "sat_tasks.io.node_probe", node],
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": container_security_context(),
            }],
            "securityContext": pod_security_context(settings, run_as_user=settings.staging_run_as_user),
            **({"imagePullSecrets": pull} if pull else {}),
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "activeDeadlineSeconds": int(PROBE_TIMEOUT_S),
        },
    }


def probe_node(job: TrainingJob, run_id: str, node: str, *, client: CoreV1Api, namespace: str,
               settings: KubernetesSettings, log: Log = print, timeout_seconds: float | None = None,
               start_seconds: float | None = None, poll_seconds: float = 2.0,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> ProbeResult:
    """Run the probe pod on `node` and return what it read; the pod is deleted whatever the outcome.

    `timeout_seconds` (default `PROBE_TIMEOUT_S`) bounds the whole probe, `start_seconds` (default
    `[sat] k8s_probe_start_seconds`, 60) how long the pod may stay Pending.
    """
    pod = build_probe_pod(job, run_id, node, namespace=namespace, settings=settings)
    name = pod["metadata"]["name"]
    now = clock()
    deadline = now + (PROBE_TIMEOUT_S if timeout_seconds is None else timeout_seconds)
    start_deadline = min(deadline, now + (settings.probe_start_seconds if start_seconds is None else start_seconds))
    _delete_leftover(client, name, namespace, deadline=deadline, poll_seconds=poll_seconds, sleep=sleep, clock=clock)
    client.create_namespaced_pod(namespace, pod)
    log(f"[sat] node health: probe pod {namespace}/{name} on {node}")
    try:
        phase, stuck = _await_pod(client, name, namespace, deadline=start_deadline, poll_seconds=poll_seconds,
                                  sleep=sleep, clock=clock)
        if phase == "Pending" and not stuck:
            raise HelperPodFailed(f"probe pod {namespace}/{name} did not start on {node} within "
                                  f"{start_deadline - now:.0f}s (the node may be gone or NotReady)")
        if phase not in ("Succeeded", "Failed") and not stuck:
            phase, stuck = _await_pod(client, name, namespace, deadline=deadline, poll_seconds=poll_seconds,
                                      sleep=sleep, clock=clock)
        lines = [] if stuck else _read_log(client, name, namespace)
    finally:
        _delete(client, name, namespace)
    results = [line for line in lines if line.startswith("{")]
    if stuck:
        raise HelperPodFailed(f"probe pod {namespace}/{name} cannot start on {node}: {stuck}")
    if not results:
        raise HelperPodFailed(f"probe pod {namespace}/{name} on {node} gave no result (phase {phase})"
                              + (f": {lines[-1][:300]}" if lines else ""))
    return ProbeResult.model_validate_json(results[-1])
