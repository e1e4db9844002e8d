"""Stage a job run's script and data into its Kubernetes run volume with a short-lived staging pod.

On the `kubernetes` backend the Airflow worker's disk is not what the training pods mount,
so `pipeline.stage_data` fills the run's claim from inside the cluster instead. Call order:

1. ``ensure_run_volume(job, run_id, client=..., namespace=...)``: create the run's claim
   (``k8s.render_run_volume_claim``); one that exists already (409) is kept.
2. ``stage_into_volume(job, run_id, client=..., namespace=..., log=...)``: run the staging
   pod (``build_staging_pod``: ``python -m sat_tasks.stage_cli`` in SAT's Airflow image, the
   claim mounted at the data and code sub-paths the attempts use, the Object Storage keys
   only as ``secretKeyRef``), wait for it (bounded), pass its log on, and return the report;
   ``StagingFailed`` when it fails, cannot start or runs out of time.

`client` is a CoreV1Api (``k8s_launch.core_v1_client()`` in the DAG; a fake in tests).
Nothing here imports Airflow or the kubernetes client at module level.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from sat_tasks import k8s
from sat_tasks.runtime_env import POD_CODE_DIR, POD_DATA_DIR
from sat_tasks.spec import TrainingJob
from sat_tasks.stage_cli import REPORT_PREFIX

Log = Callable[[str], None]
STAGING_CONTAINER = "stage"
# Container waiting reasons that will not fix themselves while we wait.
_STUCK_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                  "CreateContainerError"}
_LOG_TAIL_LINES = 40


class StagingFailed(RuntimeError):
    """The staging pod failed, could not start, or did not finish in time; the message says which."""


def ensure_run_volume(
    job: TrainingJob, run_id: str, *, client: Any, namespace: str, settings: k8s.KubernetesSettings | None = None,
) -> bool:
    """Create the run's claim; True when created, False when it existed already (a rerun)."""
    from kubernetes.client.exceptions import ApiException

    claim = k8s.render_run_volume_claim(job, run_id=run_id, namespace=namespace, settings=settings)
    try:
        client.create_namespaced_persistent_volume_claim(namespace, claim)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def staging_pod_name(job: TrainingJob, run_id: str) -> str:
    """`sat-<job>-<run hash>-stage`: the claim's name with `-stage` for `-data` (one pod per run)."""
    return k8s.run_volume_claim_name(job, run_id).removesuffix("-data") + "-stage"


def build_staging_pod(
    job: TrainingJob, run_id: str, *, namespace: str, settings: k8s.KubernetesSettings, pvc_name: str | None = None,
) -> dict[str, Any]:
    """The staging pod as a plain manifest (schema-valid; no key in it, only Secret references)."""
    from kubernetes.client import ApiClient

    subpaths = k8s.run_volume_subpaths(job, run_id)
    args = ["--source", job.data.source, "--dest", POD_DATA_DIR, "--code-dest", POD_CODE_DIR]
    if job.data.expectation_suite:
        args += ["--suite", job.data.expectation_suite]
    if job.storage.script_url:
        args += ["--script-url", job.storage.script_url]
    args.append("--validate")  # the suite runs where the data is: in this pod
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if settings.object_storage_endpoint:
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": settings.object_storage_endpoint})  # boto3 reads it
    env += ApiClient().sanitize_for_serialization(k8s.object_storage_key_env(settings))
    labels = {k8s.LABEL_JOB: job.name, k8s.LABEL_RUN_ID: k8s.label_value(run_id),
              **k8s.MANAGED_BY, "app.kubernetes.io/component": "staging"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": staging_pod_name(job, run_id), "namespace": namespace, "labels": labels,
                     "annotations": {k8s.ANNOTATION_RUN_ID: run_id}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": STAGING_CONTAINER,
                "image": settings.staging_image,
                "command": ["python", "-m", "sat_tasks.stage_cli", *args],
                "env": env,
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
                "volumeMounts": [
                    {"name": "run", "mountPath": POD_DATA_DIR, "subPath": subpaths["data"]},
                    {"name": "run", "mountPath": POD_CODE_DIR, "subPath": subpaths["code"]},
                ],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [{"name": "run", "persistentVolumeClaim": {
                "claimName": pvc_name or k8s.run_volume_claim_name(job, run_id)}}],
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
        },
    }


def stage_into_volume(
    job: TrainingJob,
    run_id: str,
    *,
    client: Any,
    namespace: str,
    log: Log = print,
    settings: k8s.KubernetesSettings | None = None,
    pvc_name: str | None = None,
    timeout_seconds: float = 6 * 3600,
    poll_seconds: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run the staging pod to completion and return its report (what `stage_data` returns).

    A leftover pod of an earlier try is deleted first. The pod is deleted when it succeeds
    or times out; a failed pod is kept for `kubectl describe` / `kubectl logs`.
    """
    settings = settings or k8s.KubernetesSettings.from_sat_config()
    pod = build_staging_pod(job, run_id, namespace=namespace, settings=settings, pvc_name=pvc_name)
    name = pod["metadata"]["name"]
    deadline = clock() + timeout_seconds
    _delete_leftover(client, name, namespace, deadline=deadline, poll_seconds=poll_seconds, sleep=sleep, clock=clock)
    client.create_namespaced_pod(namespace, pod)
    log(f"staging pod {namespace}/{name} ({settings.staging_image}): {job.data.source} -> {POD_DATA_DIR}")
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
            raise StagingFailed(f"staging pod {namespace}/{name} succeeded but printed no report")
        return json.loads(reports[-1])
    tail = "\n".join(lines[-_LOG_TAIL_LINES:])
    if phase == "Failed":
        raise StagingFailed(f"staging pod {namespace}/{name} failed{_exit_detail(client, name, namespace)}"
                            + (f":\n{tail}" if tail else ""))
    _delete(client, name, namespace)
    if stuck:
        raise StagingFailed(f"staging pod {namespace}/{name} cannot start: {stuck} "
                            f"(image {settings.staging_image}, Secret {settings.object_storage_secret})")
    raise StagingFailed(f"staging pod {namespace}/{name} did not finish within {timeout_seconds:.0f}s "
                        f"(phase {phase}); deleted" + (f":\n{tail}" if tail else ""))


# ---- steps -------------------------------------------------------------------------------------
def _await_pod(client: Any, name: str, namespace: str, *, deadline: float, poll_seconds: float,
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


def _exit_detail(client: Any, name: str, namespace: str) -> str:
    status = client.read_namespaced_pod(name, namespace).status
    for container in (status.container_statuses or []) if status else []:
        terminated = container.state.terminated if container.state else None
        if terminated:
            return f" (exit status {terminated.exit_code}{', ' + terminated.reason if terminated.reason else ''})"
    return ""


def _read_log(client: Any, name: str, namespace: str) -> list[str]:
    from kubernetes.client.exceptions import ApiException

    try:
        text = client.read_namespaced_pod_log(name, namespace, container=STAGING_CONTAINER)
    except ApiException:
        return []
    return text.splitlines()


def _delete(client: Any, name: str, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        client.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def _delete_leftover(client: Any, name: str, namespace: str, *, deadline: float, poll_seconds: float,
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
    raise StagingFailed(f"the earlier staging pod {namespace}/{name} is still terminating")
