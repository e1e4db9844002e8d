"""The warm pool on Kubernetes: placeholder pods hold a finished run's nodes for the next run (ADR 0015).

The standard overprovisioning pattern: one placeholder pod per node of the run, pinned
to it (`nodeSelector kubernetes.io/hostname`), asking for the job's requests, running the
job's image (so the kubelet keeps it pulled: images of running containers are never
garbage-collected), with the `sat-warm-pool` PriorityClass: a negative value and
`preemptionPolicy: Never`, so it never displaces anything and any pod of normal priority
(the next run's, another job of the workspace) preempts it. The node is not scaled down
while it runs. SAT's next run of the job deletes the placeholders when it claims the
warm state, so its pods need not wait for a preemption; the scheduler's ImageLocality
score then favours the node that has the image. The PriorityClass is cluster-scoped:
`keep_warm` creates it when it is missing (`ensure_priority_class`); where SAT may not, an
operator applies it once (`sat workspace render --warm-pool | kubectl apply -f -`), like the
cluster autoscaler's own overprovisioning class, and until then no placeholder is created.

The run's volume claim is kept too (`cleanup_run` spares it for a run that is kept warm)
and recorded in the state (`WarmState.claim`): the next run's staging pod mounts it
read-only and copies the objects whose ETag did not change from it instead of downloading
them (`staging.build_staging_pod`). `release_warm` deletes the placeholders and the claim.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.pods import pod_memory
from sat_tasks.backends.kubernetes.pull_secret import (
    delete_pull_secret,
    pull_secret_refs,
)
from sat_tasks.backends.kubernetes.settings import (
    KubernetesSettings,
    container_security_context,
    pod_security_context,
)
from sat_tasks.core.handoffs import Log
from sat_tasks.core.warm_pool import WarmState
from sat_tasks.spec import SERVER_TYPES, TrainingJob

PRIORITY_CLASS = "sat-warm-pool"
PRIORITY_VALUE = -10  # below every default (0): never preempts, always preempted
LABEL_WARM = "sat.ai/warm-pool"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def render_priority_class() -> dict[str, Any]:
    """The cluster-scoped PriorityClass of the placeholders (installed once)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": dict(names.MANAGED_BY)},
        "value": PRIORITY_VALUE,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": "SAT warm pool placeholders: hold a node for a job's next run; preempted by any real pod.",
    }


def placeholder_name(job: TrainingJob, node: str) -> str:
    """`sat-warm-<job>-<node hash>`: one placeholder per (job, node), a DNS-1123 name under 63 chars."""
    digest = hashlib.sha256(f"{getattr(job, 'workspace', None) or ''}/{job.name}/{node}".encode()).hexdigest()[:8]
    base = "".join(c if c.isalnum() else "-" for c in job.name.lower())[:40].strip("-")
    return f"sat-warm-{base}-{digest}"


def warm_labels(job: TrainingJob) -> dict[str, str]:
    return {names.LABEL_JOB: job.name, LABEL_WARM: "placeholder", **names.MANAGED_BY}


def render_placeholder_pods(job: TrainingJob, *, run_id: str, nodes: list[str], namespace: str,
                            settings: KubernetesSettings) -> list[dict[str, Any]]:
    """One placeholder pod per node: pinned, the job's requests and image, the warm PriorityClass."""
    amounts = {"cpu": job.resources.cpu, "memory": pod_memory(job)}
    if job.resources.gpus_per_node:
        amounts[settings.gpu_resource] = str(job.resources.gpus_per_node)
    tolerations = []
    if job.resources.gpus_per_node:
        tolerations.append({"effect": "NoSchedule", "key": settings.gpu_taint_key, "operator": "Exists"})
    pods = []
    for node in nodes:
        selector = {HOSTNAME_LABEL: node}
        gpu_model = SERVER_TYPES[job.resources.server_type]["gpu_model"]
        if gpu_model:
            selector[settings.gpu_product_label] = gpu_model
        spec: dict[str, Any] = {
            "priorityClassName": PRIORITY_CLASS,
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "restartPolicy": "Always",
            "containers": [{
                "name": "placeholder",
                "image": job.image.url,
                # The job's image, so it stays pulled; a shell that sleeps and exits at once on SIGTERM.
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"],
                "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                "securityContext": container_security_context(),
            }],
            # Pod Security "restricted" (ADR 0040), as the training pods it holds the node for.
            "securityContext": pod_security_context(settings, run_as_user=settings.run_as_user,
                                                    run_as_group=settings.run_as_group),
        }
        if tolerations:
            spec["tolerations"] = tolerations
        if job.image.registry_conn_id:  # the run's pull Secret, kept with the warm state (ADR 0032)
            spec["imagePullSecrets"] = pull_secret_refs(job, run_id)
        pods.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": placeholder_name(job, node), "namespace": namespace, "labels": warm_labels(job),
                         "annotations": {names.ANNOTATION_RUN_ID: run_id}},
            "spec": spec,
        })
    return pods


def create_placeholders(client: Any, pods: list[dict[str, Any]]) -> list[str]:
    """Create the placeholder pods (one already there, 409, is kept); their names."""
    from kubernetes.client.exceptions import ApiException

    created = []
    for pod in pods:
        try:
            client.create_namespaced_pod(pod["metadata"]["namespace"], pod)
        except ApiException as exc:
            if exc.status != 409:
                raise
        created.append(pod["metadata"]["name"])
    return created


def delete_placeholders(client: Any, namespace: str, pod_names: list[str]) -> list[str]:
    """Delete the placeholder pods (already gone, 404, is skipped: preempted); `pod/<name>` of each deleted."""
    from kubernetes.client.exceptions import ApiException

    deleted = []
    for name in pod_names:
        try:
            client.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
            continue
        deleted.append(f"pod/{name}")
    return deleted


def ensure_priority_class(scheduling: Any, log: Log) -> bool:
    """Create the `sat-warm-pool` PriorityClass when it is missing; False when SAT may not (403).

    `scheduling` is a SchedulingV1Api. One already there is kept as it is (an operator's
    may differ); 409 on create means another run made it in between. On 403 (read or
    create) one line says how the operator installs it; the caller then holds no node.
    """
    from kubernetes.client.exceptions import ApiException

    try:
        scheduling.read_priority_class(PRIORITY_CLASS)
        return True
    except ApiException as exc:
        if exc.status == 403:
            return _priority_class_forbidden("read", log)
        if exc.status != 404:
            raise
    try:
        scheduling.create_priority_class(render_priority_class())
    except ApiException as exc:
        if exc.status == 403:
            return _priority_class_forbidden("create", log)
        if exc.status != 409:
            raise
        return True
    log(f"warm pool: created PriorityClass {PRIORITY_CLASS} (value {PRIORITY_VALUE}, preemptionPolicy Never)")
    return True


def _priority_class_forbidden(verb: str, log: Log) -> bool:
    log(f"warm pool: SAT may not {verb} PriorityClass {PRIORITY_CLASS} (403 Forbidden): an operator must apply it "
        f"once (`sat workspace render --warm-pool | kubectl apply -f -`); no placeholder pod holds the node, "
        "the staged data is kept")
    return False


def keep_warm(client: Any, namespace: str, job: TrainingJob, run_id: str, state: WarmState,
              settings: KubernetesSettings, log: Log, *, scheduling: Any = None,
              claim: str | None = None) -> WarmState:
    """Hold the state's nodes with placeholders and keep the run's claim; the state with their names.

    `claim`: the run's volume claim, which `cleanup_run` spared (None: nothing kept). The
    placeholders need the PriorityClass (`ensure_priority_class` on `scheduling`, a
    SchedulingV1Api); without it none are created and only the claim is kept. When creating
    a placeholder fails, what was created is deleted again before the error goes on.
    """
    update: dict[str, Any] = {"namespace": namespace, "claim": claim}
    if not state.nodes:
        log("warm pool: no node to hold (the run's last attempt recorded none)")
    elif scheduling is None or ensure_priority_class(scheduling, log):
        pods = render_placeholder_pods(job, run_id=run_id, nodes=state.nodes, namespace=namespace, settings=settings)
        created: list[str] = []
        try:
            for pod in pods:
                created += create_placeholders(client, [pod])
        except Exception:
            release_warm(client, namespace, state.model_copy(update={**update, "placeholders": created}), log)
            raise
        update.update(placeholders=created, resources=pods[0]["spec"]["containers"][0]["resources"]["requests"])
    if claim:
        log(f"warm pool: volume claim {claim} kept (the next run copies its unchanged objects from it)")
    return state.model_copy(update=update)


def delete_claim(client: Any, namespace: str, claim: str | None) -> list[str]:
    """Delete a kept run volume claim (already gone, 404, is skipped); `persistentvolumeclaim/<name>` if deleted."""
    from kubernetes.client.exceptions import ApiException

    if not claim:
        return []
    try:
        client.delete_namespaced_persistent_volume_claim(claim, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return []
    return [f"persistentvolumeclaim/{claim}"]


def release_warm(client: Any, namespace: str, state: WarmState, log: Log) -> list[str]:
    """Delete the state's placeholder pods, its kept claim and the run's pull Secret: nothing of it is left."""
    ns = state.namespace or namespace
    deleted = delete_placeholders(client, ns, state.placeholders) + delete_claim(client, ns, state.claim)
    if state.claim:  # the kept run's pull Secret (none when the job has no registry login: 404, skipped)
        deleted += delete_pull_secret(client, ns, names.registry_secret_name_of_claim(state.claim))
    return deleted


def release_for_capacity(workspace: str, nodes_needed: int, log: Log = print, *, client: Any = None,
                         namespace: str | None = None) -> list[str]:
    """Release the workspace's warm states (Kubernetes), oldest first, until `nodes_needed` nodes are free.

    Placeholders never block a pod of normal priority (it preempts them) and carry no Kueue
    queue label (no quota is counted for them); this frees the nodes at once instead.
    """
    from sat_tasks.backends.kubernetes import client as k8s_client
    from sat_tasks.config import sat_setting
    from sat_tasks.io import warm_pool
    from sat_tasks.io.object_storage import object_storage_hook

    api = client if client is not None else k8s_client.core_v1_client()
    ns = namespace or k8s_client.namespace()
    return warm_pool.release_for_capacity(
        workspace, nodes_needed, object_storage_hook(sat_setting("object_storage_conn_id")), warm_pool.warm_roots(),
        lambda state, say: release_warm(api, ns, state, say), backend="kubernetes", log=log)
