"""The Kubernetes API client of the backend: the provider's KubernetesHook, from `[sat] kubernetes_conn_id`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sat_tasks.config import sat_setting

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api, SchedulingV1Api


def core_v1_client(kubernetes_conn_id: str | None = None) -> CoreV1Api:
    """A CoreV1Api from the Airflow Kubernetes connection (default `[sat] kubernetes_conn_id`)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=kubernetes_conn_id or sat_setting("kubernetes_conn_id")).core_v1_client


def scheduling_v1_client(kubernetes_conn_id: str | None = None, *,
                         core: CoreV1Api | None = None) -> SchedulingV1Api:
    """A SchedulingV1Api (PriorityClasses): on `core`'s connection when given, else from the Airflow connection."""
    from kubernetes.client import SchedulingV1Api

    if core is not None:
        return SchedulingV1Api(core.api_client)
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return SchedulingV1Api(KubernetesHook(conn_id=kubernetes_conn_id or sat_setting("kubernetes_conn_id")).api_client)


def namespace() -> str:
    """The namespace SAT's objects live in (`[sat] kubernetes_namespace`)."""
    return sat_setting("kubernetes_namespace")
