"""The run's image pull Secret: made from the job's registry login before any pod of the run starts (ADR 0032).

A job that names `image.registry_conn_id` (the Create form's `sat_registry_<job>`, or a
login the deployment shares) pulls its image with the login's credentials. Call order:

1. ``ensure_pull_secret(job, run_id, client=..., namespace=...)`` before each pod of the run
   starts: the staging pod (`KubernetesBackend.stage`), every rank's training pod
   (`operator.SatTrainingPodOperator.execute`) and the upload pod (`upload_outputs`). It
   creates the `kubernetes.io/dockerconfigjson` Secret `names.registry_secret_name` with the
   run's labels, or patches it when it exists (another rank, a retry, a changed password).
2. Every pod of the run references it by name (`imagePullSecrets`); nothing else holds it.
3. ``cleanup.cleanup_run`` deletes it with the run's other objects; a run kept warm keeps it
   for its placeholders and ``warm.release_warm`` deletes it with the kept claim.

The login is the job's own connection or a shared one (`spec.model.registry_conn_id_problem`,
the rule of the image check); its credentials go only to the registry host the connection
names (`io.registry.registry_access_from_connection`). The password never reaches a log,
an XCom, an error message or a rendered manifest: `sat render` prints the reference only,
the Secret's body is built here and sent, the API's answers (which echo the body) are not
read or logged, and an API error becomes a message with its status only. In a task, the
encoded forms are given to Airflow's secrets masker too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.config import shared_registry_connections
from sat_tasks.core.handoffs import Log
from sat_tasks.errors import JobStopped, SatError
from sat_tasks.spec import TrainingJob
from sat_tasks.spec.model import registry_conn_id_problem

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api

SECRET_TYPE = "kubernetes.io/dockerconfigjson"
SECRET_KEY = ".dockerconfigjson"
DOCKER_HUB_KEY = "https://index.docker.io/v1/"  # the key Docker and the kubelet use for Docker Hub
ANNOTATION_REGISTRY_CONNECTION = "sat.ai/registry-connection"


class PullSecretFailed(SatError, RuntimeError):
    """The run's image pull Secret could not be created or updated; the message names it and the API's status."""


def pull_secret_refs(job: TrainingJob, run_id: str) -> list[dict[str, str]]:
    """`imagePullSecrets` entries for a pod of the run: the run's pull Secret when the job has a registry login."""
    return [{"name": names.registry_secret_name(job, run_id)}] if job.image.registry_conn_id else []


def registry_key(image_url: str) -> str:
    """The `auths` key of `image_url`'s registry: `host[:port]`, Docker's own key for Docker Hub."""
    from sat_tasks.io.registry import DOCKER_HUB_API_HOST, parse_image_reference

    image = parse_image_reference(image_url)
    return DOCKER_HUB_KEY if image.api_host == DOCKER_HUB_API_HOST else image.registry


def dockerconfigjson(registry: str, username: str | None, password: str | None) -> str:
    """The Secret's `.dockerconfigjson` value, base64 of `{"auths": {registry: {...}}}` (no credentials: no entry)."""
    auths: dict[str, Any] = {}
    if username or password:
        user, secret = username or "", password or ""
        auths[registry] = {"username": user, "password": secret,
                           "auth": base64.b64encode(f"{user}:{secret}".encode()).decode()}
    return base64.b64encode(json.dumps({"auths": auths}, sort_keys=True).encode()).decode()


def pull_secret_manifest(job: TrainingJob, *, run_id: str, namespace: str, encoded: str) -> dict[str, Any]:
    """The Secret (`encoded`: `dockerconfigjson(...)`) with the run's labels; never printed (`sat render` omits it)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
        "metadata": {"name": names.registry_secret_name(job, run_id), "namespace": namespace,
                     "labels": names.registry_secret_labels(job, run_id),
                     "annotations": {names.ANNOTATION_RUN_ID: run_id,
                                     ANNOTATION_REGISTRY_CONNECTION: job.image.registry_conn_id or ""}},
        "data": {SECRET_KEY: encoded},
    }


def _default_get_connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def _mask(*values: str) -> None:
    """Give the encoded credentials to Airflow's secrets masker (it masks the raw password already)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - outside Airflow nothing logs task output
        return
    for value in values:
        mask_secret(value)


def ensure_pull_secret(
    job: TrainingJob,
    run_id: str,
    *,
    client: CoreV1Api,
    namespace: str,
    log: Log = print,
    get_connection: Callable[[str], Any] | None = None,
) -> str | None:
    """Create (or patch) the run's pull Secret from the job's registry login; its name, None without a login.

    Raises JobStopped when the job names a login it may not use (neither its own nor shared:
    the image check stops such a run first) or one without a host; PullSecretFailed when the
    API refuses the Secret (status and reason only: the API's answer would echo the body).
    """
    from sat_tasks.io.registry import (
        RegistryLoginRefused,
        registry_access_from_connection,
    )

    conn_id = job.image.registry_conn_id
    if not conn_id:
        return None
    problem = registry_conn_id_problem(job, shared_registry_connections())
    if problem:
        raise JobStopped(f"{job.name}: no image pull Secret: {problem}")
    conn = (get_connection or _default_get_connection)(conn_id)
    try:
        access = registry_access_from_connection(conn, job.image.url, conn_id)
    except RegistryLoginRefused as exc:
        raise JobStopped(f"{job.name}: no image pull Secret: {exc}") from None
    registry = registry_key(job.image.url)
    encoded = dockerconfigjson(registry, access.username, access.password)
    if access.username or access.password:
        _mask(encoded, json.loads(base64.b64decode(encoded))["auths"][registry]["auth"])
    body = pull_secret_manifest(job, run_id=run_id, namespace=namespace, encoded=encoded)
    name = body["metadata"]["name"]
    verb = _create_or_patch(client, namespace, name, body, conn_id)
    what = f"the login of {access.username!r}" if access.username else (
        "a token" if access.password else "no credentials (the connection is for another registry)")
    log(f"image pull Secret {namespace}/{name} {verb}: registry login {conn_id} for {registry}, {what}")
    return name


def _create_or_patch(client: CoreV1Api, namespace: str, name: str, body: dict[str, Any], conn_id: str) -> str:
    """Create the Secret; on 409 merge-patch its data, labels and annotations. 'created' or 'updated'.

    The answers are never read (`_preload_content=False`): the client logs a read answer at
    DEBUG, and the answer to a Secret's create or patch is the Secret with its data.
    """
    from kubernetes.client.exceptions import ApiException

    def refused(exc: ApiException, verb: str) -> PullSecretFailed:
        return PullSecretFailed(f"could not {verb} the image pull Secret {namespace}/{name} for registry login "
                                f"{conn_id}: {exc.status} {exc.reason}")

    try:
        _release(client.create_namespaced_secret(namespace, body, _preload_content=False))
        return "created"
    except ApiException as exc:
        if exc.status != 409:
            raise refused(exc, "create") from None
    patch = {"metadata": {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]},
             "data": body["data"]}
    try:
        _release(client.patch_namespaced_secret(name, namespace, patch, _preload_content=False))
    except ApiException as exc:
        raise refused(exc, "update") from None
    return "updated"


def _release(response: Any) -> None:
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()


def delete_pull_secret(client: CoreV1Api, namespace: str, name: str) -> list[str]:
    """Delete a pull Secret (already gone, 404, is skipped); `secret/<name>` when deleted."""
    from kubernetes.client.exceptions import ApiException

    try:
        _release(client.delete_namespaced_secret(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status != 404:
            raise
        return []
    return [f"secret/{name}"]
