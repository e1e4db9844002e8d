"""Names, labels and annotations of every Kubernetes object SAT creates (pods, Service, claim, helper pods).

Pure string work: no kubernetes client, no Airflow.
"""

from __future__ import annotations

import hashlib
import json
import re

from sat_tasks.config import safe_run_id
from sat_tasks.spec import TrainingJob

# Label keys every SAT object carries (selectors, classify and cleanup read them).
LABEL_JOB = "sat.ai/job"

LABEL_RUN_ID = "sat.ai/run-id"

LABEL_DAG = "sat.ai/dag"  # the run's DAG (ADR 0024): a run of another DAG with the same job name and run id is not it

LABEL_ATTEMPT = "sat.ai/attempt"

LABEL_NODE_RANK = "sat.ai/node-rank"

LABEL_ATTEMPT_ID = "sat.ai/attempt-id"  # unique per (job, run, attempt): the Service selector

ANNOTATION_RUN_ID = "sat.ai/run-id"  # the raw run id (a label value cannot hold `:` or `+`)

ANNOTATION_TAGS = "sat.ai/tags"

# How many node ranks an attempt runs (its Service and, when fewer than the job's nodes, its pods): an
# elastic failover may resume on fewer (ADR 0029). Rank 0's launch decides it; the other ranks read it here.
ANNOTATION_RANKS = "sat.ai/ranks"

# Set on the pods of an attempt running on fewer ranks when capacity is back (ADR 0029): why it stops for a
# planned restart to grow back, and the excluded nodes a person released since. The pod's PID 1 sees the
# first through the downward API and SIGTERMs the command (its final checkpoint); classify reads both.
ANNOTATION_PLANNED_RESTART = "sat.ai/planned-restart"
ANNOTATION_READMITTED = "sat.ai/readmitted-nodes"

MANAGED_BY = {"app.kubernetes.io/managed-by": "sat", "app.kubernetes.io/component": "training"}

LABEL_COMPONENT = "app.kubernetes.io/component"
MAX_LABEL = 63



def label_value(value: str) -> str:
    """`value` as a valid label value (<= 63 chars, alphanumeric ends; a hash when changed).

    Same result as the provider's `pod_generator.make_safe_label_value` (tested), so the
    `sat.ai/run-id` label equals the `run_id` label KubernetesPodOperator adds; kept here
    so rendering needs no Airflow import. One fix: a value with no alphanumeric character
    becomes the bare hash (the provider's `-<hash>` is not a valid label value).
    """
    safe = re.sub(r"^[^a-z0-9A-Z]*|[^a-zA-Z0-9_\-\.]|[^a-z0-9A-Z]*$", "", value)
    if len(safe) > MAX_LABEL or value != safe:
        digest = hashlib.md5(value.encode()).hexdigest()[:9]
        safe = safe[: MAX_LABEL - len(digest) - 1] + "-" + digest if safe else digest
    return safe



def _short_hash(value: str, length: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def _run_identity(job: TrainingJob, run_id: str) -> str:
    """What the run hash in names is of: the run's DAG and run id (ADR 0024; a legacy job without a DAG: the run id)."""
    return f"{job.results.dag_id}/{run_id}" if job.results.dag_id else run_id



def _dns_part(value: str) -> str:
    """Lowercase letters, digits and single dashes only (job names may hold dots)."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", value.lower())).strip("-")



def attempt_name(job: TrainingJob, run_id: str, attempt: int) -> str:
    """`sat-<job>-<run hash>-a<attempt>`: the Service name and the pod names' stem.

    A DNS-1035 label short enough for `-r<rank>` to follow (pod hostnames <= 63 chars);
    the run hash keeps two runs of one job apart.
    """
    suffix = f"-{_short_hash(_run_identity(job, run_id))}-a{attempt}"
    room = MAX_LABEL - len("sat-") - len(suffix) - len(f"-r{max(job.nodes - 1, 0)}")
    return f"sat-{_dns_part(job.name)[:room].rstrip('-')}{suffix}"



def pod_name(job: TrainingJob, run_id: str, attempt: int, rank: int) -> str:
    return f"{attempt_name(job, run_id, attempt)}-r{rank}"



def attempt_credentials_name(job: TrainingJob, run_id: str, attempt: int) -> str:
    """`sat-<job>-<run hash>-a<attempt>-s3`: the Secret with the attempt's scoped Object Storage credentials."""
    return f"{attempt_name(job, run_id, attempt)}-s3"



COMPONENT_REGISTRY_LOGIN = "registry-login"  # `app.kubernetes.io/component` of a run's image pull Secret


def registry_secret_name(job: TrainingJob, run_id: str) -> str:
    """`sat-<job>-<run hash>-registry`: the run's image pull Secret, made from its registry login (ADR 0032).

    One per run (its cleanup deletes it; two runs of a job never share one), referenced by
    every pod of the run: training, staging, upload and the warm pool's placeholders.
    """
    return registry_secret_name_of_claim(run_volume_claim_name(job, run_id))


def registry_secret_name_of_claim(claim: str) -> str:
    """The pull Secret of the run whose volume claim is `claim` (a warm state keeps both: ADR 0015, 0032)."""
    return claim.removesuffix("-data") + "-registry"


def registry_secret_labels(job: TrainingJob, run_id: str) -> dict[str, str]:
    """The run's labels (the run's cleanup selects it) with the registry-login component."""
    return {**run_labels(job, run_id), LABEL_COMPONENT: COMPONENT_REGISTRY_LOGIN}



def run_volume_claim_name(job: TrainingJob, run_id: str) -> str:
    """The per-run claim: `sat-<job>-<run hash>-data`."""
    suffix = f"-{_short_hash(_run_identity(job, run_id))}-data"
    return f"sat-{_dns_part(job.name)[: MAX_LABEL - 4 - len(suffix)].rstrip('-')}{suffix}"



def run_volume_subpaths(job: TrainingJob, run_id: str) -> dict[str, str]:
    """Directories of one run inside the claim: `<job>/<run>-<hash>/{data,output,code}`.

    Staging writes the data and the script there; every attempt mounts them at the pod paths
    of `runtime_env` (POD_DATA_DIR, POD_OUTPUT_DIR, POD_CODE_DIR). The run part keeps a
    shared claim safe for many runs.
    """
    # safe_run_id folds distinct ids together (`:` and `_` both become `_`): the hash keeps them apart.
    root = f"{job.name}/{safe_run_id(run_id)[:80]}-{_short_hash(_run_identity(job, run_id))}"
    return {"data": f"{root}/data", "output": f"{root}/output", "code": f"{root}/code"}



def labels(job: TrainingJob, run_id: str, attempt: int) -> dict[str, str]:
    return {
        LABEL_JOB: job.name,
        LABEL_RUN_ID: label_value(run_id),
        **_dag_label(job),
        LABEL_ATTEMPT: str(attempt),
        LABEL_ATTEMPT_ID: attempt_name(job, run_id, attempt),
        **MANAGED_BY,
    }



def attempt_label_selector(job: TrainingJob, run_id: str, attempt: int) -> str:
    """Label selector matching every object of one attempt (for cleanup and for classify)."""
    return f"{LABEL_ATTEMPT_ID}={attempt_name(job, run_id, attempt)}"



def annotations(job: TrainingJob, run_id: str) -> dict[str, str]:
    annotations = {ANNOTATION_RUN_ID: run_id}
    if job.tags:
        annotations[ANNOTATION_TAGS] = json.dumps(job.tags, sort_keys=True)
    return annotations


def run_label_selector(job: TrainingJob, run_id: str) -> str:
    """Label selector matching every object of one run (claim, helper pods, attempts)."""
    return f"{LABEL_JOB}={job.name},{LABEL_RUN_ID}={label_value(run_id)}" + "".join(
        f",{key}={value}" for key, value in _dag_label(job).items())


def run_labels(job: TrainingJob, run_id: str) -> dict[str, str]:
    """The labels of a run-level object (the claim, a staging or upload pod)."""
    return {LABEL_JOB: job.name, LABEL_RUN_ID: label_value(run_id), **_dag_label(job), **MANAGED_BY}


def _dag_label(job: TrainingJob) -> dict[str, str]:
    return {LABEL_DAG: label_value(job.results.dag_id)} if job.results.dag_id else {}


def helper_pod_name(job: TrainingJob, run_id: str, purpose: str) -> str:
    """`sat-<job>-<run hash>-<purpose>` (`stage`, `upload`): one helper pod of each kind per run."""
    return run_volume_claim_name(job, run_id).removesuffix("-data") + f"-{purpose}"
