"""The pods of an attempt (and its rendezvous Service), and the run's volume claim: built once, rendered and launched from the same objects.

Call order for one attempt (the DAG does the wiring):

1. ``render_run_volume_claim(job, run_id=...)`` once per job run: the ReadWriteMany claim
   that staging fills (``names.run_volume_subpaths``) and every attempt mounts.
2. ``render_attempt_manifests(job, run_id=..., plan=...)`` (the attempt's `Plan`):
   for one node a single Pod; for ``nodes >= 2`` a headless Service first, then one Pod per
   node rank with a stable DNS name (hostname + subdomain) and launcher rendezvous on rank 0.
   ``ranks`` (default ``job.nodes``): an elastic failover that resumes on fewer nodes (ADR 0029)
   renders that many pods, its rendezvous for that many ranks, and the gradient accumulation
   scale that keeps the global batch.
   ``attempt_pod_manifests`` / ``rendezvous_service`` are the objects behind it: the operator
   launches exactly these (``build_attempt_pods`` makes client models of them for
   ``operator.SatTrainingPodOperator``), `sat render` prints them.

Everything is built as the API's JSON, so nothing here talks to a cluster, imports Airflow,
or (except `build_attempt_pods` and `to_model`) imports the kubernetes client, which costs
~0.8 s. ADR 0007 explains the choices.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ckpt_engine.contract import (
    NODE_ENV,
    NODES_ENV,
    POD_NAME_ENV,
    PROGRESS_FILE_ENV,
    RUN_ID_ENV,
)
from ckpt_engine.integrations.elastic import ACCUMULATION_SCALE_ENV
from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.pull_secret import pull_secret_refs
from sat_tasks.backends.kubernetes.settings import (
    DEFAULT_NAMESPACE,
    KubernetesSettings,
    container_security_context,
    pod_security_context,
)
from sat_tasks.backends.kubernetes.supervisor import (
    POD_ANNOTATIONS_ENV,
    POD_INFO_DIR,
    PROGRESS_FILE,
    launch_command,
    nproc_per_node,
    supervisor_script,
    training_probes,
)
from sat_tasks.backends.kubernetes.workspace import (
    workspace_pod_metadata,
    workspace_scheduling,
)
from sat_tasks.core.attempt import MAIN_CONTAINER_NAME
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.runtime_env import (
    IMAGE_VENDOR_DIR,
    POD_CODE_DIR,
    POD_DATA_DIR,
    POD_METRICS_DIR,
    POD_OUTPUT_DIR,
    TrainingPaths,
    pod_grace_seconds,
    training_environment,
)
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SERVER_TYPES, TrainingJob
from sat_tasks.spec.file_storage import volume_of
from sat_tasks.spec.quantities import format_bytes, quantity_bytes

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import models as k8s

# Env var -> key in the Object Storage Secret (`KubernetesSettings.object_storage_secret`).
OBJECT_STORAGE_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key"}
# Env var -> key in an attempt's own Secret (`names.attempt_credentials_name`, ADR 0020).
ATTEMPT_SECRET_KEYS = {**OBJECT_STORAGE_SECRET_KEYS, "AWS_SESSION_TOKEN": "session_token"}


def pod_memory(job: TrainingJob) -> str:
    """Memory request = limit of a pod: the spec's memory plus `/dev/shm`.

    Kubernetes charges a `medium: Memory` emptyDir to the pod's memory limit, so a full
    `/dev/shm` would otherwise OOM-kill a process that stays within `resources.memory`.
    """
    return format_bytes(quantity_bytes(job.resources.memory) + quantity_bytes(job.resources.shared_memory))


def _env(
    job: TrainingJob,
    *,
    plan: Plan,
    rank: int,
    service: str | None,
    namespace: str,
    run_id: str,
    settings: KubernetesSettings,
    ranks: int,
) -> list[dict[str, Any]]:
    paths = TrainingPaths(data_dir=POD_DATA_DIR, output_dir=POD_OUTPUT_DIR, code_dir=POD_CODE_DIR,
                          vendor_dir=IMAGE_VENDOR_DIR)
    # NODE_ENV is the Kubernetes node the pod lands on; the downward API fills it in.
    contract = training_environment(
        job, paths, plan, node="", mirror_url=JobRun(job, run_id).mirror_uri,
        s3_endpoint_url=settings.object_storage_endpoint or None,
        # the recorder in the training process writes here and copies to Object Storage every interval
        metrics_dir=POD_METRICS_DIR, metrics_url=JobRun(job, run_id).metrics_uri,
    )
    # the node's metrics sidecar watches it for the attempt's first training step
    contract[PROGRESS_FILE_ENV] = PROGRESS_FILE
    if ranks < job.nodes:  # an elastic failover on fewer nodes (ADR 0029): the global batch stays the planned one
        contract[NODES_ENV] = str(ranks)
        contract[ACCUMULATION_SCALE_ENV] = str(job.nodes // ranks)
        contract[POD_ANNOTATIONS_ENV] = f"{POD_INFO_DIR}/annotations"  # PID 1 watches it to grow back (supervisor)
    field_refs = {NODE_ENV: "spec.nodeName", POD_NAME_ENV: "metadata.name"}
    env = [{"name": k, "value": v} for k, v in contract.items() if k not in field_refs]
    env.append({"name": RUN_ID_ENV, "value": run_id})
    if job.distributed:
        master = f"{service}-r0.{service}.{namespace}.svc"  # rank 0's stable DNS name
        rendezvous = {
            "MASTER_ADDR": master,
            "MASTER_PORT": str(settings.master_port),
            "NODE_RANK": str(rank),
            "NNODES": str(ranks),
            "NPROC_PER_NODE": str(nproc_per_node(job)),
        }
        for key, value in rendezvous.items():
            env.append({"name": key, "value": value})
            env.append({"name": f"PET_{key}", "value": value})  # torchrun's env defaults
    for key, path in field_refs.items():
        env.append({"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    env += training_key_env(job, run_id=run_id, attempt=plan.attempt, settings=settings)
    return env


def object_storage_key_env(settings: KubernetesSettings) -> list[dict[str, Any]]:
    """`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` as references into the Object Storage Secret.

    The kubelet resolves them when the container starts: the keys never appear in the pod
    spec, a rendered manifest, an XCom or a log. A missing Secret (or key) keeps the pod
    from starting (`CreateContainerConfigError`) instead of training without its mirror.
    """
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": settings.object_storage_secret, "key": key}}}
            for name, key in OBJECT_STORAGE_SECRET_KEYS.items()]


def training_key_env(job: TrainingJob, *, run_id: str, attempt: int, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """A training pod's Object Storage keys: references into its attempt's own Secret (ADR 0020).

    The launch task creates that Secret (`attempt_credentials_secret`) before the pods, with
    the temporary credentials STS issued for the run's prefixes only; `cleanup_attempt`
    deletes it. With `[sat] scoped_credentials = off`: the shared Secret, as SAT's own pods.
    """
    from sat_tasks.io.scoped_credentials import scoped_credentials_on

    if not scoped_credentials_on():
        return object_storage_key_env(settings)
    secret = names.attempt_credentials_name(job, run_id, attempt)
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
            for name, key in ATTEMPT_SECRET_KEYS.items()]


def attempt_credentials_secret(job: TrainingJob, *, run_id: str, attempt: int, namespace: str,
                               credentials: dict[str, str]) -> dict[str, Any]:
    """The attempt's Secret: `credentials` (`io.scoped_credentials.training_credentials`) under the
    keys `training_key_env` references, and the attempt's labels (its cleanup deletes it). Never
    rendered by `sat render`: it exists only while the attempt does."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": names.attempt_credentials_name(job, run_id, attempt), "namespace": namespace,
                     "labels": names.labels(job, run_id, attempt)},
        "stringData": {key: credentials[name] for name, key in ATTEMPT_SECRET_KEYS.items() if name in credentials},
    }


def _resources(job: TrainingJob, settings: KubernetesSettings) -> dict[str, Any]:
    # requests == limits: Guaranteed QoS, the last class the kubelet evicts under pressure.
    amounts = {"cpu": job.resources.cpu, "memory": pod_memory(job)}
    if job.resources.gpus_per_node:
        amounts[settings.gpu_resource] = str(job.resources.gpus_per_node)
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _scheduling(
    job: TrainingJob, exclude_nodes: Sequence[str], settings: KubernetesSettings,
    quarantined_nodes: Sequence[str] = (),
) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, Any] | None]:
    """Node selector, tolerations and node affinity for the server type, capacity, exclusions and quarantine.

    The nodes of failed attempts and the nodes the node health ledger quarantined
    (`sat_tasks.io.node_ledger`) are one required `kubernetes.io/hostname NotIn` expression.
    """
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    expressions: list[dict[str, Any]] = []
    gpu_model = SERVER_TYPES[job.resources.server_type]["gpu_model"]
    if gpu_model:
        selector[settings.gpu_product_label] = gpu_model
    if job.resources.gpus_per_node:
        tolerations.append({"effect": "NoSchedule", "key": settings.gpu_taint_key, "operator": "Exists"})
    if job.is_spot:
        selector[settings.capacity_label] = settings.spot_label_value
        tolerations.append({"effect": "NoSchedule", "key": settings.spot_taint_key, "operator": "Equal",
                            "value": settings.spot_taint_value})
    else:
        # On-demand: anything but Spot, so unlabelled on-demand nodes qualify too.
        expressions.append({"key": settings.capacity_label, "operator": "NotIn",
                            "values": [settings.spot_label_value]})
    workspace_selector, workspace_tolerations = workspace_scheduling(job, settings)  # its reserved nodes only
    selector.update(workspace_selector)
    tolerations += workspace_tolerations
    excluded = sorted(set(exclude_nodes) | set(quarantined_nodes))
    if excluded:
        expressions.append({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": excluded})
    affinity = None
    if expressions:
        # One selector term: terms are ORed, the expressions of a term ANDed.
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}
    return selector, tolerations, affinity


def _volumes(job: TrainingJob, run_id: str, pvc_name: str | None) -> tuple[list[dict], list[dict]]:
    claim = pvc_name or names.run_volume_claim_name(job, run_id)
    subpaths = names.run_volume_subpaths(job, run_id)
    volumes = [
        {"name": "run", "persistentVolumeClaim": {"claimName": claim}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.resources.shared_memory}},
    ]
    mounts = [
        {"mountPath": POD_DATA_DIR, "name": "run", "subPath": subpaths["data"]},
        {"mountPath": POD_OUTPUT_DIR, "name": "run", "subPath": subpaths["output"]},
        {"mountPath": POD_CODE_DIR, "name": "run", "subPath": subpaths["code"]},
        {"mountPath": "/dev/shm", "name": "dshm"},
    ]
    if job.storage.file_storage_mount:
        # The operator's File Storage volume the job names (ADR 0040): its claim at its mount path, read-only
        # unless the operator said otherwise. Never a hostPath: a node's own directories stay out of reach.
        try:
            volume = volume_of(job.storage.file_storage_mount)
        except KeyError as exc:
            raise FileStorageUnknown(exc.args[0]) from None
        claim: dict[str, Any] = {"claimName": volume.claim}
        mount: dict[str, Any] = {"mountPath": volume.mount_path, "name": "file-storage"}
        if volume.read_only:
            claim["readOnly"] = mount["readOnly"] = True
        volumes.append({"name": "file-storage", "persistentVolumeClaim": claim})
        mounts.append(mount)
    return volumes, mounts


class FileStorageUnknown(SatError, ValueError):
    """The job names a File Storage volume the operator does not (or no longer) define; the message says which."""


def kubelet_literal(text: str) -> str:
    """``text`` escaped so the kubelet's expansion of a container's command gives it back unchanged.

    The kubelet turns ``$(VAR)`` into the variable's value and ``$$`` into ``$`` before the
    shell runs; the local backend hands the command to the shell as written. Doubling every
    ``$`` that precedes ``$`` or ``(`` makes the kubelet's pass undo exactly that, so the
    shell sees what the person wrote on either backend.
    """
    return _KUBELET_SPECIAL.sub("$$", text)


_KUBELET_SPECIAL = re.compile(r"\$(?=[$(])")


def _drop_empty(obj: dict[str, Any]) -> dict[str, Any]:
    """Leave out fields that are None (as the API's own serialisation does)."""
    return {k: v for k, v in obj.items() if v is not None}


def attempt_pod_manifests(
    job: TrainingJob,
    *,
    run_id: str,
    plan: Plan,
    namespace: str = DEFAULT_NAMESPACE,
    pvc_name: str | None = None,
    settings: KubernetesSettings | None = None,
    quarantined_nodes: Sequence[str] = (),
    ranks: int | None = None,
) -> list[dict[str, Any]]:
    """The attempt's pods, one per node rank, as the API's JSON: the single source.

    `quarantined_nodes`: nodes the node health ledger quarantined; the pods may not land there.
    `ranks`: how many node ranks the attempt runs (`attempt_ranks`; default `job.nodes`).

    `render_attempt_manifests` prints them (no kubernetes client needed, so `sat render` stays
    quick); `build_attempt_pods` turns them into client models for KubernetesPodOperator's
    `full_pod_spec`.
    """
    attempt = plan.attempt  # >= 1: the Plan says so
    settings = settings or KubernetesSettings.from_sat_config()
    ranks = attempt_ranks(job, ranks)
    service = names.attempt_name(job, run_id, attempt) if job.distributed else None
    node_selector, tolerations, affinity = _scheduling(job, plan.exclude_nodes, settings, quarantined_nodes)
    volumes, mounts = _volumes(job, run_id, pvc_name)
    if ranks < job.nodes:  # the pod's own annotations, where its PID 1 sees a planned restart to grow back
        volumes.append({"name": "sat-pod-info", "downwardAPI": {"items": [
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
        mounts.append({"mountPath": POD_INFO_DIR, "name": "sat-pod-info", "readOnly": True})
    script = supervisor_script(job, settings)
    command = launch_command(job)
    startup_probe, liveness_probe = training_probes(job)
    # The run's pull Secret, made from the job's registry login before the pods start (ADR 0032).
    pull_secrets = pull_secret_refs(job, run_id) or None

    queue_labels, queue_annotations = workspace_pod_metadata(job, run_id, attempt, settings, ranks=ranks)
    # fewer ranks than the job's nodes: said on each pod, so the attempt's record knows which ranks it ran
    ranks_annotation = {names.ANNOTATION_RANKS: str(ranks)} if ranks < job.nodes else {}
    pods = []
    for rank in range(ranks):
        name = names.pod_name(job, run_id, attempt, rank)
        container = _drop_empty({
            "command": ["bash", "-lc", script, "sat-launch", kubelet_literal(command)],
            "env": _env(job, plan=plan, rank=rank, service=service, namespace=namespace, run_id=run_id,
                        settings=settings, ranks=ranks),
            "image": job.image.url,
            "livenessProbe": liveness_probe,
            "name": MAIN_CONTAINER_NAME,
            "ports": [{"containerPort": settings.master_port, "name": "rendezvous"}] if job.distributed else None,
            "resources": _resources(job, settings),
            "securityContext": container_security_context(),
            "startupProbe": startup_probe,
            # The log tail becomes the termination message when the process leaves none.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mounts,
        })
        pods.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "annotations": {**names.annotations(job, run_id), **queue_annotations, **ranks_annotation},
                "labels": {**names.labels(job, run_id, attempt), names.LABEL_NODE_RANK: str(rank), **queue_labels},
                "name": name,
                "namespace": namespace,
            },
            "spec": _drop_empty({
                "affinity": affinity,
                # No API token: training talks to its peers and to storage, not to Kubernetes.
                "automountServiceAccountToken": False,
                "containers": [container],
                # No Service env vars (a Service named `master` would set MASTER_PORT).
                "enableServiceLinks": False,
                "hostname": name if job.distributed else None,
                "imagePullSecrets": pull_secrets,
                "nodeSelector": node_selector or None,
                "restartPolicy": "Never",
                # Pod Security "restricted" (ADR 0040): the configured non-root uid, whatever the image's USER.
                "securityContext": pod_security_context(settings, run_as_user=settings.run_as_user,
                                                        run_as_group=settings.run_as_group),
                "subdomain": service,
                "terminationGracePeriodSeconds": pod_grace_seconds(job, settings.termination_grace_seconds),
                "tolerations": tolerations or None,
                "volumes": volumes,
            }),
        })
    return pods


def attempt_ranks(job: TrainingJob, ranks: int | None) -> int:
    """How many node ranks an attempt runs: `ranks` (an elastic failover's count), else `job.nodes`.

    ValueError unless 1 <= ranks <= job.nodes and ranks divides job.nodes (the gradient
    accumulation then keeps the global batch: `core.policy.elastic_shrink` only picks such counts).
    """
    if ranks is None:
        return job.nodes
    if not 1 <= ranks <= job.nodes or job.nodes % ranks:
        raise ValueError(f"ranks: must divide nodes ({job.nodes}) and be between 1 and it, got {ranks}")
    return ranks


def build_attempt_pods(job: TrainingJob, **kwargs: Any) -> list[k8s.V1Pod]:
    """`attempt_pod_manifests` as kubernetes client models (what KubernetesPodOperator takes)."""
    return [to_model(pod, "V1Pod") for pod in attempt_pod_manifests(job, **kwargs)]


def to_model(manifest: dict[str, Any], model: str) -> Any:
    """A manifest (the API's JSON) as the kubernetes client's model named `model` (`V1Pod`)."""
    import json

    from kubernetes.client import ApiClient

    response = type("Manifest", (), {"data": json.dumps(manifest)})()
    return ApiClient().deserialize(response, model)


def rendezvous_service(job: TrainingJob, *, run_id: str, attempt: int, namespace: str,
                        settings: KubernetesSettings, ranks: int | None = None) -> dict[str, Any]:
    """Headless Service giving each rank `<pod>.<service>.<namespace>.svc`, even before it is Ready.

    Its `sat.ai/ranks` annotation is the attempt's rank count (`ranks`, default `job.nodes`): rank 0's
    launch creates the Service before any pod, so the other ranks of an elastic failover read there
    how many ranks it resumed on (`elastic.await_attempt_ranks`).
    """
    name = names.attempt_name(job, run_id, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels(job, run_id, attempt),
                     "annotations": {**names.annotations(job, run_id),
                                     names.ANNOTATION_RANKS: str(attempt_ranks(job, ranks))}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_ATTEMPT_ID: name},
            "ports": [{"name": "rendezvous", "port": settings.master_port,
                       "targetPort": settings.master_port, "protocol": "TCP"}],
        },
    }


def rendezvous_network_policy(job: TrainingJob, *, run_id: str, attempt: int, namespace: str) -> dict[str, Any]:
    """The attempt's own NetworkPolicy: its ranks may reach one another, and nothing else of the namespace may.

    The jobs' namespace denies all traffic by default and allows DNS and Object Storage (docker/k8s-rbac.yaml,
    ADR 0040); this adds the rendezvous and collectives between the pods of this attempt only (any port: NCCL
    and gloo pick theirs). Created with the rendezvous Service, deleted with the attempt.
    """
    name = names.attempt_name(job, run_id, attempt)
    same_attempt = {"podSelector": {"matchLabels": {names.LABEL_ATTEMPT_ID: name}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels(job, run_id, attempt),
                     "annotations": names.annotations(job, run_id)},
        "spec": {
            **same_attempt,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [same_attempt]}],
            "egress": [{"to": [same_attempt]}],
        },
    }


def render_attempt_manifests(
    job: TrainingJob,
    *,
    run_id: str,
    plan: Plan,
    namespace: str = DEFAULT_NAMESPACE,
    pvc_name: str | None = None,
    settings: KubernetesSettings | None = None,
    quarantined_nodes: Sequence[str] = (),
    ranks: int | None = None,
) -> list[dict[str, Any]]:
    """Plain-dict manifests of one attempt, in apply order (`kubectl apply --dry-run=server`-ready).

    One node: `[Pod]`. Two or more: `[Service (headless), NetworkPolicy (the ranks reach one another),
    Pod rank 0, ..., Pod rank n-1]`.
    The plan's `exclude_nodes` are the nodes of failed attempts; its `resume_step` sets
    `CKPT_LAST_STEP` (`-1` = newest complete checkpoint); `pvc_name` overrides the per-run claim;
    `ranks` renders an elastic failover on fewer nodes (default `job.nodes`).
    """
    settings = settings or KubernetesSettings.from_sat_config()
    manifests = attempt_pod_manifests(job, run_id=run_id, plan=plan, namespace=namespace, pvc_name=pvc_name,
                                      settings=settings, quarantined_nodes=quarantined_nodes, ranks=ranks)
    if job.distributed:
        manifests[:0] = [rendezvous_service(job, run_id=run_id, attempt=plan.attempt, namespace=namespace,
                                            settings=settings, ranks=ranks),
                         rendezvous_network_policy(job, run_id=run_id, attempt=plan.attempt, namespace=namespace)]
    return manifests


def render_run_volume_claim(
    job: TrainingJob,
    *,
    run_id: str,
    namespace: str = DEFAULT_NAMESPACE,
    settings: KubernetesSettings | None = None,
) -> dict[str, Any]:
    """The per-run ReadWriteMany claim (staged data, script, outputs, checkpoints of all attempts)."""
    settings = settings or KubernetesSettings.from_sat_config()
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": settings.run_volume_size}},
    }
    if settings.run_volume_storage_class:
        spec["storageClassName"] = settings.run_volume_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": names.run_volume_claim_name(job, run_id), "namespace": namespace,
                     "labels": names.run_labels(job, run_id),
                     "annotations": names.annotations(job, run_id)},
        "spec": spec,
    }

