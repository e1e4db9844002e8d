"""A Training Workspace on Kubernetes: what an operator applies (`sat workspace render`), what its pods carry.

A workspace's nodes carry the label and the NoSchedule taint `sat.ai/workspace=<name>`
(`KubernetesSettings.workspace_label`): its jobs' pods select the label and tolerate the
taint, so they run only there and nothing else does. Queueing for its capacity (one slot
per node):

- with Kueue (`[sat] k8s_kueue = true`): a ResourceFlavor for the labelled nodes, a
  ClusterQueue whose quota is the workspace's nodes (`pods` = node count, one pod per node
  rank) times its per-node allocation, StrictFIFO, and a LocalQueue in the jobs'
  namespace; each pod carries `kueue.x-k8s.io/queue-name` (and, multi-node, a pod group
  so a job is admitted whole or not at all);
- without Kueue: an Airflow pool `sat-workspace-<name>` with a slot per node; a job's rank-0
  `launch` task takes `pool_slots = job.nodes` (the scheduler starts them in order as
  slots free). The other ranks' tasks take no slot (slots are counted once, and a slot per
  rank could deadlock two jobs that each got part of the workspace): each waits, before it
  creates the rendezvous Service and its pod, until rank 0's pod of the same attempt exists
  (`operator.await_rank0_pod`: rank 0 has its slots then), failing at `[sat]
  workspace_wait_seconds` or as soon as rank 0's task has ended without a pod.

Editing the node count changes the quota (re-render and apply) and the pool's slots.
Everything is the API's JSON: nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sat_tasks.backends.base import WORKSPACE_POOL_PREFIX, workspace_pool_name
from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.settings import DEFAULT_NAMESPACE, KubernetesSettings
from sat_tasks.spec import SERVER_TYPES, TrainingJob
from sat_tasks.spec.quantities import format_bytes, parse_quantity, quantity_bytes
from sat_tasks.spec.workspace import Workspace

KUEUE_API = "kueue.x-k8s.io/v1beta1"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
POOL_PREFIX = WORKSPACE_POOL_PREFIX


def cluster_queue_name(workspace: str) -> str:
    """The ClusterQueue (and ResourceFlavor) of a workspace."""
    return f"{POOL_PREFIX}{workspace}"


def local_queue_name(workspace: str) -> str:
    """The LocalQueue a workspace's pods name (`kueue.x-k8s.io/queue-name`)."""
    return workspace


def pool_name(workspace: str) -> str:
    """The Airflow pool that queues a workspace's `launch` tasks where Kueue is not configured."""
    return workspace_pool_name(workspace)


def workspace_scheduling(job: TrainingJob, settings: KubernetesSettings) -> tuple[dict[str, str], list[dict]]:
    """The node selector and toleration that keep a workspace job's pods on its workspace's nodes."""
    if job.workspace is None:
        return {}, []
    return ({settings.workspace_label: job.workspace},
            [{"effect": "NoSchedule", "key": settings.workspace_label, "operator": "Equal",
              "value": job.workspace}])


def workspace_pod_metadata(job: TrainingJob, run_id: str, attempt: int, settings: KubernetesSettings,
                           ranks: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations a workspace job's pods carry for Kueue (none without Kueue or a workspace).

    The pod group counts the attempt's `ranks` (default `job.nodes`): an elastic failover on fewer
    nodes is admitted with its own pods, so it holds that much of the workspace's quota.
    """
    if job.workspace is None or not settings.kueue:
        return {}, {}
    labels = {KUEUE_QUEUE_LABEL: local_queue_name(job.workspace)}
    annotations = {}
    if job.distributed:  # admitted whole: every rank or none
        labels[KUEUE_POD_GROUP_LABEL] = names.attempt_name(job, run_id, attempt)
        annotations[KUEUE_POD_GROUP_COUNT] = str(ranks or job.nodes)
    return labels, annotations


def launch_pool(job: TrainingJob | None, settings: KubernetesSettings, *, attempt: int = 1,
                node_rank: int = 0) -> dict[str, Any]:
    """`pool` / `pool_slots` of a workspace job's `launch` task of rank `node_rank` where Kueue does not queue it.

    Rank 0 takes a slot per node of the job, so the job starts when the whole of it fits
    (the other ranks' tasks stay in the default pool: slots are counted once; they create
    their pods only once rank 0's exists, `SatTrainingPodOperator.await_rank0`).

    An elastic job's later attempts may resume on fewer nodes (ADR 0029), and a task's slots are
    fixed when the DAG is parsed: rank 0 takes `elastic.min_nodes` slots (ranks 0 to min_nodes-1,
    which every attempt runs) and each rank from `min_nodes` up one slot of its own, so an attempt
    on K nodes holds K slots. A rank the attempt does not use ends at once without a pod (its slot
    with it); rank 0 counts only the ranks whose tasks hold their slot (`elastic.ranks_with_slots`).
    Empty when the rank takes no slot.
    """
    if job is None or job.workspace is None or settings.kueue:
        return {}
    pool = pool_name(job.workspace)
    if job.elastic is not None and attempt > 1:
        if node_rank == 0:
            return {"pool": pool, "pool_slots": job.elastic.min_nodes}
        return {"pool": pool, "pool_slots": 1} if node_rank >= job.elastic.min_nodes else {}
    return {"pool": pool, "pool_slots": job.nodes} if node_rank == 0 else {}


def check_generic_run(job: TrainingJob, settings: KubernetesSettings, log=print) -> str | None:
    """A workspace job of the generic DAG (spec with the run) on Kubernetes without Kueue: what queues it.

    An Airflow pool is a task's at parse time, and this DAG's spec comes with the run, so its
    `launch` takes no workspace pool slots. One node: the Kubernetes scheduler still queues it
    (its pod is Pending until a workspace node has room), out of the pool's order; said in the
    log, returned. More nodes: refused (its ranks could hold part of the workspace while waiting
    for the rest); the message says the two ways that queue it whole. With Kueue: None.
    """
    if job.workspace is None or settings.kueue:
        return None
    if job.distributed:
        raise ValueError(
            f"workspace {job.workspace}: a {job.nodes}-node job started with its spec in the run (the generic "
            "DAG, the Create Training Job form) cannot queue for the workspace's nodes on Kubernetes without Kueue: "
            "an Airflow pool belongs to a DAG when it is parsed, and without one the job's ranks could hold part of "
            f"the workspace while waiting for the rest. Put the spec under the jobs folder (its own DAG queues in "
            f"pool {pool_name(job.workspace)}) or turn Kueue on ([sat] k8s_kueue = true)")
    line = (f"workspace {job.workspace}: a job started with its spec in the run queues through the Kubernetes "
            f"scheduler (its pod is Pending until a workspace node has room), not in order in pool "
            f"{pool_name(job.workspace)}")
    log(line)
    return line


def _quota(workspace: Workspace, settings: KubernetesSettings) -> list[dict[str, str]]:
    per_node = workspace.resources
    n = workspace.nodes
    cpu = parse_quantity(per_node.cpu) * n
    quotas = [
        {"name": "pods", "nominalQuota": str(n)},
        {"name": "cpu", "nominalQuota": f"{int(cpu)}" if cpu == int(cpu) else f"{int(cpu * 1000)}m"},
        {"name": "memory", "nominalQuota": format_bytes(quantity_bytes(per_node.memory) * n)},
    ]
    if per_node.gpus_per_node:
        quotas.append({"name": settings.gpu_resource, "nominalQuota": str(per_node.gpus_per_node * n)})
    return quotas


def node_patch(workspace: Workspace, node: str, settings: KubernetesSettings) -> dict[str, Any]:
    """The label and taint that put one node into the workspace (`kubectl patch node` / server-side apply)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": {settings.workspace_label: workspace.name}},
        "spec": {"taints": [{"effect": "NoSchedule", "key": settings.workspace_label, "value": workspace.name}]},
    }


def render_workspace_manifests(
    workspace: Workspace,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    nodes: Sequence[str] = (),
    settings: KubernetesSettings | None = None,
    kueue: bool | None = None,
) -> list[dict[str, Any]]:
    """The objects an operator applies for a workspace, in apply order.

    `nodes` (cluster node names) get a Node patch each (label + taint); with Kueue (`kueue`
    or `[sat] k8s_kueue`) a ResourceFlavor, a ClusterQueue and a LocalQueue follow.
    """
    settings = settings or KubernetesSettings.from_sat_config()
    use_kueue = settings.kueue if kueue is None else kueue
    manifests = [node_patch(workspace, node, settings) for node in nodes]
    if not use_kueue:
        return manifests
    flavor = cluster_queue_name(workspace.name)
    label = {settings.workspace_label: workspace.name, "app.kubernetes.io/managed-by": "sat"}
    node_labels = {settings.workspace_label: workspace.name}
    gpu_model = SERVER_TYPES[workspace.resources.server_type]["gpu_model"]
    if gpu_model:
        node_labels[settings.gpu_product_label] = gpu_model
    quotas = _quota(workspace, settings)
    manifests += [
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor, "labels": label},
            "spec": {
                "nodeLabels": node_labels,
                "nodeTaints": [{"effect": "NoSchedule", "key": settings.workspace_label, "value": workspace.name}],
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue_name(workspace.name), "labels": label,
                         "annotations": {"sat.ai/contract": workspace.contract.describe()}},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "queueingStrategy": "StrictFIFO",
                "resourceGroups": [{
                    "coveredResources": [q["name"] for q in quotas],
                    "flavors": [{"name": flavor, "resources": quotas}],
                }],
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue_name(workspace.name), "namespace": namespace, "labels": label},
            "spec": {"clusterQueue": cluster_queue_name(workspace.name)},
        },
    ]
    return manifests


def operator_notes(workspace: Workspace, *, namespace: str, settings: KubernetesSettings,
                   kueue: bool) -> list[str]:
    """What to run besides applying the manifests (comment lines of `sat workspace render`)."""
    key, name = settings.workspace_label, workspace.name
    lines = [
        (f"workspace {name}: {workspace.nodes} node(s) of {workspace.resources.server_type} "
         f"({workspace.resources.gpus_per_node} GPU(s), {workspace.resources.memory}), "
         f"contract {workspace.contract.describe()}"),
        f"label and taint its {workspace.nodes} node(s) (or pass --node NAME to get Node patches):",
        f"  kubectl label node NODE {key}={name}",
        f"  kubectl taint node NODE {key}={name}:NoSchedule",
    ]
    if kueue:
        lines.append(f"Kueue queues its jobs: LocalQueue {local_queue_name(name)} in {namespace}, "
                     f"ClusterQueue {cluster_queue_name(name)}")
    else:
        lines += ["Kueue is not configured ([sat] k8s_kueue): the Airflow pool queues its jobs (one slot per node):",
                  f"  airflow pools set {pool_name(name)} {workspace.nodes} 'Training Workspace {name}'"]
    return lines
