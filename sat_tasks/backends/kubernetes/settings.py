"""Cluster conventions the Kubernetes backend renders with: defaults, overridden by `[sat] k8s_<field>` settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from sat_tasks.config import sat_setting
from sat_tasks.core.runtime_env import POD_GRACE_MARGIN_S
from sat_tasks.errors import SatError

DEFAULT_NAMESPACE = "sat-jobs"


class SettingError(SatError, ValueError):
    """A `[sat] k8s_<field>` setting has a value of the wrong type; the message names it."""


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
        workspace_label: the node label and NoSchedule taint key of a Training Workspace's
            nodes (value: the workspace's name); its jobs' pods select and tolerate it (ADR 0015).
        kueue: whether Kueue queues workspace jobs (`true`: pods name the workspace's
            LocalQueue; `false`: an Airflow pool per workspace does).
        staging_image: the image of the run's helper pods (staging, upload:
            `sat_tasks.backends.kubernetes.staging`): SAT's Airflow image, which has
            `sat_tasks` and the Amazon provider.
        staging_pull_secret: the image pull Secret (in the jobs' namespace) of `staging_image`;
            empty: none (a public image, or a node that may pull it).
        run_as_user / run_as_group: the uid and gid the training pods (and warm placeholders) run as,
            whatever the image's USER (the training image's is 1000); never 0 (ADR 0040).
        staging_run_as_user: the uid of the helper pods (staging, upload) in `staging_image`
            (the Airflow image's `airflow` user, 50000); never 0.
        probe_start_seconds: how long the health check's probe pod may stay Pending on a suspect node before
            the probe gives up and decides nothing (the node is gone or NotReady; `kubernetes.probe`).
        fs_group: the supplementary group of every SAT pod; the run's claim is shared through it
            (staging writes the data, training the outputs, upload reads them).
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
    staging_pull_secret: str = ""
    workspace_label: str = "sat.ai/workspace"
    kueue: bool = False
    run_as_user: int = 1000
    run_as_group: int = 1000
    staging_run_as_user: int = 50000
    fs_group: int = 1000
    probe_start_seconds: int = 60

    @classmethod
    def from_sat_config(cls) -> KubernetesSettings:
        """Defaults, then `[sat] k8s_<field>` settings (env `AIRFLOW__SAT__K8S_<FIELD>` first).

        The grace period is at least `final_checkpoint_grace_seconds` + 60 s (and a job
        whose env sets a longer `CKPT_GRACE_SECONDS` gets a longer one: `pod_grace_seconds`).
        """
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = sat_setting(f"k8s_{f.name}", default="")
            if raw:
                values[f.name] = _typed(f.name, f.type, raw)
        settings = cls(**values)
        for name in ("run_as_user", "run_as_group", "staging_run_as_user", "fs_group"):
            if getattr(settings, name) <= 0:
                raise SettingError(f"[sat] k8s_{name} = {getattr(settings, name)}: must be greater than 0 "
                                   "(SAT's pods never run as root; ADR 0040)")
        final_ckpt = math.ceil(float(sat_setting("final_checkpoint_grace_seconds")))
        if settings.termination_grace_seconds < final_ckpt + POD_GRACE_MARGIN_S:
            settings = cls(**{**settings.__dict__, "termination_grace_seconds": final_ckpt + POD_GRACE_MARGIN_S})
        return settings



def _typed(name: str, annotation: Any, raw: str) -> Any:
    """A setting's text as its field's type (`int` fields must be whole numbers)."""
    if annotation in ("bool", bool):
        if raw.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise SettingError(f"[sat] k8s_{name} = {raw!r}: must be true or false")
        return raw.strip().lower() in ("true", "1", "yes")
    if annotation in ("int", int):
        try:
            return int(raw)
        except ValueError:
            raise SettingError(f"[sat] k8s_{name} = {raw!r}: must be a whole number") from None
    return raw


# ---- Pod Security (issue 44.3, ADR 0040) ---------------------------------------------------------
# Every SAT pod fits the Pod Security Standards' "restricted" profile, which the jobs' namespace enforces
# (docker/k8s-rbac.yaml): not root, no privilege escalation, no capability, the runtime's seccomp profile.
def pod_security_context(settings: KubernetesSettings, *, run_as_user: int,
                         run_as_group: int | None = None) -> dict[str, Any]:
    """A pod's `securityContext`: non-root `run_as_user`, SAT's `fs_group`, seccomp RuntimeDefault."""
    context: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": run_as_user}
    if run_as_group is not None:
        context["runAsGroup"] = run_as_group
    context["fsGroup"] = settings.fs_group
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def container_security_context() -> dict[str, Any]:
    """Every SAT container's `securityContext`: no privilege escalation, every capability dropped."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False,
            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
