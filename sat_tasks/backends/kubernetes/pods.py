"""The pods of an attempt (and its rendezvous Service), and the run's volume claim: built once, rendered and launched from the same objects.

Call order for one attempt (the DAG does the wiring):

1. ``render_run_volume_claim(job, run_id=...)`` once per job run: the ReadWriteMany claim
   that staging fills (``names.run_volume_subpaths``) and every attempt mounts.
2. ``render_attempt_manifests(job, run_id=..., attempt=..., exclude_nodes=..., resume_step=...)``:
   for one node a single Pod; for ``nodes >= 2`` a headless Service first, then one Pod per
   node rank with a stable DNS name (hostname + subdomain) and launcher rendezvous on rank 0.
   ``build_attempt_pods`` / ``rendezvous_service`` are the objects behind it: the operator
   launches exactly these (``operator.SatTrainingPodOperator``), `sat render` prints them.

Nothing here talks to a cluster or imports Airflow; the kubernetes client's models are
imported inside the functions (DAG files import this package at parse time). ADR 0007
explains the choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.settings import DEFAULT_NAMESPACE, KubernetesSettings
from sat_tasks.backends.kubernetes.supervisor import launch_command, nproc_per_node, supervisor_script, training_probes
from sat_tasks.core.attempt import MAIN_CONTAINER_NAME
from sat_tasks.core.runtime_env import (
    IMAGE_VENDOR_DIR,
    POD_CODE_DIR,
    POD_DATA_DIR,
    POD_OUTPUT_DIR,
    TrainingPaths,
    pod_grace_seconds,
    training_environment,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SERVER_TYPES, TrainingJob
from sat_tasks.spec.quantities import format_bytes, quantity_bytes

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import models as k8s

# Env var -> key in the Object Storage Secret (`KubernetesSettings.object_storage_secret`).
OBJECT_STORAGE_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key"}


def pod_memory(job: TrainingJob) -> str:
    """Memory request = limit of a pod: the spec's memory plus `/dev/shm`.

    Kubernetes charges a `medium: Memory` emptyDir to the pod's memory limit, so a full
    `/dev/shm` would otherwise OOM-kill a process that stays within `resources.memory`.
    """
    return format_bytes(quantity_bytes(job.resources.memory) + quantity_bytes(job.resources.shared_memory))


def _env(
    job: TrainingJob,
    *,
    attempt: int,
    resume_step: int | None,
    rank: int,
    service: str | None,
    namespace: str,
    run_id: str,
    settings: KubernetesSettings,
) -> list[k8s.V1EnvVar]:
    from kubernetes.client import models as k8s

    paths = TrainingPaths(data_dir=POD_DATA_DIR, output_dir=POD_OUTPUT_DIR, code_dir=POD_CODE_DIR,
                          vendor_dir=IMAGE_VENDOR_DIR)
    # SAT_NODE is the Kubernetes node the pod lands on; the downward API fills it in.
    contract = training_environment(
        job, paths, attempt=attempt, node="", resume_step=resume_step,
        mirror_url=JobRun(job, run_id).mirror_uri,
        s3_endpoint_url=settings.object_storage_endpoint or None,
    )
    field_refs = {"SAT_NODE": "spec.nodeName", "SAT_POD_NAME": "metadata.name"}
    env = [k8s.V1EnvVar(name=k, value=v) for k, v in contract.items() if k not in field_refs]
    env.append(k8s.V1EnvVar(name="SAT_RUN_ID", value=run_id))
    if job.distributed:
        master = f"{service}-r0.{service}.{namespace}.svc"  # rank 0's stable DNS name
        rendezvous = {
            "MASTER_ADDR": master,
            "MASTER_PORT": str(settings.master_port),
            "NODE_RANK": str(rank),
            "NNODES": str(job.nodes),
            "NPROC_PER_NODE": str(nproc_per_node(job)),
        }
        for key, value in rendezvous.items():
            env.append(k8s.V1EnvVar(name=key, value=value))
            env.append(k8s.V1EnvVar(name=f"PET_{key}", value=value))  # torchrun's env defaults
    for key, path in field_refs.items():
        env.append(k8s.V1EnvVar(
            name=key,
            value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path=path)),
        ))
    env += object_storage_key_env(settings)
    return env


def object_storage_key_env(settings: KubernetesSettings) -> list[k8s.V1EnvVar]:
    """`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` as references into the Object Storage Secret.

    The kubelet resolves them when the container starts: the keys never appear in the pod
    spec, a rendered manifest, an XCom or a log. A missing Secret (or key) keeps the pod
    from starting (`CreateContainerConfigError`) instead of training without its mirror.
    """
    from kubernetes.client import models as k8s

    return [
        k8s.V1EnvVar(name=name, value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name=settings.object_storage_secret, key=key),
        ))
        for name, key in OBJECT_STORAGE_SECRET_KEYS.items()
    ]


def _resources(job: TrainingJob, settings: KubernetesSettings) -> k8s.V1ResourceRequirements:
    from kubernetes.client import models as k8s

    # requests == limits: Guaranteed QoS, the last class the kubelet evicts under pressure.
    amounts = {"cpu": job.resources.cpu, "memory": pod_memory(job)}
    if job.resources.gpus_per_node:
        amounts[settings.gpu_resource] = str(job.resources.gpus_per_node)
    return k8s.V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def _scheduling(
    job: TrainingJob, exclude_nodes: Sequence[str], settings: KubernetesSettings
) -> tuple[dict[str, str], list[k8s.V1Toleration], k8s.V1Affinity | None]:
    """Node selector, tolerations and node affinity for the server type, capacity and exclusions."""
    from kubernetes.client import models as k8s

    selector: dict[str, str] = {}
    tolerations: list[k8s.V1Toleration] = []
    expressions: list[k8s.V1NodeSelectorRequirement] = []
    gpu_model = SERVER_TYPES[job.resources.server_type]["gpu_model"]
    if gpu_model:
        selector[settings.gpu_product_label] = gpu_model
    if job.resources.gpus_per_node:
        tolerations.append(k8s.V1Toleration(key=settings.gpu_taint_key, operator="Exists", effect="NoSchedule"))
    if job.is_spot:
        selector[settings.capacity_label] = settings.spot_label_value
        tolerations.append(k8s.V1Toleration(
            key=settings.spot_taint_key, operator="Equal", value=settings.spot_taint_value, effect="NoSchedule",
        ))
    else:
        # On-demand: anything but Spot, so unlabelled on-demand nodes qualify too.
        expressions.append(k8s.V1NodeSelectorRequirement(
            key=settings.capacity_label, operator="NotIn", values=[settings.spot_label_value],
        ))
    excluded = sorted(set(exclude_nodes))
    if excluded:
        expressions.append(k8s.V1NodeSelectorRequirement(
            key="kubernetes.io/hostname", operator="NotIn", values=excluded,
        ))
    affinity = None
    if expressions:
        affinity = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=expressions)]
            )
        ))
    return selector, tolerations, affinity


def _volumes(
    job: TrainingJob, run_id: str, pvc_name: str | None
) -> tuple[list[k8s.V1Volume], list[k8s.V1VolumeMount]]:
    from kubernetes.client import models as k8s

    claim = pvc_name or names.run_volume_claim_name(job, run_id)
    subpaths = names.run_volume_subpaths(job, run_id)
    volumes = [
        k8s.V1Volume(name="run", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=claim)),
        k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(
            medium="Memory", size_limit=job.resources.shared_memory,
        )),
    ]
    mounts = [
        k8s.V1VolumeMount(name="run", mount_path=POD_DATA_DIR, sub_path=subpaths["data"]),
        k8s.V1VolumeMount(name="run", mount_path=POD_OUTPUT_DIR, sub_path=subpaths["output"]),
        k8s.V1VolumeMount(name="run", mount_path=POD_CODE_DIR, sub_path=subpaths["code"]),
        k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
    ]
    if job.storage.file_storage_mount:
        # File Storage is mounted on every GPU node at the same path; the pod sees it there too.
        volumes.append(k8s.V1Volume(name="file-storage", host_path=k8s.V1HostPathVolumeSource(
            path=job.storage.file_storage_mount, type="Directory",
        )))
        mounts.append(k8s.V1VolumeMount(name="file-storage", mount_path=job.storage.file_storage_mount))
    return volumes, mounts


def build_attempt_pods(
    job: TrainingJob,
    *,
    run_id: str,
    attempt: int,
    exclude_nodes: Sequence[str] = (),
    resume_step: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    pvc_name: str | None = None,
    settings: KubernetesSettings | None = None,
) -> list[k8s.V1Pod]:
    """The attempt's pods as kubernetes client models, one per node rank: the single source.

    `render_attempt_manifests` serialises them; `operator.build_pod_operator_kwargs` hands
    one to KubernetesPodOperator as its `full_pod_spec`.
    """
    from kubernetes.client import models as k8s

    if attempt < 1:
        raise ValueError("attempt must be >= 1")
    settings = settings or KubernetesSettings.from_sat_config()
    service = names.attempt_name(job, run_id, attempt) if job.distributed else None
    node_selector, tolerations, affinity = _scheduling(job, exclude_nodes, settings)
    volumes, mounts = _volumes(job, run_id, pvc_name)
    script = supervisor_script(job, settings)
    command = launch_command(job)
    startup_probe, liveness_probe = training_probes(job)
    pull_secrets = None
    if job.image.registry_conn_id:
        pull_secrets = [k8s.V1LocalObjectReference(name=names.pull_secret_name(job.image.registry_conn_id))]

    pods = []
    for rank in range(job.nodes):
        name = names.pod_name(job, run_id, attempt, rank)
        container = k8s.V1Container(
            name=MAIN_CONTAINER_NAME,
            image=job.image.url,
            command=["bash", "-lc", script, "sat-launch", command],
            env=_env(job, attempt=attempt, resume_step=resume_step, rank=rank, service=service,
                     namespace=namespace, run_id=run_id, settings=settings),
            resources=_resources(job, settings),
            volume_mounts=mounts,
            ports=[k8s.V1ContainerPort(name="rendezvous", container_port=settings.master_port)]
            if job.distributed else None,
            # The log tail becomes the termination message when the process leaves none.
            termination_message_policy="FallbackToLogsOnError",
            startup_probe=startup_probe,
            liveness_probe=liveness_probe,
        )
        pods.append(k8s.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=k8s.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={**names.labels(job, run_id, attempt), names.LABEL_NODE_RANK: str(rank)},
                annotations=names.annotations(job, run_id),
            ),
            spec=k8s.V1PodSpec(
                containers=[container],
                restart_policy="Never",
                termination_grace_period_seconds=pod_grace_seconds(job, settings.termination_grace_seconds),
                hostname=name if job.distributed else None,
                subdomain=service,
                node_selector=node_selector or None,
                tolerations=tolerations or None,
                affinity=affinity,
                image_pull_secrets=pull_secrets,
                volumes=volumes,
                # No Service env vars (a Service named `master` would set MASTER_PORT) and no
                # API token: training talks to its peers and to storage, not to Kubernetes.
                enable_service_links=False,
                automount_service_account_token=False,
            ),
        ))
    return pods


def rendezvous_service(job: TrainingJob, *, run_id: str, attempt: int, namespace: str,
                        settings: KubernetesSettings) -> dict[str, Any]:
    """Headless Service giving each rank `<pod>.<service>.<namespace>.svc`, even before it is Ready."""
    name = names.attempt_name(job, run_id, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": names.labels(job, run_id, attempt),
                     "annotations": names.annotations(job, run_id)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_ATTEMPT_ID: name},
            "ports": [{"name": "rendezvous", "port": settings.master_port,
                       "targetPort": settings.master_port, "protocol": "TCP"}],
        },
    }


def serialize(obj: Any) -> dict[str, Any]:
    """A kubernetes client model as the API's JSON (camelCase keys, no None fields)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def render_attempt_manifests(
    job: TrainingJob,
    *,
    run_id: str,
    attempt: int,
    exclude_nodes: Sequence[str] = (),
    resume_step: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    pvc_name: str | None = None,
    settings: KubernetesSettings | None = None,
) -> list[dict[str, Any]]:
    """Plain-dict manifests of one attempt, in apply order (`kubectl apply --dry-run=server`-ready).

    One node: `[Pod]`. Two or more: `[Service (headless), Pod rank 0, ..., Pod rank n-1]`.
    `exclude_nodes` are the nodes of failed attempts; `resume_step` sets `CKPT_LAST_STEP`
    (`-1` = newest complete checkpoint); `pvc_name` overrides the per-run claim.
    """
    settings = settings or KubernetesSettings.from_sat_config()
    pods = build_attempt_pods(job, run_id=run_id, attempt=attempt, exclude_nodes=exclude_nodes,
                              resume_step=resume_step, namespace=namespace, pvc_name=pvc_name,
                              settings=settings)
    manifests = [serialize(pod) for pod in pods]
    if job.distributed:
        manifests.insert(0, rendezvous_service(job, run_id=run_id, attempt=attempt,
                                                namespace=namespace, settings=settings))
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

