"""The environment contract between SAT and a training process, the same on every backend."""

from __future__ import annotations

from dataclasses import dataclass

from sat_tasks.spec import TrainingJob

# Where the training image carries the vendored checkpoint engine (docker/training.Dockerfile).
IMAGE_VENDOR_DIR = "/opt/sat/checkpoint_vendor"
# Paths inside a Kubernetes pod.
POD_DATA_DIR = "/opt/sat/data"
POD_OUTPUT_DIR = "/opt/sat/output"
POD_CODE_DIR = "/opt/sat/code"


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
    *,
    attempt: int,
    node: str,
    resume_step: int | None,
    mirror_url: str | None = None,
    s3_endpoint_url: str | None = None,
) -> dict[str, str]:
    """Environment variables for one attempt of `job`.

    `resume_step` is None on a fresh start; otherwise it becomes `CKPT_LAST_STEP`
    (`-1` means "the newest complete checkpoint"). `mirror_url` (the run's
    `<results prefix>checkpoints/`) becomes `CKPT_MIRROR_URL`: the engine copies each
    checkpoint there and restores from it on a fresh node; `s3_endpoint_url` becomes
    `CKPT_S3_ENDPOINT_URL`. Credentials are not part of this contract: the launcher adds
    `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` to the process environment only.
    """
    env = dict(job.env)
    env.update(
        {
            "CHECKPOINT_VENDOR": paths.vendor_dir,
            "PYTHONPATH": paths.vendor_dir,
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "SAT_JOB_NAME": job.name,
            "SAT_ATTEMPT": str(attempt),
            "SAT_NODE": node,
            "SAT_DATA_DIR": paths.data_dir,
            "SAT_OUTPUT_DIR": paths.output_dir,
            "SAT_CODE_DIR": paths.code_dir,
            "SAT_FRAMEWORK": job.framework.value,
            "SAT_NODES": str(job.nodes),
        }
    )
    if resume_step is not None:
        env["CKPT_LAST_STEP"] = str(resume_step)
    if mirror_url:
        env["CKPT_MIRROR_URL"] = mirror_url
    if s3_endpoint_url:
        env["CKPT_S3_ENDPOINT_URL"] = s3_endpoint_url
    return env
