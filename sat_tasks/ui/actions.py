"""What the Training Jobs view's actions do to a run's objects: Stop, Delete (results), Tags.

The Airflow side (who may, the DAG run's state, the metadata DB) is `sat_tasks.ui.api`'s;
these functions take an S3Hook-like object and the run's layout, so they are tested
against a real S3 server without an API server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sat_tasks.core.clock import now_utc
from sat_tasks.io import object_storage as storage
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SpecError, TrainingJob, parse_spec, split_s3_uri
from sat_tasks.ui.create import FormResult, parse_tag_lines

VIA = "the Training Jobs view"
DELETE_BATCH = 1000  # keys per DeleteObjects call (the S3 API's limit)


def request_stop(hook: Any, run: JobRun, by: str, *, via: str = VIA, at: datetime | None = None) -> dict[str, str]:
    """Write the run's stop request (who, when, from where) and return it.

    The local backend's launcher reads it within seconds and passes it on to the training
    as SIGTERM (the engine's final checkpoint); `decide` then ends the job as Stopped.
    """
    request = {"by": by, "at": (at or now_utc()).isoformat(), "via": via}
    storage.write_json(hook, run.stop_uri, request)
    return request


def parse_tags(job: TrainingJob, text: str) -> tuple[dict[str, str] | None, list[str]]:
    """Tags from `key=value` lines, checked with the spec model's tag rules: (tags, []) or (None, problems)."""
    result = FormResult(values={})
    tags = parse_tag_lines(text, result)
    problems = [line for lines in result.errors.values() for line in lines]
    if not problems:
        try:
            parse_spec({**job.to_dict(), "tags": tags}, source="tags")
        except SpecError as exc:
            problems = [str(p) for p in exc.problems if p.field.startswith("tags")]
    return (None, problems) if problems else (tags, [])


def save_tags(hook: Any, run: JobRun, tags: dict[str, str]) -> None:
    """Keep the run's edited tags next to its results (the list and the page show them from there)."""
    storage.write_json(hook, run.tags_uri, tags)


def delete_results(hook: Any, run: JobRun) -> int:
    """Delete every object under the run's results prefix; return how many were deleted."""
    bucket, prefix = split_s3_uri(run.results_uri)
    keys = hook.list_keys(bucket_name=bucket, prefix=prefix) or []
    for start in range(0, len(keys), DELETE_BATCH):
        hook.delete_objects(bucket=bucket, keys=keys[start:start + DELETE_BATCH])
    return len(keys)


def object_sizes(hook: Any, prefix_uri: str) -> dict[str, int]:
    """The objects under an s3:// prefix: name relative to the prefix -> size in bytes."""
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
