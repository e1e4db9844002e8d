"""The Kubernetes backend: render an attempt's pods (and rendezvous Service) and the KubernetesPodOperator kwargs.

Call order for one attempt (the DAG does the wiring):

1. ``render_run_volume_claim(job, run_id=...)`` once per job run: the ReadWriteMany claim
   that staging fills (``run_volume_subpaths`` names the directories) and every attempt mounts.
2. ``render_attempt_manifests(job, run_id=..., attempt=..., exclude_nodes=..., resume_step=...)``:
   for one node a single Pod; for ``nodes >= 2`` a headless Service first, then one Pod per
   node rank with a stable DNS name (hostname + subdomain) and launcher rendezvous on rank 0.
3. ``build_pod_operator_kwargs(...)`` (one per node rank): keyword arguments for the
   provider's ``KubernetesPodOperator``; the pod it builds is the rendered pod (one source:
   ``build_attempt_pods``), kept after it finishes so ``classify`` can read it.
4. Multi-node: the operator's ``gang_teardown_callback`` stops the other ranks when one fails.
5. ``cleanup_attempt`` afterwards (pods and Service of the attempt; ``attempt_label_selector``).

Nothing here talks to a cluster and nothing imports Airflow or the kubernetes client at
module level (the DAG files import this module at parse time). ADR 0007 explains the choices.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Sequence

from sat_tasks.attempt import MAIN_CONTAINER_NAME
from sat_tasks.local_backend import START_MARKER
from sat_tasks.paths import safe_run_id
from sat_tasks.runtime_env import (
    IMAGE_VENDOR_DIR,
    POD_CODE_DIR,
    POD_DATA_DIR,
    POD_GRACE_MARGIN_S,
    POD_OUTPUT_DIR,
    TrainingPaths,
    pod_grace_seconds,
    training_environment,
)
from sat_tasks.spec import SERVER_TYPES, Framework, SpecError, TrainingJob, load_spec

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import models as k8s

__all__ = [
    "KubernetesSettings",
    "attempt_label_selector",
    "attempt_name",
    "build_attempt_pods",
    "build_pod_operator_kwargs",
    "cleanup_attempt",
    "gang_teardown_callback",
    "label_value",
    "launch_command",
    "object_storage_key_env",
    "pull_secret_name",
    "register_cli",
    "render_attempt_manifests",
    "render_run_volume_claim",
    "run_volume_claim_name",
    "run_volume_subpaths",
    "teardown_peers",
]

# Label keys every SAT object carries (selectors, classify and cleanup read them).
LABEL_JOB = "sat.ai/job"
LABEL_RUN_ID = "sat.ai/run-id"
LABEL_ATTEMPT = "sat.ai/attempt"
LABEL_NODE_RANK = "sat.ai/node-rank"
LABEL_ATTEMPT_ID = "sat.ai/attempt-id"  # unique per (job, run, attempt): the Service selector
ANNOTATION_RUN_ID = "sat.ai/run-id"  # the raw run id (a label value cannot hold `:` or `+`)
ANNOTATION_TAGS = "sat.ai/tags"
MANAGED_BY = {"app.kubernetes.io/managed-by": "sat", "app.kubernetes.io/component": "training"}

DEFAULT_NAMESPACE = "sat-jobs"
# Env var -> key in the Object Storage Secret (`KubernetesSettings.object_storage_secret`).
OBJECT_STORAGE_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "access_key_id", "AWS_SECRET_ACCESS_KEY": "secret_access_key"}
_MAX_LABEL = 63
# `python [-u|-B|-O...] script.py ...` or `python ... -m module ...`: what a launcher can take over.
_PYTHON_CMD_RE = re.compile(
    r"^\s*python(?:3(?:\.\d+)?)?(?:\s+-[uBOEsI]+)*\s+(?P<rest>-m\s+\S.*|[^-\s].*)$", re.DOTALL
)
_QUANTITY_RE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

# The container's PID 1. It runs the command in its own process group and forwards SIGTERM
# to that whole group, so the training process (not only a shell) gets the Spot / drain
# notice and can write its final checkpoint within the grace period; bash as PID 1 would
# otherwise swallow SIGTERM. The subshell traps TERM (a handler, unlike an ignore, is not
# inherited by the command) so it outlives the signal and reports the command's own exit
# status. A command stopped by SIGTERM never reports success (143), even when it saved a
# final checkpoint and exited 0: the attempt did not finish. When PID 1 exits the kernel
# SIGKILLs every process left in the container, so after SIGTERM it also waits for the
# rest of the command's process group: the `deepspeed` launcher dies at once on SIGTERM
# while its ranks still write their final checkpoint (the kubelet's SIGKILL at the end of
# the grace period bounds the wait). A SIGTERM before the command starts (ranks > 0 wait for
# rank 0's DNS name first) ends the pod at once: PID 1 ignores a signal it has no handler
# for, and the pod would start training on a node being drained. $1 is the (wrapped) command.
_SUPERVISOR = """\
set -m
trap 'echo "[sat] SIGTERM before the command started: exit 143"; exit 143' TERM INT
echo "[sat] attempt ${SAT_ATTEMPT} of job ${SAT_JOB_NAME} on node ${SAT_NODE} (pod ${HOSTNAME}): %(marker)s"
cd "${SAT_CODE_DIR}" || { echo "[sat] code directory ${SAT_CODE_DIR} is missing: was the script staged?" >&2; exit 1; }
%(wait_for_rank0)s( trap : TERM INT; eval "$1" ) &
child=$!
set +m
stopped=
trap 'stopped=1; kill -TERM -- "-${child}" 2>/dev/null' TERM INT
wait "${child}"; rc=$?
while kill -0 "${child}" 2>/dev/null; do wait "${child}"; rc=$?; done
if [ -n "${stopped}" ] && kill -0 -- "-${child}" 2>/dev/null; then
  echo "[sat] the command exited on SIGTERM; waiting for the processes it started (final checkpoint)"
  while kill -0 -- "-${child}" 2>/dev/null; do sleep 0.2; done
  echo "[sat] the command's processes have exited"
fi
if [ -n "${stopped}" ] && [ "${rc}" = 0 ]; then
  echo "[sat] stopped by SIGTERM before the command finished: exit 143"; rc=143
fi
exit "${rc}"
"""
# Ranks > 0 wait (bounded) until rank 0's DNS record exists; the launcher then retries the
# TCP connection itself.
_WAIT_FOR_RANK0 = """\
if [ "${NODE_RANK}" != 0 ] && command -v getent >/dev/null 2>&1; then
  for _ in $(seq 1 %(tries)d); do getent hosts "${MASTER_ADDR}" >/dev/null 2>&1 && break; sleep 5; done
fi
"""


@dataclass(frozen=True)
class KubernetesSettings:
    """Cluster conventions the rendering depends on; defaults, `[sat]` config overrides.

    Attributes:
        termination_grace_seconds: pod grace period (SIGTERM -> SIGKILL); must cover the
            final checkpoint (`[sat] final_checkpoint_grace_seconds`) plus exit.
        master_port: rendezvous port of rank 0 (torchrun / deepspeed TCPStore).
        capacity_label: node label telling Spot from on-demand capacity.
        spot_label_value: value of `capacity_label` on Spot nodes (on-demand pods avoid it).
        spot_taint_key / spot_taint_value: the taint Spot nodes carry (tolerated by Spot pods).
        gpu_resource: the extended resource name of a GPU.
        gpu_product_label: node label with the GPU model (NVIDIA GPU feature discovery).
        gpu_taint_key: taint GPU nodes carry (tolerated when the job asks for GPUs).
        startup_timeout_seconds: how long the operator waits for a pod to start (large image pulls).
        run_volume_size / run_volume_storage_class: the per-run claim.
        rendezvous_dns_wait_seconds: bound on how long ranks > 0 wait for rank 0's DNS name.
        object_storage_endpoint: the S3 endpoint pods use for the checkpoint mirror
            (`CKPT_S3_ENDPOINT_URL`); empty = AWS's own endpoints.
        object_storage_secret: the Kubernetes Secret holding the Object Storage keys
            (`access_key_id`, `secret_access_key`); pods read them through `secretKeyRef`,
            so no key is ever part of a rendered manifest. The cluster's operator creates it
            (from the same credentials as the `sat_object_storage` connection).
        staging_image: the image of the staging pod (`sat_tasks.k8s_staging`): SAT's Airflow
            image, which has `sat_tasks` and the Amazon provider.
    """

    termination_grace_seconds: int = 120
    master_port: int = 29500
    capacity_label: str = "sat.ai/capacity"
    spot_label_value: str = "spot"
    spot_taint_key: str = "sat.ai/capacity"
    spot_taint_value: str = "spot"
    gpu_resource: str = "nvidia.com/gpu"
    gpu_product_label: str = "nvidia.com/gpu.product"
    gpu_taint_key: str = "nvidia.com/gpu"
    startup_timeout_seconds: int = 1800
    run_volume_size: str = "100Gi"
    run_volume_storage_class: str | None = None
    rendezvous_dns_wait_seconds: int = 600
    object_storage_endpoint: str = ""
    object_storage_secret: str = "sat-object-storage"
    staging_image: str = "registry.example.com/sat/airflow:0.1.0"

    @classmethod
    def from_sat_config(cls) -> KubernetesSettings:
        """Defaults, then `[sat] k8s_<field>` settings (env `AIRFLOW__SAT__K8S_<FIELD>` first).

        The grace period is at least `final_checkpoint_grace_seconds` + 60 s (and a job
        whose env sets a longer `CKPT_GRACE_SECONDS` gets a longer one: `pod_grace_seconds`).
        """
        import os

        from sat_tasks.paths import sat_setting

        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = os.environ.get(f"AIRFLOW__SAT__K8S_{f.name.upper()}")
            if raw is None:
                raw = _airflow_sat_option(f"k8s_{f.name}")
            if raw:
                values[f.name] = int(raw) if f.type in ("int", int) else raw
        settings = cls(**values)
        final_ckpt = math.ceil(float(sat_setting("final_checkpoint_grace_seconds")))
        if settings.termination_grace_seconds < final_ckpt + POD_GRACE_MARGIN_S:
            settings = cls(**{**settings.__dict__, "termination_grace_seconds": final_ckpt + POD_GRACE_MARGIN_S})
        return settings


def _airflow_sat_option(key: str) -> str | None:
    """An optional `[sat]` option from airflow.cfg, None when Airflow is not configured."""
    try:
        from airflow.configuration import conf

        return conf.get("sat", key, fallback=None)
    except Exception:  # plain library use, no Airflow config
        return None


# ---- names and labels --------------------------------------------------------------------------
def label_value(value: str) -> str:
    """`value` as a valid label value (<= 63 chars, alphanumeric ends; a hash when changed).

    Same result as the provider's `pod_generator.make_safe_label_value` (tested), so the
    `sat.ai/run-id` label equals the `run_id` label KubernetesPodOperator adds; kept here
    so rendering needs no Airflow import. One fix: a value with no alphanumeric character
    becomes the bare hash (the provider's `-<hash>` is not a valid label value).
    """
    safe = re.sub(r"^[^a-z0-9A-Z]*|[^a-zA-Z0-9_\-\.]|[^a-z0-9A-Z]*$", "", value)
    if len(safe) > _MAX_LABEL or value != safe:
        digest = hashlib.md5(value.encode()).hexdigest()[:9]  # noqa: S324 - a name, not security
        safe = safe[: _MAX_LABEL - len(digest) - 1] + "-" + digest if safe else digest
    return safe


def _short_hash(value: str, length: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def _dns_part(value: str) -> str:
    """Lowercase letters, digits and single dashes only (job names may hold dots)."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", value.lower())).strip("-")


def attempt_name(job: TrainingJob, run_id: str, attempt: int) -> str:
    """`sat-<job>-<run hash>-a<attempt>`: the Service name and the pod names' stem.

    A DNS-1035 label short enough for `-r<rank>` to follow (pod hostnames <= 63 chars);
    the run hash keeps two runs of one job apart.
    """
    suffix = f"-{_short_hash(run_id)}-a{attempt}"
    room = _MAX_LABEL - len("sat-") - len(suffix) - len(f"-r{max(job.nodes - 1, 0)}")
    return f"sat-{_dns_part(job.name)[:room].rstrip('-')}{suffix}"


def _pod_name(job: TrainingJob, run_id: str, attempt: int, rank: int) -> str:
    return f"{attempt_name(job, run_id, attempt)}-r{rank}"


def pull_secret_name(registry_conn_id: str) -> str:
    """The image pull Secret named after the registry connection (`sat_registry_x` -> `sat-registry-x`)."""
    name = re.sub(r"[^a-z0-9.-]+", "-", registry_conn_id.lower()).strip("-.")
    return name[:253] or "registry"


def run_volume_claim_name(job: TrainingJob, run_id: str) -> str:
    """The default per-run claim: `sat-<job>-<run hash>-data`."""
    suffix = f"-{_short_hash(run_id)}-data"
    return f"sat-{_dns_part(job.name)[: _MAX_LABEL - 4 - len(suffix)].rstrip('-')}{suffix}"


def run_volume_subpaths(job: TrainingJob, run_id: str) -> dict[str, str]:
    """Directories of one run inside the claim: `<job>/<run>-<hash>/{data,output,code}`.

    Staging writes the data and the script there; every attempt mounts them at the pod paths
    of `runtime_env` (POD_DATA_DIR, POD_OUTPUT_DIR, POD_CODE_DIR). The run part keeps a
    shared claim safe for many runs.
    """
    # safe_run_id folds distinct ids together (`:` and `_` both become `_`): the hash keeps them apart.
    root = f"{job.name}/{safe_run_id(run_id)[:80]}-{_short_hash(run_id)}"
    return {"data": f"{root}/data", "output": f"{root}/output", "code": f"{root}/code"}


def _labels(job: TrainingJob, run_id: str, attempt: int) -> dict[str, str]:
    return {
        LABEL_JOB: job.name,
        LABEL_RUN_ID: label_value(run_id),
        LABEL_ATTEMPT: str(attempt),
        LABEL_ATTEMPT_ID: attempt_name(job, run_id, attempt),
        **MANAGED_BY,
    }


def attempt_label_selector(job: TrainingJob, run_id: str, attempt: int) -> str:
    """Label selector matching every object of one attempt (for cleanup and for classify)."""
    return f"{LABEL_ATTEMPT_ID}={attempt_name(job, run_id, attempt)}"


def _annotations(job: TrainingJob, run_id: str) -> dict[str, str]:
    annotations = {ANNOTATION_RUN_ID: run_id}
    if job.tags:
        annotations[ANNOTATION_TAGS] = json.dumps(job.tags, sort_keys=True)
    return annotations


# ---- quantities --------------------------------------------------------------------------------
def _quantity_bytes(quantity: str) -> int:
    match = _QUANTITY_RE.match(quantity)
    if not match:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return int(float(match.group("num")) * _UNITS[match.group("unit")])


def _format_bytes(value: int) -> str:
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return str(value)


def pod_memory(job: TrainingJob) -> str:
    """Memory request = limit of a pod: the spec's memory plus `/dev/shm`.

    Kubernetes charges a `medium: Memory` emptyDir to the pod's memory limit, so a full
    `/dev/shm` would otherwise OOM-kill a process that stays within `resources.memory`.
    """
    return _format_bytes(_quantity_bytes(job.resources.memory) + _quantity_bytes(job.resources.shared_memory))


# ---- the launch command ------------------------------------------------------------------------
def _nproc_per_node(job: TrainingJob) -> int:
    return max(job.resources.gpus_per_node, 1)


# `python -m <one of these>` is a launcher already: it runs as written, never inside another.
_LAUNCHER_MODULES = re.compile(
    r"^-m\s+(torch\.distributed\.(run|launch)|deepspeed(\.launcher\.\w+)?|accelerate\.commands\.\w+"
    r"|ckpt_engine\.launch)(\s|$)"
)
# The worker entry point that gives a DeepSpeed script the `--local_rank=<n>` argument the
# `deepspeed` launcher would (ckpt_engine/launch.py, in the vendor directory of every pod).
DEEPSPEED_ENTRY = "-m ckpt_engine.launch"


def launch_command(job: TrainingJob) -> str:
    """The shell command a pod runs: the job's command, wrapped in torchrun when distributed.

    One node: the command as written. Two or more: a command that starts with `python`
    (`python script.py ...` or `python -m module ...`; interpreter flags such as `-u` are
    dropped, the pod sets PYTHONUNBUFFERED) becomes `torchrun` with rendezvous on rank 0
    from the pod's env. For DeepSpeed the workers start through `ckpt_engine.launch`,
    which passes `--local_rank=<n>` first as the `deepspeed` launcher does: torchrun waits
    out the final checkpoint after SIGTERM (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`), the
    `deepspeed` launcher SIGKILLs after 30 s (ADR 0007). Any other command (an explicit
    `torchrun`, `deepspeed`, `accelerate launch`, their `python -m` forms, a script) runs
    as written and reads the
    same env (`MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`, `NNODES`, `NPROC_PER_NODE`, `PET_*`).
    """
    command = job.command.strip()
    match = _PYTHON_CMD_RE.match(command)
    if not job.distributed or not match or _LAUNCHER_MODULES.match(match.group("rest")):
        return command
    rest = match.group("rest")
    if job.framework is Framework.DEEPSPEED:
        rest = f"{DEEPSPEED_ENTRY} {rest}"
    return (
        'torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" '
        f'--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" {rest}'
    )


def _supervisor_script(job: TrainingJob, settings: KubernetesSettings) -> str:
    wait = ""
    if job.distributed:
        wait = _WAIT_FOR_RANK0 % {"tries": max(settings.rendezvous_dns_wait_seconds // 5, 1)}
    return _SUPERVISOR % {"marker": START_MARKER, "wait_for_rank0": wait}


# ---- the pods ----------------------------------------------------------------------------------
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

    from sat_tasks.pipeline import JobRun  # the run's results prefix, as on the local backend

    paths = TrainingPaths(data_dir=POD_DATA_DIR, output_dir=POD_OUTPUT_DIR, code_dir=POD_CODE_DIR,
                          vendor_dir=IMAGE_VENDOR_DIR)
    # SAT_NODE is the Kubernetes node the pod lands on; the downward API fills it in.
    contract = training_environment(
        job, paths, attempt=attempt, node="", resume_step=resume_step,
        mirror_url=JobRun(job, run_id).results_uri + "checkpoints/",
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
            "NPROC_PER_NODE": str(_nproc_per_node(job)),
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

    claim = pvc_name or run_volume_claim_name(job, run_id)
    subpaths = run_volume_subpaths(job, run_id)
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

    `render_attempt_manifests` serialises them; `build_pod_operator_kwargs` hands one to
    KubernetesPodOperator as its `full_pod_spec`.
    """
    from kubernetes.client import models as k8s

    if attempt < 1:
        raise ValueError("attempt must be >= 1")
    settings = settings or KubernetesSettings.from_sat_config()
    service = attempt_name(job, run_id, attempt) if job.distributed else None
    node_selector, tolerations, affinity = _scheduling(job, exclude_nodes, settings)
    volumes, mounts = _volumes(job, run_id, pvc_name)
    script = _supervisor_script(job, settings)
    command = launch_command(job)
    pull_secrets = None
    if job.image.registry_conn_id:
        pull_secrets = [k8s.V1LocalObjectReference(name=pull_secret_name(job.image.registry_conn_id))]

    pods = []
    for rank in range(job.nodes):
        name = _pod_name(job, run_id, attempt, rank)
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
        )
        pods.append(k8s.V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=k8s.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={**_labels(job, run_id, attempt), LABEL_NODE_RANK: str(rank)},
                annotations=_annotations(job, run_id),
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


def _rendezvous_service(job: TrainingJob, *, run_id: str, attempt: int, namespace: str,
                        settings: KubernetesSettings) -> dict[str, Any]:
    """Headless Service giving each rank `<pod>.<service>.<namespace>.svc`, even before it is Ready."""
    name = attempt_name(job, run_id, attempt)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(job, run_id, attempt),
                     "annotations": _annotations(job, run_id)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_ATTEMPT_ID: name},
            "ports": [{"name": "rendezvous", "port": settings.master_port,
                       "targetPort": settings.master_port, "protocol": "TCP"}],
        },
    }


def _serialize(obj: Any) -> dict[str, Any]:
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
    manifests = [_serialize(pod) for pod in pods]
    if job.distributed:
        manifests.insert(0, _rendezvous_service(job, run_id=run_id, attempt=attempt,
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
        "metadata": {"name": run_volume_claim_name(job, run_id), "namespace": namespace,
                     "labels": {LABEL_JOB: job.name, LABEL_RUN_ID: label_value(run_id), **MANAGED_BY},
                     "annotations": _annotations(job, run_id)},
        "spec": spec,
    }


# ---- the operator ------------------------------------------------------------------------------
def build_pod_operator_kwargs(
    job: TrainingJob,
    *,
    run_id: str,
    attempt: int,
    exclude_nodes: Sequence[str] = (),
    resume_step: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    kubernetes_conn_id: str = "kubernetes_default",
    node_rank: int = 0,
    pvc_name: str | None = None,
    deferrable: bool = True,
    settings: KubernetesSettings | None = None,
) -> dict[str, Any]:
    """Keyword arguments (all but `task_id`) for `KubernetesPodOperator`, for one node rank.

    The pod goes in as `full_pod_spec`: the operator builds exactly the rendered pod (plus
    its own Airflow labels), and no part of the user's command or env passes through Jinja
    (a `{#` in a shell command would otherwise break rendering). The pod has a fixed name
    (no random suffix): an attempt's pods are addressable, and ranks find each other by
    hostname. The pod is kept when it finishes (`classify` reads it; `cleanup` deletes it).
    """
    settings = settings or KubernetesSettings.from_sat_config()
    if not 0 <= node_rank < job.nodes:
        raise ValueError(f"node_rank must be in [0, {job.nodes})")
    pod = build_attempt_pods(job, run_id=run_id, attempt=attempt, exclude_nodes=exclude_nodes,
                             resume_step=resume_step, namespace=namespace, pvc_name=pvc_name,
                             settings=settings)[node_rank]
    return {
        "kubernetes_conn_id": kubernetes_conn_id,
        "namespace": namespace,
        "name": pod.metadata.name,
        "random_name_suffix": False,
        "full_pod_spec": pod,
        "base_container_name": MAIN_CONTAINER_NAME,
        "termination_message_policy": "FallbackToLogsOnError",
        "termination_grace_period": pod.spec.termination_grace_period_seconds,
        "get_logs": True,
        "log_events_on_failure": True,
        "on_finish_action": "keep_pod",
        "on_kill_action": "delete_pod",
        "startup_timeout_seconds": settings.startup_timeout_seconds,
        "deferrable": deferrable,
        "do_xcom_push": False,
        "callbacks": [gang_teardown_callback()] if job.distributed else [],
    }


# ---- teardown and cleanup ----------------------------------------------------------------------
def teardown_peers(pod: Any, client: Any) -> list[str]:
    """When `pod` (one rank) failed, delete the attempt's other ranks that still run.

    They get SIGTERM and their grace period, so they write a final checkpoint, instead of
    hanging in a collective until NCCL times out. The failed pod itself is kept for
    classify. `pod` is a V1Pod, `client` a CoreV1Api; returns the names deleted.
    """
    if (pod.status.phase if pod.status else None) != "Failed":
        return []
    labels = pod.metadata.labels or {}
    attempt_id, rank = labels.get(LABEL_ATTEMPT_ID), labels.get(LABEL_NODE_RANK)
    if not attempt_id:
        return []
    selector = f"{LABEL_ATTEMPT_ID}={attempt_id}" + (f",{LABEL_NODE_RANK}!={rank}" if rank is not None else "")
    peers = client.list_namespaced_pod(pod.metadata.namespace, label_selector=selector).items
    deleted = []
    for peer in peers:
        if peer.status and peer.status.phase in ("Succeeded", "Failed"):
            continue
        client.delete_namespaced_pod(peer.metadata.name, peer.metadata.namespace,
                                     grace_period_seconds=pod.spec.termination_grace_period_seconds)
        deleted.append(peer.metadata.name)
    return deleted


_GANG_TEARDOWN: type | None = None


def gang_teardown_callback() -> type:
    """A `KubernetesPodOperatorCallback` that runs `teardown_peers` when a rank's pod completes."""
    global _GANG_TEARDOWN
    if _GANG_TEARDOWN is None:
        from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback

        class GangTeardown(KubernetesPodOperatorCallback):
            """If one rank of a multi-node attempt fails, stop the others (they checkpoint on SIGTERM)."""

            @staticmethod
            def on_pod_completion(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
                if pod is not None and client is not None:
                    teardown_peers(pod, client)

        _GANG_TEARDOWN = GangTeardown
    return _GANG_TEARDOWN


def cleanup_attempt(client: Any, job: TrainingJob, *, run_id: str, attempt: int,
                    namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Delete an attempt's pods and rendezvous Service (after classify has read them).

    `client` is a CoreV1Api; idempotent (objects already gone are skipped). Returns
    `kind/name` of what was deleted. The run's claim stays: the next attempt resumes from it.
    """
    from kubernetes.client.exceptions import ApiException

    selector = attempt_label_selector(job, run_id, attempt)
    deleted = []
    for kind, lister, deleter in (
        ("pod", client.list_namespaced_pod, client.delete_namespaced_pod),
        ("service", client.list_namespaced_service, client.delete_namespaced_service),
    ):
        for item in lister(namespace, label_selector=selector).items:
            try:
                deleter(item.metadata.name, namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                continue
            deleted.append(f"{kind}/{item.metadata.name}")
    return deleted


# ---- CLI ---------------------------------------------------------------------------------------
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add `sat render JOB.yaml [--attempt N] [--exclude-node X ...] [--resume-step N] ...`."""
    parser = subparsers.add_parser(
        "render",
        help="print the Kubernetes manifests an attempt of a job would submit (YAML stream)",
        description="Print the manifests the DAG submits for one attempt: the run's volume claim "
        "(unless --pvc names an existing one), the rendezvous Service (multi-node) and the pods. "
        "Ready for `kubectl apply --dry-run=server -f -`.",
    )
    parser.add_argument("spec", metavar="JOB.yaml", help="the Training Job spec")
    parser.add_argument("--attempt", type=int, default=1, help="1-based attempt number (default 1)")
    parser.add_argument("--exclude-node", action="append", default=[], metavar="NODE",
                        help="a node an earlier attempt failed on (repeatable)")
    parser.add_argument("--resume-step", type=int, default=None, metavar="N",
                        help="resume from checkpoint step N (-1 = newest complete)")
    parser.add_argument("--run-id", default="manual__render", help="the DAG run id (default manual__render)")
    parser.add_argument("--namespace", default=None, help="namespace (default: [sat] kubernetes_namespace)")
    parser.add_argument("--pvc", default=None, metavar="CLAIM", help="an existing claim instead of the run's own")
    parser.set_defaults(func=render_command)


def render_command(args: argparse.Namespace) -> int:
    """`sat render`: print the manifests; exit 2 with `<file>: <field>: <rule>` lines on a bad spec."""
    import yaml

    try:
        job = load_spec(args.spec)
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.attempt < 1:
        print(f"{args.spec}: --attempt: must be >= 1", file=sys.stderr)
        return 2
    if args.namespace is None:
        from sat_tasks.paths import sat_setting

        args.namespace = sat_setting("kubernetes_namespace")
    settings = KubernetesSettings.from_sat_config()
    manifests = []
    if args.pvc is None:
        manifests.append(render_run_volume_claim(job, run_id=args.run_id, namespace=args.namespace,
                                                 settings=settings))
    manifests += render_attempt_manifests(
        job, run_id=args.run_id, attempt=args.attempt, exclude_nodes=args.exclude_node,
        resume_step=args.resume_step, namespace=args.namespace, pvc_name=args.pvc, settings=settings,
    )
    sys.stdout.write(f"# sat render {args.spec}: job {job.name}, run {args.run_id}, attempt {args.attempt}\n")
    sys.stdout.write(yaml.dump_all(manifests, Dumper=_block_style_dumper(), sort_keys=False, explicit_start=True,
                                   width=120))
    return 0


def _block_style_dumper() -> type:
    import yaml

    class BlockStyleDumper(yaml.SafeDumper):
        """SafeDumper that writes multi-line strings (the supervisor script) as `|` blocks."""

    def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockStyleDumper.add_representer(str, represent_str)
    return BlockStyleDumper
