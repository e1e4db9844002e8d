"""Deleting what SAT created on the cluster: a failed rank's peers, an attempt's objects, the run's objects.

Every function takes a CoreV1Api (`client.core_v1_client()` in the DAG; a recording fake in
tests), is idempotent (objects already gone are skipped) and returns `kind/name` of what it
deleted. What is created and deleted is exactly what `sat render` prints (tested).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api, V1Pod


def teardown_peers(pod: V1Pod, client: CoreV1Api) -> list[str]:
    """When `pod` (one rank) failed, delete the attempt's other ranks that still run.

    They get SIGTERM and their grace period, so they write a final checkpoint, instead of
    hanging in a collective until NCCL times out. The failed pod itself is kept for
    classify. `pod` is a V1Pod, `client` a CoreV1Api; returns the names deleted.
    """
    if (pod.status.phase if pod.status else None) != "Failed":
        return []
    labels = pod.metadata.labels or {}
    attempt_id, rank = labels.get(names.LABEL_ATTEMPT_ID), labels.get(names.LABEL_NODE_RANK)
    if not attempt_id:
        return []
    selector = f"{names.LABEL_ATTEMPT_ID}={attempt_id}" + (f",{names.LABEL_NODE_RANK}!={rank}" if rank is not None else "")
    peers = client.list_namespaced_pod(pod.metadata.namespace, label_selector=selector).items
    deleted = []
    for peer in peers:
        if peer.status and peer.status.phase in ("Succeeded", "Failed"):
            continue
        client.delete_namespaced_pod(peer.metadata.name, peer.metadata.namespace,
                                     grace_period_seconds=pod.spec.termination_grace_period_seconds)
        deleted.append(peer.metadata.name)
    return deleted



def _delete_all(kinds: Iterable[tuple[str, Callable | None, Callable]], namespace: str, selector: str,
                *, narrower: dict[str, str] | None = None, **delete_kwargs: Any) -> list[str]:
    """Delete every object of `kinds` matching `selector` (`narrower`: kind -> extra terms for that kind).

    Secrets are deleted by label selector in one `deletecollection` call (`_delete_secrets`), never listed:
    `list` on Secrets returns every Secret's data, and SAT's account is not granted it (ADR 0040).
    """
    from kubernetes.client.exceptions import ApiException

    deleted = []
    for kind, lister, deleter in kinds:
        extra = (narrower or {}).get(kind)
        terms = f"{selector},{extra}" if extra else selector
        if kind == "secret":
            deleted += _delete_secrets(deleter, namespace, terms)
            continue
        assert lister is not None
        for name in [item.metadata.name for item in lister(namespace, label_selector=terms).items]:
            try:
                deleter(name, namespace, **delete_kwargs)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            deleted.append(f"{kind}/{name}")
    return deleted


def _delete_network_policies(client: CoreV1Api, namespace: str, selector: str) -> list[str]:
    """Delete the NetworkPolicies matching `selector` (an attempt's rendezvous policy) in one deletecollection call."""
    api_client = getattr(client, "api_client", None)
    if api_client is None:  # a stand-in client without the HTTP layer (tests of other objects)
        return []
    from kubernetes.client import NetworkingV1Api

    response = NetworkingV1Api(api_client).delete_collection_namespaced_network_policy(
        namespace, label_selector=selector, _preload_content=False)
    try:
        data = getattr(response, "data", None)
        items = (json.loads(data) if data else {}).get("items") or []
        return [f"networkpolicy/{item['metadata']['name']}" for item in items
                if (item.get("metadata") or {}).get("name")]
    finally:
        _release(response)


def _delete_secrets(delete_collection: Callable, namespace: str, selector: str) -> list[str]:
    """Delete the Secrets matching `selector` (`delete_collection_namespaced_secret`); `secret/<name>` of each.

    The answer lists the deleted Secrets with their data: it is read here, for their names only, and never
    by the client, which logs each answer it reads at DEBUG (credentials, ADR 0020 and 0032).
    """
    response = delete_collection(namespace, label_selector=selector, _preload_content=False)
    try:
        data = getattr(response, "data", None)
        items = (json.loads(data) if data else {}).get("items") or []
        return [f"secret/{item['metadata']['name']}" for item in items if (item.get("metadata") or {}).get("name")]
    finally:
        _release(response)


def _release(response: Any) -> None:
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()


def cleanup_attempt(client: CoreV1Api, job: TrainingJob, *, run_id: str, attempt: int, namespace: str) -> list[str]:
    """Delete an attempt's pods, rendezvous Service and NetworkPolicy, and credentials Secret (after classify).

    The run's claim stays: the next attempt resumes from it (`cleanup_run` deletes it).
    """
    selector = names.attempt_label_selector(job, run_id, attempt)
    return _delete_all(
        (("pod", client.list_namespaced_pod, client.delete_namespaced_pod),
         ("service", client.list_namespaced_service, client.delete_namespaced_service),
         ("secret", None, client.delete_collection_namespaced_secret)),
        namespace, selector) + _delete_network_policies(client, namespace, selector)


def cleanup_run(client: CoreV1Api, job: TrainingJob, *, run_id: str, namespace: str, keep_claim: bool = False) -> list[str]:
    """Delete everything the run still has: pods, Services and Secrets of any attempt, helper pods, the
    run's image pull Secret (ADR 0032), the claim.

    Runs once the outputs are uploaded (the claim holds them until then). A claim named by
    `pvc_name` (a long-lived shared one) carries no run labels and is never deleted.
    `keep_claim`: the run is kept warm (ADR 0015), its claim with the staged data stays for the
    job's next run, and its pull Secret for the placeholders, which `warm.release_warm` deletes later.
    """
    kinds = [("pod", client.list_namespaced_pod, client.delete_namespaced_pod),
             ("service", client.list_namespaced_service, client.delete_namespaced_service),
             ("secret", None, client.delete_collection_namespaced_secret)]
    narrower = {}
    if keep_claim:
        narrower["secret"] = f"{names.LABEL_COMPONENT}!={names.COMPONENT_REGISTRY_LOGIN}"
    else:
        kinds.append(("persistentvolumeclaim", client.list_namespaced_persistent_volume_claim,
                      client.delete_namespaced_persistent_volume_claim))
    selector = names.run_label_selector(job, run_id)
    return (_delete_all(kinds, namespace, selector, narrower=narrower)
            + _delete_network_policies(client, namespace, selector))
