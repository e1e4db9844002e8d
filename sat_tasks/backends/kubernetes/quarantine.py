"""The Kubernetes side of a node quarantine: the nodes a launch must avoid and, optionally, cordon and taint.

The pods of every attempt carry a required `kubernetes.io/hostname NotIn` node affinity on
the quarantined nodes (`pods._scheduling`). With `[sat] quarantine_cordon = true` a launch
that sees a quarantined node also cordons it (`spec.unschedulable`) and taints it
`sat.io/quarantined=true:NoSchedule`, so that no other workload lands there either; a
release (`sat nodes release`, the Nodes page) removes SAT's taint and uncordons, but only a
node SAT cordoned (one an administrator cordoned stays as it is). SAT's service account then
needs a ClusterRole with `get` and `patch` on `nodes`; without it (403) the node is only
avoided, and one line says so.
"""

from __future__ import annotations

from typing import Any

from sat_tasks.config import sat_setting
from sat_tasks.core.handoffs import Log

TAINT_KEY = "sat.io/quarantined"
RBAC_HINT = "SAT's account needs a ClusterRole with get and patch on nodes"


def cordon_enabled() -> bool:
    """`[sat] quarantine_cordon`: whether a quarantine also cordons and taints the Kubernetes node."""
    return sat_setting("quarantine_cordon").strip().lower() in {"1", "true", "yes", "on"}


def quarantined_for_launch(job: Any, hook: Any, log: Log, *, core: Any = None) -> list[str]:
    """The quarantined nodes (for the pods' anti-affinity), cordoned and tainted first when the switch is on."""
    from sat_tasks.io.node_ledger import quarantined_nodes

    nodes = quarantined_nodes(job, hook, log)
    if nodes and cordon_enabled():
        if core is None:
            from sat_tasks.backends.kubernetes.client import core_v1_client

            core = core_v1_client()
        for node in nodes:
            cordon_node(core, node, log)
    return nodes


def _read(core: Any, node: str, log: Log) -> Any | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_node(node)
    except ApiException as exc:
        if exc.status == 404:
            log(f"[sat] node health: node {node} is gone from the cluster; nothing to cordon or uncordon")
        elif exc.status == 403:
            log(f"[sat] node health: may not read node {node} (403 Forbidden): {RBAC_HINT}")
        else:
            raise
        return None


def _patch(core: Any, node: str, body: dict[str, Any], log: Log) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.patch_node(node, body)
    except ApiException as exc:
        if exc.status in (403, 404, 409):
            log(f"[sat] node health: could not patch node {node} ({exc.status} {exc.reason})"
                + (f": {RBAC_HINT}" if exc.status == 403 else ""))
            return False
        raise
    return True


def _taints(core: Any, found: Any) -> list[dict[str, Any]]:
    return [core.api_client.sanitize_for_serialization(t) for t in (found.spec.taints or [])]


def cordon_node(core: Any, node: str, log: Log) -> bool:
    """Cordon `node` and add SAT's taint (idempotent); False when nothing was changed."""
    found = _read(core, node, log)
    if found is None:
        return False
    taints = _taints(core, found)
    if found.spec.unschedulable and any(t.get("key") == TAINT_KEY for t in taints):
        return False
    taints = [t for t in taints if t.get("key") != TAINT_KEY]
    taints.append({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"})
    body = {"metadata": {"resourceVersion": found.metadata.resource_version},  # a concurrent change: 409
            "spec": {"unschedulable": True, "taints": taints}}
    if _patch(core, node, body, log):
        log(f"[sat] node health: cordoned node {node} and tainted it {TAINT_KEY}=true:NoSchedule")
        return True
    return False


def uncordon_node(core: Any, node: str, log: Log) -> bool:
    """Remove SAT's taint and uncordon `node`, only when SAT's taint is there; False when nothing was changed."""
    found = _read(core, node, log)
    if found is None:
        return False
    taints = _taints(core, found)
    if not any(t.get("key") == TAINT_KEY for t in taints):
        log(f"[sat] node health: node {node} carries no {TAINT_KEY} taint: SAT did not cordon it, left as it is")
        return False
    body = {"metadata": {"resourceVersion": found.metadata.resource_version},
            "spec": {"unschedulable": False, "taints": [t for t in taints if t.get("key") != TAINT_KEY] or None}}
    if _patch(core, node, body, log):
        log(f"[sat] node health: removed the {TAINT_KEY} taint from node {node} and uncordoned it")
        return True
    return False


def uncordon_released(node: str, log: Log, *, core: Any = None) -> bool:
    """After a release: uncordon the node when the deployment runs on Kubernetes with the switch on."""
    if sat_setting("backend") != "kubernetes" or not cordon_enabled():
        return False
    if core is None:
        from sat_tasks.backends.kubernetes.client import core_v1_client

        core = core_v1_client()
    return uncordon_node(core, node, log)
