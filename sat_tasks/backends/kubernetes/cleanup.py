"""Deleting what SAT created on the cluster: a failed rank's peers, an attempt's objects, the run's objects.

Every function takes a CoreV1Api (`client.core_v1_client()` in the DAG; a recording fake in
tests), is idempotent (objects already gone are skipped) and returns `kind/name` of what it
deleted. What is created and deleted is exactly what `sat render` prints (tested).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Iterable

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



def _delete_all(kinds: Iterable[tuple[str, Callable, Callable]], namespace: str, selector: str,
                *, narrower: dict[str, str] | None = None, **delete_kwargs: Any) -> list[str]:
    """Delete every object of `kinds` matching `selector` (`narrower`: kind -> extra terms for that kind)."""
    from kubernetes.client.exceptions import ApiException

    deleted = []
    for kind, lister, deleter in kinds:
        extra = (narrower or {}).get(kind)
        for name in _listed_names(kind, lister, namespace, f"{selector},{extra}" if extra else selector):
            try:
                if kind == "secret":  # the answer is the deleted Secret: not read (see _listed_names)
                    _release(deleter(name, namespace, _preload_content=False, **delete_kwargs))
                else:
                    deleter(name, namespace, **delete_kwargs)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            deleted.append(f"{kind}/{name}")
    return deleted


def _listed_names(kind: str, lister: Callable, namespace: str, selector: str) -> list[str]:
    """The names of the listed objects. Secrets are listed with their data: their answer is read here and
    never by the client, which logs each answer it reads at DEBUG (credentials, ADR 0020 and 0032)."""
    if kind != "secret":
        return [item.metadata.name for item in lister(namespace, label_selector=selector).items]
    response = lister(namespace, label_selector=selector, _preload_content=False)
    try:
        if hasattr(response, "data"):
            return [item["metadata"]["name"] for item in json.loads(response.data).get("items") or []]
        return [item.metadata.name for item in response.items]
    finally:
        _release(response)


def _release(response: Any) -> None:
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()


def cleanup_attempt(client: CoreV1Api, job: TrainingJob, *, run_id: str, attempt: int, namespace: str) -> list[str]:
    """Delete an attempt's pods, rendezvous Service and credentials Secret (after classify has read them).

    The run's claim stays: the next attempt resumes from it (`cleanup_run` deletes it).
    """
    return _delete_all(
        (("pod", client.list_namespaced_pod, client.delete_namespaced_pod),
         ("service", client.list_namespaced_service, client.delete_namespaced_service),
         ("secret", client.list_namespaced_secret, client.delete_namespaced_secret)),
        namespace, names.attempt_label_selector(job, run_id, attempt))


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
             ("secret", client.list_namespaced_secret, client.delete_namespaced_secret)]
    narrower = {}
    if keep_claim:
        narrower["secret"] = f"{names.LABEL_COMPONENT}!={names.COMPONENT_REGISTRY_LOGIN}"
    else:
        kinds.append(("persistentvolumeclaim", client.list_namespaced_persistent_volume_claim,
                      client.delete_namespaced_persistent_volume_claim))
    return _delete_all(kinds, namespace, names.run_label_selector(job, run_id), narrower=narrower)
