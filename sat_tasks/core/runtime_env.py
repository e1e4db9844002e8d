"""The environment SAT gives a training process, the same on every backend (the names: `ckpt_engine.contract`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ckpt_engine import contract
from sat_tasks.config import sat_setting
from sat_tasks.core.handoffs import Plan
from sat_tasks.spec import TrainingJob

# Where the training image carries the vendored checkpoint engine (docker/training.Dockerfile).
IMAGE_VENDOR_DIR = "/opt/sat/checkpoint_vendor"
# Paths inside a Kubernetes pod.
POD_DATA_DIR = "/opt/sat/data"
POD_OUTPUT_DIR = "/opt/sat/output"
POD_CODE_DIR = "/opt/sat/code"
# The container's own disk: the metrics recorder copies its files to Object Storage every interval.
POD_METRICS_DIR = "/tmp/sat-metrics"
# After SIGTERM a launcher (torchrun, the local runner) waits this much longer than the
# engine's final-checkpoint grace period before it SIGKILLs: the engine exits first.
LAUNCHER_GRACE_MARGIN_S = 15
# What a training process keeps of the environment of the process that starts it (issue 29): that
# environment is the service's (under `make up` the JWT secret, the Fernet key, the metadata DB URL,
# the Object Storage connection), so everything else is dropped. Each name, and why it is kept:
HOST_ENV_ALLOWED = frozenset({
    "PATH",  # bash, python, torchrun (the local runner puts the service's interpreter first)
    "HOME", "USER", "LOGNAME",  # ~/.cache (the offline models), getpass.getuser() (torch's compile caches)
    "LANG", "LANGUAGE", "TZ",  # the encoding of the job's output, its timestamps (LC_*: below)
    "TMPDIR",  # where tempfile writes: operators point it at a large disk
    "OMP_NUM_THREADS", "MKL_NUM_THREADS",  # the host's CPU sizing (a job's `env` may set its own)
    "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",  # the GPUs this host lends SAT, its CUDA/NCCL libraries
    # where the offline models and data sets are (HF_*_OFFLINE=1: the cache is the only source; not HF_TOKEN)
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "XDG_CACHE_HOME",
    # trust anchors (paths) for an Object Storage behind a private CA: the engine's mirror speaks TLS to it
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE",
    # the deployment's mark (`sat_tasks.service.stack.SERVICE_MARK_ENV`, a path): `make down` finds
    # the training processes a deployment left behind by it
    "SAT_SERVICE_HOME",
})
HOST_ENV_ALLOWED_PREFIXES = ("LC_",)
# A pod's grace period (SIGTERM -> SIGKILL by the kubelet) is this much longer than the
# engine's: the launcher's margin and the process's exit fit in it.
POD_GRACE_MARGIN_S = 60


def final_checkpoint_grace_seconds(job: TrainingJob) -> float:
    """Seconds the engine has for its final checkpoint after SIGTERM.

    The job's `env.CKPT_GRACE_SECONDS` (validated by the spec), else
    `[sat] final_checkpoint_grace_seconds`.
    """
    return float(job.env.get(contract.GRACE_ENV) or sat_setting("final_checkpoint_grace_seconds"))


def pod_grace_seconds(job: TrainingJob, configured: int) -> int:
    """A pod's `terminationGracePeriodSeconds`: `configured`, raised to cover the job's final checkpoint."""
    return max(configured, math.ceil(final_checkpoint_grace_seconds(job)) + POD_GRACE_MARGIN_S)


@dataclass(frozen=True)
class TrainingPaths:
    """The directories a training process sees (host paths locally, pod paths on Kubernetes)."""

    data_dir: str
    output_dir: str
    code_dir: str
    vendor_dir: str


def training_environment(
    job: TrainingJob,
    paths: TrainingPaths,
    plan: Plan,
    *,
    node: str,
    mirror_url: str | None = None,
    s3_endpoint_url: str | None = None,
    metrics_dir: str | None = None,
    metrics_url: str | None = None,
) -> dict[str, str]:
    """Environment variables for attempt `plan.attempt` of `job`.

    `plan.resume_step` is None on a fresh start; otherwise it becomes `CKPT_LAST_STEP`
    (`-1` means "the newest complete checkpoint"). `mirror_url` (the run's
    `<results prefix>checkpoints/`) becomes `CKPT_MIRROR_URL`: the engine copies each
    checkpoint there and restores from it on a fresh node; `s3_endpoint_url` becomes
    `CKPT_S3_ENDPOINT_URL`. With `metrics_dir` the engine's recorder (`ckpt_engine.metrics`)
    writes the job's series there every `SAT_METRICS_INTERVAL_SECONDS` (`[sat]
    metrics_interval_seconds` unless the job's env sets it) and copies them to `metrics_url`
    (`<results prefix>metrics/`); `[sat] otlp_endpoint` becomes `SAT_OTLP_ENDPOINT`. Credentials are not part of this contract: the launcher adds the
    attempt's own `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, scoped to
    the run's data and results prefix (`io.scoped_credentials`, ADR 0020), to the process
    environment only (a pod: references into the attempt's Secret).

    After SIGTERM the engine has `[sat] final_checkpoint_grace_seconds` for its final
    checkpoint (`CKPT_GRACE_SECONDS`, unless the job's env sets it); the local runner and
    the pod's grace period (`pod_grace_seconds`) allow that plus a margin. A distributed job's `torchrun` gets
    `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` of that plus `LAUNCHER_GRACE_MARGIN_S`: by default it
    SIGKILLs its workers 30 s after forwarding SIGTERM, whatever their final checkpoint
    still needs. (The `deepspeed` launcher's 30 s are hard-coded; see ADR 0007.)
    """
    env = dict(job.env)
    env.update(
        {
            contract.VENDOR_ENV: paths.vendor_dir,
            "PYTHONPATH": paths.vendor_dir,
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            contract.JOB_NAME_ENV: job.name,
            contract.ATTEMPT_ENV: str(plan.attempt),
            contract.NODE_ENV: node,
            contract.DATA_DIR_ENV: paths.data_dir,
            contract.OUTPUT_DIR_ENV: paths.output_dir,
            contract.CODE_DIR_ENV: paths.code_dir,
            contract.FRAMEWORK_ENV: job.framework.value,
            contract.NODES_ENV: str(job.nodes),
        }
    )
    grace = final_checkpoint_grace_seconds(job)
    env.setdefault(contract.GRACE_ENV, f"{grace:g}")
    if job.distributed:
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(math.ceil(grace) + LAUNCHER_GRACE_MARGIN_S))
    if plan.resume_step is not None:
        env[contract.LAST_STEP_ENV] = str(plan.resume_step)
    if mirror_url:
        env[contract.MIRROR_URL_ENV] = mirror_url
    if s3_endpoint_url:
        env[contract.S3_ENDPOINT_ENV] = s3_endpoint_url
    if metrics_dir:
        env[contract.METRICS_DIR_ENV] = metrics_dir
        env.setdefault(contract.METRICS_INTERVAL_ENV, sat_setting("metrics_interval_seconds"))
        env[contract.FAILOVERS_USED_ENV] = str(plan.failovers)
        if metrics_url:
            env[contract.METRICS_URL_ENV] = metrics_url
        otlp = sat_setting("otlp_endpoint")
        if otlp:
            env.setdefault(contract.OTLP_ENV, otlp)
    return env


def host_environment(host: Mapping[str, str]) -> dict[str, str]:
    """What a training process keeps of `host` (the starting process's environment): `HOST_ENV_ALLOWED` only.

    Not kept, among the rest: every `AIRFLOW__*` setting and `AIRFLOW_CONN_*` connection (the
    service's secrets), the host's `AWS_*` credentials and profile (the launcher passes the
    attempt's scoped credentials, and nothing else), proxies (their URLs may carry credentials).
    """
    return {name: value for name, value in host.items()
            if name in HOST_ENV_ALLOWED or name.startswith(HOST_ENV_ALLOWED_PREFIXES)}


def process_environment(training: Mapping[str, str], host: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a training process: `host_environment(host)`, then `training`.

    `training` is what SAT means the process to have: `training_environment` (the contract
    and the job's `env`) and the scoped Object Storage credentials its launcher adds; nothing else of
    `host` reaches the process. Every launcher builds its process's environment here.
    """
    return {**host_environment(host), **training}
