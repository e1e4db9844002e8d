"""What a person's actions do: Stop, Tags, Delete (a run's records and results), and releasing a quarantined node.

The Airflow side (who may, the DAG run's state, the metadata DB) is the view's
(`sat_tasks.ui`): these functions take the run's layout (and an S3Hook-like object where
they only touch Object Storage), so they are tested against a real S3 server without an
API server. Stop asks the run's backend what a stop request does there
(`BackendCapabilities.watches_stop_request`); it never names a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sat_tasks.backends import backend_for, get_backend
from sat_tasks.backends.base import release_node_on
from sat_tasks.config import sat_setting
from sat_tasks.core.clock import now_utc
from sat_tasks.core.policy import stop_reason
from sat_tasks.core.status import JobStatus
from sat_tasks.io import object_storage as storage
from sat_tasks.io.node_ledger import NodeLedger, NodeRelease
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import split_s3_uri

VIA = "the Training Jobs view"  # the route a person's action came through: the view's pages ...
VIA_API = "the REST API"  # ... or its JSON endpoints (`/sat/api/...`)
DELETE_BATCH = 1000  # keys per DeleteObjects call (the S3 API's limit)


@dataclass(frozen=True)
class StopOutcome:
    """What Stop did: the request it wrote, whether the caller must end the DAG run, and how the job stops."""

    request: dict[str, str]
    end_run: bool
    how: str


def request_stop(hook: Any, run: JobRun, by: str, *, via: str = VIA, at: datetime | None = None) -> dict[str, str]:
    """Write the run's stop request (who, when, from where) and return it.

    A backend that watches it (the local one: its launcher reads it within seconds) passes it
    on to the training as SIGTERM (the engine's final checkpoint); `decide` then ends the job
    as Stopped.
    """
    request = {"by": by, "at": (at or now_utc()).isoformat(), "via": via}
    storage.write_json(hook, run.stop_uri, request)
    return request


def stop_job(run: JobRun, by: str, *, training_launched: bool, via: str = VIA,
             at: datetime | None = None) -> StopOutcome:
    """Stop a queued or running job: write the request; where nothing passes it on, record Stopped.

    `training_launched`: an attempt's launch task is running. When the run's backend watches
    the request, the training stops itself and the status turns Stopped when it has. Else the
    status history says Stopped now, and the caller ends the DAG run (`StopOutcome.end_run`):
    the launch task's on_kill gives the training its grace period for a final checkpoint.
    """
    request = request_stop(run.hook(), run, by, via=via, at=at)
    if training_launched and backend_for(run.job).capabilities.watches_stop_request:
        return StopOutcome(request, False, "the training gets SIGTERM within seconds and writes a final checkpoint; "
                                           "the status turns Stopped when it has")
    reason = stop_reason(request) + ("" if training_launched else " before training ran")
    run.history(log=lambda _line: None).record(JobStatus.STOPPED, reason, task="stop")
    return StopOutcome(request, True, "the run was ended; its training pods get their grace period for a final "
                                      "checkpoint" if training_launched else
                       "the run was ended before its training started")


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



def release_node(ledger: NodeLedger, node: str, *, by: str, note: str = "", log=print) -> NodeRelease:
    """Lift `node`'s quarantine (`sat nodes release`, the Nodes page): a release marker that every job's next
    placement reads, then the deployment's backend undoes what it did to the node itself (an uncordon)."""
    marker = ledger.release(node, by=by, note=note)
    release_node_on(get_backend(sat_setting("backend")), node, log)
    return marker
