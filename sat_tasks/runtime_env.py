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
) -> dict[str, str]:
    """Environment variables for one attempt of `job`.

    `resume_step` is None on a fresh start; otherwise it becomes `CKPT_LAST_STEP`
    (`-1` means "the newest complete checkpoint").
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
    return env
