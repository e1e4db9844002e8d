"""What the cluster said about an attempt besides its pod: node, NodeClaim and Kueue Workload events, and the node's labels at start.

Call order: the `launch` task calls ``record_node_at_start`` once the pod has a node (its
labels, and Karpenter's NodeClaim behind it, go into two pod annotations, so they outlive a
node that a Spot shutdown deletes); `records` calls ``attempt_events`` when the attempt is
classified. Events are read per object (the pod; its node and NodeClaim in namespace
`default`, where the events of cluster-scoped objects live; the Kueue Workload of the pod),
those of the node, NodeClaim and Workload only within the attempt's window
(`classify.window.AttemptWindow`), at most ``MAX_EVENTS_PER_OBJECT`` of each (the newest). Nothing here
raises on an API error: a line says what could not be read, and the rest is used.
"""

from __future__ import annotations

import json
from typing import Any

from sat_tasks.classify.loaders import (
    NODE_LABELS_AT_START_ANNOTATION,
    NODECLAIM_AT_START_ANNOTATION,
)
from sat_tasks.classify.window import MAX_EVENTS_PER_OBJECT, AttemptWindow, by_time
from sat_tasks.core.handoffs import Log

#: Events of cluster-scoped objects (Node, Karpenter's NodeClaim) live in this namespace.
NODE_EVENT_NAMESPACE = "default"

KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_WORKLOAD_NAME = "kueue.x-k8s.io/workload-name"
_KUEUE_MANAGED = ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/managed")


def as_dict(obj: Any) -> dict[str, Any]:
    """A kubernetes client model as the API's JSON (camelCase keys, ISO timestamps)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def read_events(client: Any, namespace: str, field_selector: str, log: Log) -> list[dict[str, Any]]:
    """The events a field selector picks in `namespace`, oldest first; none (and a line) when not readable."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        items = client.list_namespaced_event(namespace, field_selector=field_selector).items
    except ApiException as exc:
        log(f"events {field_selector} in {namespace}: not readable ({exc.status} {exc.reason})")
        return []
    except (HTTPError, OSError) as exc:
        log(f"events {field_selector} in {namespace}: not readable ({type(exc).__name__}: the API server did not answer)")
        return []
    return by_time([as_dict(item) for item in items])


def read_node(client: Any, name: str, log: Log) -> dict[str, Any] | None:
    """The Node object; None (and a line saying why) when it is gone or not readable."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return as_dict(client.read_node(name))
    except ApiException as exc:
        log(f"node {name}: not readable ({exc.status} {exc.reason}); "
            + ("it no longer exists" if exc.status == 404 else "no node conditions, taints or labels in the record"))
    except (HTTPError, OSError) as exc:
        log(f"node {name}: not readable ({type(exc).__name__}: the API server did not answer)")
    return None


def _bounded(events: list[dict[str, Any]], what: str, window: AttemptWindow | None, log: Log) -> list[dict[str, Any]]:
    """`events` within `window` (all when None), at most `MAX_EVENTS_PER_OBJECT`: the newest; a line says
    how many over the bound were left out."""
    kept, _outside, over = (window or AttemptWindow()).select(events, MAX_EVENTS_PER_OBJECT)
    if over:
        log(f"{what}: {len(kept) + over} events, kept the newest {len(kept)} (MAX_EVENTS_PER_OBJECT)")
    return kept


def nodeclaim_of(node: dict[str, Any] | None) -> str | None:
    """The Karpenter NodeClaim that owns a node (its ownerReference of kind NodeClaim), if any."""
    for owner in ((node or {}).get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("kind") == "NodeClaim" and owner.get("name"):
            return str(owner["name"])
    return None


def _workload_of(pod: dict[str, Any]) -> tuple[str | None, str | None]:
    """The Kueue Workload of a pod: (its name, or None) and, for a single pod, the prefix of its name.

    A pod group's Workload is named after the group (`kueue.x-k8s.io/pod-group-name`); a single
    pod's is `pod-<pod name>-<hash>`. (None, None): Kueue does not manage the pod.
    """
    metadata = pod.get("metadata") or {}
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    named = labels.get(KUEUE_WORKLOAD_NAME) or annotations.get(KUEUE_WORKLOAD_NAME)
    owned = [o.get("name") for o in metadata.get("ownerReferences") or [] if isinstance(o, dict)
             and o.get("kind") == "Workload" and str(o.get("apiVersion", "")).startswith("kueue.x-k8s.io")]
    name = named or next(iter(owned), None) or labels.get(KUEUE_POD_GROUP_LABEL)
    if name:
        return str(name), None
    if any(key in labels for key in _KUEUE_MANAGED) and metadata.get("name"):
        return None, f"pod-{metadata['name']}-"
    return None, None


def workload_events(client: Any, namespace: str, pod: dict[str, Any], log: Log) -> list[dict[str, Any]]:
    """Events of the pod's Kueue Workload (admission, eviction, preemption); none for a pod Kueue does not manage."""
    name, prefix = _workload_of(pod)
    if name:
        return read_events(client, namespace, f"involvedObject.kind=Workload,involvedObject.name={name}", log)
    if prefix:
        events = read_events(client, namespace, "involvedObject.kind=Workload", log)
        return [e for e in events if str((e.get("involvedObject") or {}).get("name") or "").startswith(prefix)]
    return []


def attempt_events(client: Any, pod: dict[str, Any], namespace: str, node: dict[str, Any] | None,
                   log: Log) -> list[dict[str, Any]]:
    """Every event the record of one pod gets, grouped by object, each group oldest first.

    The pod's own (all of it is this attempt's; kubelet, scheduler, Kueue, Karpenter's
    eviction), then, within the attempt's window, its node's (kubelet, node controller,
    node-problem-detector, Karpenter, aws-node-termination-handler), its NodeClaim's
    (Karpenter's disruption; named by the node, else by what `launch` kept at start), and its
    Kueue Workload's. At most `MAX_EVENTS_PER_OBJECT` each.
    """
    metadata = pod.get("metadata") or {}
    name = metadata.get("name")
    window = AttemptWindow.of_pod(pod)
    events = _bounded(read_events(client, namespace, f"involvedObject.name={name}", log), f"pod {name}", None, log)
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name:
        node_events = read_events(client, NODE_EVENT_NAMESPACE,
                                  f"involvedObject.kind=Node,involvedObject.name={node_name}", log)
        events += _bounded(node_events, f"node {node_name}", window, log)
    claim = nodeclaim_of(node) or (metadata.get("annotations") or {}).get(NODECLAIM_AT_START_ANNOTATION)
    if claim:
        claim_events = read_events(client, NODE_EVENT_NAMESPACE,
                                   f"involvedObject.kind=NodeClaim,involvedObject.name={claim}", log)
        events += _bounded(claim_events, f"NodeClaim {claim}", window, log)
    events += _bounded(workload_events(client, namespace, pod, log), f"the Kueue Workload of pod {name}", window, log)
    return events


def record_node_at_start(client: Any, namespace: str, pod_name: str, log: Log) -> dict[str, str] | None:
    """Keep the labels (and NodeClaim) of the node pod `pod_name` runs on, as two annotations of the pod.

    Called by `launch` once the pod has started; `records` reads them into
    `AttemptRecord.node_labels_at_start`, so a node that is gone by the end (a Spot shutdown
    deletes it) is still known to have been Spot. Idempotent (annotations already there are
    kept). Returns the labels; None when the pod has no node yet or the node cannot be read.
    Never raises: a line says what could not be done.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        pod = as_dict(client.read_namespaced_pod(pod_name, namespace))
    except (ApiException, HTTPError, OSError) as exc:
        log(f"pod {pod_name}: not readable to keep its node's labels ({getattr(exc, 'status', type(exc).__name__)})")
        return None
    kept = ((pod.get("metadata") or {}).get("annotations") or {}).get(NODE_LABELS_AT_START_ANNOTATION)
    if kept:
        try:
            return dict(json.loads(kept))
        except (ValueError, TypeError):
            pass  # unreadable: read the node again
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        return None
    node = read_node(client, node_name, log)
    if node is None:
        return None
    labels = {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}
    annotations = {NODE_LABELS_AT_START_ANNOTATION: json.dumps(labels, sort_keys=True)}
    claim = nodeclaim_of(node)
    if claim:
        annotations[NODECLAIM_AT_START_ANNOTATION] = claim
    try:
        client.patch_namespaced_pod(pod_name, namespace, {"metadata": {"annotations": annotations}})
    except (ApiException, HTTPError, OSError) as exc:
        log(f"pod {pod_name}: could not keep the labels of node {node_name} on it "
            f"({getattr(exc, 'status', type(exc).__name__)}); a node gone by the end will have none")
        return labels
    log(f"pod {pod_name} runs on node {node_name}: kept its {len(labels)} labels"
        + (f" and its NodeClaim {claim}" if claim else ""))
    return labels
