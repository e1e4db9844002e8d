"""Spot capacity on the kubernetes backend: would one rank of the next attempt fit on enough nodes?

The `wait_for_capacity` sensor of a Spot job asks `KubernetesBackend.capacity`, which
calls ``cluster_capacity``: it renders the rank pod the next attempt would submit
(``pods.build_attempt_pods``, so the node selector, tolerations, node affinity and
resource requests are exactly the submitted ones), lists the cluster's nodes and the bound
pods of the jobs' namespace (never every pod of the cluster: ADR 0040) through the provider's
``KubernetesHook``, and hands plain API-shaped dicts to ``assess_capacity``, the pure decision
(testable without a cluster).

A node fits when it matches the pod's node selector and required node affinity, is not a
node an earlier attempt failed on, is Ready, is not cordoned, carries no NoSchedule or
NoExecute taint the pod does not tolerate, and its allocatable resources minus the requests
of the non-terminated pods bound to it cover one rank's requests. Capacity is available
when at least `nodes` nodes fit (one rank per node). This mirrors the scheduler's filters
that decide Spot capacity; it is a forecast, not a reservation: the scheduler still places
the pods, and a pod that cannot be placed waits in Pending until `startup_timeout_seconds`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.kubernetes.client import core_v1_client
from sat_tasks.backends.kubernetes.client import namespace as default_namespace
from sat_tasks.backends.kubernetes.pods import render_attempt_manifests
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.errors import SatError
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api

__all__ = [
    "CapacityAssessment",
    "assess_capacity",
    "cluster_capacity",
    "list_nodes_and_pods",
    "rank_pod_manifest",
]



class CapacityForbidden(SatError, PermissionError):
    """The Kubernetes connection may not list nodes (cluster-wide) or the jobs' namespace's pods."""

# Why a node cannot take a rank, in the order they are checked (a node counts under the first).
EXCLUDED = "excluded (failed an earlier attempt)"
NOT_SELECTED = "not matching the pod's node selector/affinity"
NOT_READY = "not Ready"
CORDONED = "cordoned (unschedulable)"
TAINTED = "untolerated NoSchedule/NoExecute taint"
INSUFFICIENT = "insufficient {resource}"

_TERMINATED_PHASES = ("Succeeded", "Failed")
_HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class CapacityAssessment:
    """The outcome of one capacity check.

    Attributes:
        needed: nodes the job needs (one rank each).
        fitting: names of the nodes one rank fits on now.
        rejected: reason -> number of nodes rejected for it (the first failing check).
        total: nodes looked at.
    """

    needed: int
    fitting: tuple[str, ...]
    rejected: dict[str, int] = field(default_factory=dict)
    total: int = 0

    @property
    def available(self) -> bool:
        """At least `needed` nodes fit one rank each."""
        return len(self.fitting) >= self.needed

    def summary(self) -> str:
        """One line: how many nodes fit, out of how many, and rejection counts per reason."""
        line = f"{len(self.fitting)} of {self.total} node(s) fit one rank (need {self.needed})"
        if self.rejected:
            line += "; rejected: " + ", ".join(f"{count} {reason}" for reason, count in self.rejected.items())
        return line


# ---- quantities and requests -------------------------------------------------------------------
def _quantity(value: Any) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(value)


def _add(total: dict[str, Decimal], amounts: dict[str, Any] | None) -> None:
    for name, value in (amounts or {}).items():
        total[name] = total.get(name, Decimal(0)) + _quantity(value)


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What a pod asks the scheduler for: max(sum of containers, largest init container) + overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        _add(total, (container.get("resources") or {}).get("requests"))
    for container in spec.get("initContainers") or []:
        init: dict[str, Decimal] = {}
        _add(init, (container.get("resources") or {}).get("requests"))
        for name, value in init.items():
            total[name] = max(total.get(name, Decimal(0)), value)
    _add(total, spec.get("overhead"))
    return total


# ---- the scheduler's node filters ----------------------------------------------------------------
def _labels(node: dict[str, Any]) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _expression_matches(labels: dict[str, str], expression: dict[str, Any]) -> bool:
    key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        try:
            have, bound = int(labels[key]), int(values[0])
        except (KeyError, IndexError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _selected(pod_spec: dict[str, Any], node: dict[str, Any]) -> bool:
    """The pod's nodeSelector and required node affinity (terms ORed, expressions ANDed)."""
    labels = _labels(node)
    if any(labels.get(key) != value for key, value in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    name = (node.get("metadata") or {}).get("name")
    for term in terms:
        by_label = all(_expression_matches(labels, e) for e in term.get("matchExpressions") or [])
        by_field = all(_expression_matches({"metadata.name": name}, e) for e in term.get("matchFields") or [])
        if (term.get("matchExpressions") or term.get("matchFields")) and by_label and by_field:
            return True
    return False


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"  # an empty key with Exists tolerates everything
    if toleration.get("key") != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taints(pod_spec: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's NoSchedule/NoExecute taints that none of the pod's tolerations covers."""
    tolerations = pod_spec.get("tolerations") or []
    return [
        taint for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
        and not any(_tolerates(t, taint) for t in tolerations)
    ]


def _is_excluded(node: dict[str, Any], exclude_nodes: Iterable[str]) -> bool:
    excluded = set(exclude_nodes)
    return (node.get("metadata") or {}).get("name") in excluded or _labels(node).get(_HOSTNAME_LABEL) in excluded


def _used_by_node(pods: Iterable[dict[str, Any]]) -> dict[str, dict[str, Decimal]]:
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _TERMINATED_PHASES:
            continue
        total = used.setdefault(node, {})
        for name, value in pod_requests(pod).items():
            total[name] = total.get(name, Decimal(0)) + value
    return used


def _lacking(request: dict[str, Decimal], allocatable: dict[str, Any], used: dict[str, Decimal]) -> str | None:
    """The first resource of `request` the node lacks, or None when one rank fits."""
    for name, need in request.items():
        if need <= 0:
            continue
        have = _quantity(allocatable[name]) if name in allocatable else Decimal(0)
        if have - used.get(name, Decimal(0)) < need:
            return name
    return None


def assess_capacity(
    rank_pod: dict[str, Any],
    nodes: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]],
    *,
    needed: int,
    exclude_nodes: Sequence[str] = (),
) -> CapacityAssessment:
    """Which nodes one rank (`rank_pod`) fits on, and why the others do not.

    All inputs are the API's JSON shape (`ApiClient().sanitize_for_serialization`):
    `rank_pod` a Pod as the attempt would submit it, `nodes` the items of a NodeList,
    `pods` the items of a PodList (any namespace; unbound and terminated pods are ignored).
    `needed` is the number of nodes the job runs on; `exclude_nodes` the nodes of failed
    attempts (matched by name and by `kubernetes.io/hostname`).
    """
    pod_spec = rank_pod.get("spec") or {}
    request = pod_requests(rank_pod)
    used = _used_by_node(pods)
    rejected: Counter[str] = Counter()
    fitting: list[str] = []
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        if _is_excluded(node, exclude_nodes):
            rejected[EXCLUDED] += 1
        elif not _selected(pod_spec, node):
            rejected[NOT_SELECTED] += 1
        elif not _ready(node):
            rejected[NOT_READY] += 1
        elif (node.get("spec") or {}).get("unschedulable"):
            rejected[CORDONED] += 1
        elif untolerated_taints(pod_spec, node):
            rejected[TAINTED] += 1
        else:
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            lacking = _lacking(request, allocatable, used.get(name, {}))
            if lacking:
                rejected[INSUFFICIENT.format(resource=lacking)] += 1
            else:
                fitting.append(name)
    return CapacityAssessment(needed=needed, fitting=tuple(fitting), rejected=dict(rejected), total=len(nodes))


# ---- the cluster -------------------------------------------------------------------------------
def rank_pod_manifest(
    job: TrainingJob,
    run_id: str,
    plan: Plan,
    *,
    namespace: str | None = None,
    settings: KubernetesSettings | None = None,
) -> dict[str, Any]:
    """Rank 0's pod of attempt `plan.attempt` as it would be submitted (its scheduling and requests)."""
    manifests = render_attempt_manifests(
        job, run_id=run_id, plan=plan, namespace=namespace or default_namespace(), settings=settings,
    )
    return next(m for m in manifests if m.get("kind") == "Pod")


def list_nodes_and_pods(client: CoreV1Api, namespace: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cluster's nodes and the non-terminated pods of the jobs' namespace, as API-shaped dicts.

    `client` is a CoreV1Api; `namespace` defaults to `[sat] kubernetes_namespace`. Needs `list` on nodes
    (cluster-wide) and on pods in that namespace only: SAT no longer lists every pod of the cluster, whose
    specs carry other tenants' environments (issue 44.3, ADR 0040). The pods of other namespaces are not
    counted: on nodes shared with other workloads this forecast is an upper bound, and the scheduler decides.
    """
    from kubernetes.client import ApiClient

    serialize = ApiClient().sanitize_for_serialization
    nodes = client.list_node().items
    pods = client.list_namespaced_pod(namespace or default_namespace(),
                                      field_selector="status.phase!=Succeeded,status.phase!=Failed").items
    return [serialize(n) for n in nodes], [serialize(p) for p in pods]


def cluster_capacity(
    job: TrainingJob,
    run_id: str,
    plan: Plan,
    *,
    client: CoreV1Api | None = None,
    kubernetes_conn_id: str | None = None,
    log: Log = print,
) -> CapacityAssessment | None:
    """Ask the cluster whether `job.nodes` nodes, none of `plan.exclude_nodes`, can take a rank of attempt `plan.attempt` now.

    `client` is a CoreV1Api (default: the provider's `KubernetesHook` on `kubernetes_conn_id`,
    else `[sat] kubernetes_conn_id`). Returns None when the API could not answer this time
    (the sensor pokes again; the max-wait budget still applies). Raises CapacityForbidden
    when the connection may not list nodes or the namespace's pods: waiting would not fix that.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if client is None:
        client = core_v1_client(kubernetes_conn_id)
    try:
        nodes, pods = list_nodes_and_pods(client)
    except ApiException as exc:
        if exc.status in (401, 403):
            raise CapacityForbidden(
                f"the Kubernetes connection may not list nodes or the jobs' pods ({exc.status} {exc.reason}); "
                "the Spot capacity check needs `list` on nodes (a ClusterRole) and on pods in the jobs' namespace"
            ) from None
        log(f"capacity check: the Kubernetes API did not answer ({exc.status} {exc.reason}); trying again")
        return None
    except (HTTPError, OSError) as exc:
        log(f"capacity check: the Kubernetes API is not reachable ({type(exc).__name__}); trying again")
        return None
    pod = rank_pod_manifest(job, run_id, plan)
    return assess_capacity(pod, nodes, pods, needed=job.nodes, exclude_nodes=plan.exclude_nodes)
