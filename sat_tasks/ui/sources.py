"""Where the view's data comes from: the Training Job specs, Object Storage, and the run a request names.

Only the API server imports this module (through the routers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.models.dagrun import DagRun
from fastapi import HTTPException

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.config import sat_setting
from sat_tasks.io.object_storage import (
    ObjectStream,
    object_storage_hook,
    open_object_stream,
    read_json,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob, split_s3_uri
from sat_tasks.ui import dag_runs
from sat_tasks.ui.jobs import ReadJson, RunRef, job_of, job_page
from sat_tasks.ui.run_index import SPECS


def job_specs() -> dict[str, TrainingJob]:
    """The job DAGs' specs by DAG id, from `[sat] jobs_dir` (a new, removed or renamed file counts at once, a file
    rewritten in place within `run_index.SPEC_RECHECK_S`; each is parsed once per change: `run_index.SPECS`)."""
    return SPECS.jobs(sat_setting("jobs_dir"))


def object_storage() -> Any:
    """The S3Hook of SAT's Object Storage connection."""
    return object_storage_hook(sat_setting("object_storage_conn_id"))


def object_stream(uri: str) -> ObjectStream | None:
    """The Object Storage object at `uri` opened for a streamed download (the job log); None when missing."""
    return open_object_stream(object_storage(), uri)


def json_reader(hook: Any) -> ReadJson:
    """`read(uri)`: the JSON object at `uri`, None when it is missing or unreadable (a page shows what there is)."""
    def read(uri: str) -> Any:
        try:
            return read_json(hook, uri)
        except Exception:  # noqa: BLE001 - an unreadable record shows as missing on the page, never a 500
            return None

    return read


def object_sizes(hook: Any, prefix_uri: str) -> dict[str, int]:
    """The objects under an s3:// prefix: name relative to the prefix -> size in bytes (the Checkpoints tab's check)."""
    bucket, prefix = split_s3_uri(prefix_uri)
    sizes: dict[str, int] = {}
    paginator = hook.get_conn().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            sizes[item["Key"][len(prefix):]] = int(item["Size"])
    return sizes


def uri_exists(hook: Any, uri: str) -> bool:
    """Whether an s3:// object exists, or (for a URI ending in /) the prefix holds at least one object."""
    bucket, key = split_s3_uri(uri)
    if uri.endswith("/"):
        answer = hook.get_conn().list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        return bool(answer.get("KeyCount") or answer.get("Contents"))
    return bool(hook.check_for_key(key, bucket_name=bucket))


@dataclass(frozen=True)
class JobRunFound:
    """The run a request names: the DAG run, its reference and the Training Job it ran."""

    run: DagRun
    ref: RunRef
    job: TrainingJob

    @property
    def state(self) -> str:
        return self.ref.state

    @property
    def layout(self) -> JobRun:
        return JobRun(self.job, self.ref.run_id)


def find_job_run(session: Any, dag_id: str, run_id: str) -> JobRunFound:
    """The run `run_id` of the Training Job DAG `dag_id`, its layout the one it recorded at validate_spec (ADR 0024).

    404 when there is none, it is not a Training Job's, or its recorded results are not its DAG's:
    every read and action of the view goes through here, so none reaches another DAG's objects.
    """
    run = dag_runs.find_run(session, dag_id, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
    ref = dag_runs.recorded_run_ref(session, run)
    job = job_of(ref, job_specs(), GENERIC_DAG_ID)
    if job is None:
        raise HTTPException(404, f"{dag_id!r} is not a Training Job DAG, or its run {run_id!r} has no valid spec "
                                 "or no results of its own")
    return JobRunFound(run, ref, job)


def page_data(found: JobRunFound) -> dict[str, Any]:
    """The job page's data (the JSON API's answer, the HTML page's context)."""
    hook = object_storage()
    return job_page(found.ref, found.job, json_reader(hook), lambda prefix: object_sizes(hook, prefix))
