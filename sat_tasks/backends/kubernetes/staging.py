"""The run's helper pods on the cluster: fill the run's volume from Object Storage, and upload its outputs back.

On the `kubernetes` backend the Airflow worker's disk is not what the training pods mount,
so the files move from inside the cluster, in short-lived pods of SAT's Airflow image that
run `python -m sat_tasks.io.staging` with the run's claim mounted. Call order:

1. ``ensure_run_volume(job, run_id, client=..., namespace=...)``: create the run's claim
   (``pods.render_run_volume_claim``); one that exists already (409) is kept.
2. ``stage_into_volume(...)``: the staging pod (``build_staging_pod``) copies the script and
   the data into the claim's sub-paths the attempts mount, then runs the expectation suite
   where the data is; returns its report. With ``warm`` (a ``WarmSource``: the claim a warm
   run of the job kept, ADR 0015) the pod also mounts that claim's data read-only and copies
   the objects whose ETag did not change from it instead of downloading them.
3. ``upload_from_volume(...)`` after training: the upload pod (``build_upload_pod``) copies the
   output sub-path to `<results>/<job>/<run_id>/output/`; returns its report.

Each helper pod is waited for (bounded) and its log passed on; ``HelperPodFailed`` when it
fails, cannot start or runs out of time. The Object Storage keys reach a pod only as
``secretKeyRef``s. `client` is a CoreV1Api (``client.core_v1_client()``; a fake in tests).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.pods import (
    object_storage_key_env,
    render_run_volume_claim,
)
from sat_tasks.backends.kubernetes.pull_secret import pull_secret_refs
from sat_tasks.backends.kubernetes.settings import (
    KubernetesSettings,
    container_security_context,
    pod_security_context,
)
from sat_tasks.core.handoffs import Log
from sat_tasks.core.runtime_env import POD_CODE_DIR, POD_DATA_DIR, POD_OUTPUT_DIR
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.staging import REPORT_PREFIX
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import CoreV1Api

HELPER_CONTAINER = "stage"
# Container waiting reasons that will not fix themselves while we wait.
_STUCK_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                  "CreateContainerError"}
_LOG_TAIL_LINES = 40


class HelperPodFailed(SatError, RuntimeError):
    """A staging or upload pod failed, could not start, or did not finish in time; the message says which."""


POD_WARM_DATA_DIR = "/opt/sat/warm-data"  # the warm run's staged data, read-only, in the staging pod


@dataclass(frozen=True)
class WarmSource:
    """The staged data a warm run of the job kept: its claim, its run id (the sub-path) and `{key: ETag}`."""

    claim: str
    run_id: str
    objects: dict[str, str] = field(default_factory=dict)


def warm_claim_usable(client: CoreV1Api, namespace: str, claim: str) -> bool:
    """Whether the kept claim is still there (not deleted by hand, not terminating)."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = client.read_namespaced_persistent_volume_claim(claim, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return not getattr(found.metadata, "deletion_timestamp", None)




def ensure_run_volume(
    job: TrainingJob, run_id: str, *, client: CoreV1Api, namespace: str, settings: KubernetesSettings | None = None,
) -> bool:
    """Create the run's claim; True when created, False when it existed already (a rerun)."""
    from kubernetes.client.exceptions import ApiException

    claim = render_run_volume_claim(job, run_id=run_id, namespace=namespace, settings=settings)
    try:
        client.create_namespaced_persistent_volume_claim(namespace, claim)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def staging_pod_name(job: TrainingJob, run_id: str) -> str:
    """`sat-<job>-<run hash>-stage`: the claim's name with `-stage` for `-data` (one pod per run)."""
    return names.helper_pod_name(job, run_id, "stage")


def upload_pod_name(job: TrainingJob, run_id: str) -> str:
    """`sat-<job>-<run hash>-upload` (one per run)."""
    return names.helper_pod_name(job, run_id, "upload")


def _helper_pod(job: TrainingJob, run_id: str, *, name: str, purpose: str, args: list[str],
                mounts: dict[str, str], namespace: str, settings: KubernetesSettings,
                pvc_name: str | None, warm: WarmSource | None = None) -> dict[str, Any]:
    """A helper pod running `python -m sat_tasks.io.staging <args>` with claim sub-paths mounted.

    `warm`: the warm run's claim, mounted read-only at `POD_WARM_DATA_DIR` (its data sub-path).
    A node-local volume's PV node affinity puts the pod on the node that has it; the run's
    own new claim, bound on first use, follows it there.
    """
    subpaths = names.run_volume_subpaths(job, run_id)
    volume_mounts = [{"name": "run", "mountPath": path, "subPath": subpaths[part]} for part, path in mounts.items()]
    volumes: list[dict[str, Any]] = [{"name": "run", "persistentVolumeClaim": {
        "claimName": pvc_name or names.run_volume_claim_name(job, run_id)}}]
    if warm is not None:
        volume_mounts.append({"name": "warm", "mountPath": POD_WARM_DATA_DIR, "readOnly": True,
                              "subPath": names.run_volume_subpaths(job, warm.run_id)["data"]})
        volumes.append({"name": "warm", "persistentVolumeClaim": {"claimName": warm.claim, "readOnly": True}})
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if settings.object_storage_endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": settings.object_storage_endpoint})  # boto3 reads it
    env += object_storage_key_env(settings)
    # SAT's image with its own Secret, and the run's pull Secret from the job's registry login (ADR 0032).
    pull_secrets = ([{"name": settings.staging_pull_secret}] if settings.staging_pull_secret else []) + [
        ref for ref in pull_secret_refs(job, run_id) if ref["name"] != settings.staging_pull_secret]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**names.run_labels(job, run_id), names.LABEL_COMPONENT: purpose},
                     "annotations": {names.ANNOTATION_RUN_ID: run_id}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": HELPER_CONTAINER,
                "image": settings.staging_image,
                "command": ["python", "-m", "sat_tasks.io.staging", *args],
                "env": env,
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
                "volumeMounts": volume_mounts,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": container_security_context(),
            }],
            # Pod Security "restricted" (ADR 0040): the Airflow image's own non-root user, SAT's fsGroup.
            "securityContext": pod_security_context(settings, run_as_user=settings.staging_run_as_user),
            "volumes": volumes,
            **({"imagePullSecrets": pull_secrets} if pull_secrets else {}),
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
        },
    }


def build_staging_pod(
    job: TrainingJob, run_id: str, *, namespace: str, settings: KubernetesSettings, pvc_name: str | None = None,
    warm: WarmSource | None = None,
) -> dict[str, Any]:
    """The staging pod as a plain manifest (schema-valid; no key in it, only Secret references).

    With `warm` it mounts the warm run's claim read-only and passes `--reuse-dir` and
    `--reuse-objects` (the warm run's `{key: ETag}`, JSON): unchanged objects are copied from
    there and verified, the others downloaded.
    """
    args = ["stage", "--source", job.data.source, "--dest", POD_DATA_DIR, "--code-dest", POD_CODE_DIR]
    if job.data.expectation_suite:
        args += ["--suite", job.data.expectation_suite]
    if job.storage.script_url:
        args += ["--script-url", job.storage.script_url]
    if warm is not None:
        args += ["--reuse-dir", POD_WARM_DATA_DIR,
                 "--reuse-objects", json.dumps(warm.objects, sort_keys=True, separators=(",", ":"))]
    args.append("--validate")  # the suite runs where the data is: in this pod
    return _helper_pod(job, run_id, name=staging_pod_name(job, run_id), purpose="staging", args=args,
                       mounts={"data": POD_DATA_DIR, "code": POD_CODE_DIR}, namespace=namespace,
                       settings=settings, pvc_name=pvc_name, warm=warm)


def build_upload_pod(
    job: TrainingJob, run_id: str, *, namespace: str, settings: KubernetesSettings, pvc_name: str | None = None,
) -> dict[str, Any]:
    """The upload pod: the run's output sub-path to `<results>/<job>/<run_id>/output/`."""
    args = ["upload", "--source", POD_OUTPUT_DIR, "--dest", JobRun(job, run_id).output_uri]
    return _helper_pod(job, run_id, name=upload_pod_name(job, run_id), purpose="upload", args=args,
                       mounts={"output": POD_OUTPUT_DIR}, namespace=namespace, settings=settings, pvc_name=pvc_name)


def stage_into_volume(job: TrainingJob, run_id: str, *, client: CoreV1Api, namespace: str, log: Log = print,
                      settings: KubernetesSettings | None = None, pvc_name: str | None = None,
                      warm: WarmSource | None = None, **wait: Any) -> dict[str, Any]:
    """Run the staging pod to completion and return its report (what `stage_data` returns).

    `warm`: a warm run's kept claim to copy unchanged objects from; one that is gone is
    skipped (everything is downloaded, as without a warm run).
    """
    settings = settings or KubernetesSettings.from_sat_config()
    if warm is not None and not warm_claim_usable(client, namespace, warm.claim):
        log(f"warm pool: volume claim {warm.claim} of run {warm.run_id} is gone: the data is downloaded")
        warm = None
    pod = build_staging_pod(job, run_id, namespace=namespace, settings=settings, pvc_name=pvc_name, warm=warm)
    log(f"staging pod {namespace}/{pod['metadata']['name']} ({settings.staging_image}): "
        f"{job.data.source} -> {POD_DATA_DIR}")
    if warm is not None:
        log(f"warm pool: the staging pod mounts volume claim {warm.claim} of run {warm.run_id} read-only "
            f"at {POD_WARM_DATA_DIR}: {len(warm.objects)} object(s) it staged are copied from it where unchanged")
    return run_helper_pod(pod, client=client, log=log, settings=settings, **wait)


def upload_from_volume(job: TrainingJob, run_id: str, *, client: CoreV1Api, namespace: str, log: Log = print,
                       settings: KubernetesSettings | None = None, pvc_name: str | None = None,
                       **wait: Any) -> dict[str, Any]:
    """Run the upload pod to completion and return its transfer report (what `upload_results` returns)."""
    settings = settings or KubernetesSettings.from_sat_config()
    pod = build_upload_pod(job, run_id, namespace=namespace, settings=settings, pvc_name=pvc_name)
    log(f"upload pod {namespace}/{pod['metadata']['name']}: {POD_OUTPUT_DIR} -> {JobRun(job, run_id).output_uri}")
    return run_helper_pod(pod, client=client, log=log, settings=settings, **wait)


def run_helper_pod(
    pod: dict[str, Any],
    *,
    client: CoreV1Api,
    log: Log = print,
    settings: KubernetesSettings,
    timeout_seconds: float = 6 * 3600,
    poll_seconds: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run a helper pod to completion and return the report it printed last.

    A leftover pod of an earlier try is deleted first. The pod is deleted when it succeeds
    or times out; a failed pod is kept for `kubectl describe` / `kubectl logs` (the run's
    cleanup deletes it).
    """
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    deadline = clock() + timeout_seconds
    _delete_leftover(client, name, namespace, deadline=deadline, poll_seconds=poll_seconds, sleep=sleep, clock=clock)
    client.create_namespaced_pod(namespace, pod)
    phase, stuck = _await_pod(client, name, namespace, deadline=deadline, poll_seconds=poll_seconds,
                              sleep=sleep, clock=clock)
    lines = [] if stuck else _read_log(client, name, namespace)
    for line in lines:
        if not line.startswith(REPORT_PREFIX):
            log(line)
    if phase == "Succeeded":
        _delete(client, name, namespace)
        reports = [line[len(REPORT_PREFIX):] for line in lines if line.startswith(REPORT_PREFIX)]
        if not reports:
            raise HelperPodFailed(f"pod {namespace}/{name} succeeded but printed no report")
        return json.loads(reports[-1])
    tail = "\n".join(lines[-_LOG_TAIL_LINES:])
    if phase == "Failed":
        raise HelperPodFailed(f"pod {namespace}/{name} failed{_exit_detail(client, name, namespace)}"
                              + (f":\n{tail}" if tail else ""))
    _delete(client, name, namespace)
    if stuck:
        raise HelperPodFailed(f"pod {namespace}/{name} cannot start: {stuck} "
                              f"(image {settings.staging_image}, Secret {settings.object_storage_secret})")
    raise HelperPodFailed(f"pod {namespace}/{name} did not finish within {timeout_seconds:.0f}s "
                          f"(phase {phase}); deleted" + (f":\n{tail}" if tail else ""))


# ---- steps -------------------------------------------------------------------------------------
def _await_pod(client: CoreV1Api, name: str, namespace: str, *, deadline: float, poll_seconds: float,
               sleep: Callable[[float], None], clock: Callable[[], float]) -> tuple[str, str | None]:
    """Poll until the pod ends, cannot start, or the deadline passes: (phase, stuck reason or None)."""
    phase = "Pending"
    while True:
        status = client.read_namespaced_pod(name, namespace).status
        phase = (status.phase if status else None) or "Pending"
        if phase in ("Succeeded", "Failed"):
            return phase, None
        stuck = _stuck_reason(status)
        if stuck:
            return phase, stuck
        if clock() >= deadline:
            return phase, None
        sleep(poll_seconds)


def _stuck_reason(status: Any) -> str | None:
    for container in (status.container_statuses or []) if status else []:
        waiting = container.state.waiting if container.state else None
        if waiting and waiting.reason in _STUCK_REASONS:
            return f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return None


def _exit_detail(client: CoreV1Api, name: str, namespace: str) -> str:
    status = client.read_namespaced_pod(name, namespace).status
    for container in (status.container_statuses or []) if status else []:
        terminated = container.state.terminated if container.state else None
        if terminated:
            return f" (exit status {terminated.exit_code}{', ' + terminated.reason if terminated.reason else ''})"
    return ""


def _read_log(client: CoreV1Api, name: str, namespace: str) -> list[str]:
    """The helper pod's log lines. Raw bytes, decoded here: with content preloading the
    kubernetes client (36) returns the repr of the bytes ("b'...'"), kubernetes-client/python#2596,
    and the report line would never be found."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = client.read_namespaced_pod_log(name, namespace, container=HELPER_CONTAINER,
                                                  _preload_content=False)
    except ApiException:
        return []
    try:
        data = response.data if hasattr(response, "data") else response
    finally:
        release = getattr(response, "release_conn", None)
        if release is not None:
            release()
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)
    return text.splitlines()


def _delete(client: CoreV1Api, name: str, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        client.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def _delete_leftover(client: CoreV1Api, name: str, namespace: str, *, deadline: float, poll_seconds: float,
                     sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    """Delete a staging pod left by an earlier try and wait until it is gone (its name is fixed)."""
    from kubernetes.client.exceptions import ApiException

    if not _delete(client, name, namespace):
        return
    while clock() < deadline:
        try:
            client.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        sleep(poll_seconds)
    raise HelperPodFailed(f"the earlier pod {namespace}/{name} is still terminating")
