"""Retraining when data changes: the `sat_data_changes` DAG emits an Asset event when a watched data prefix changes.

A job spec with `schedule: asset:s3://bucket/prefix/` runs when the Asset `s3://bucket/prefix/`
gets an event. Something has to notice that new data landed: this DAG, every
`[sat] data_watch_interval_seconds` (default 60), lists each such prefix and compares a
fingerprint of its objects (keys, sizes, ETags) with what the previous look saw, kept in
the Airflow Variable `sat_data_watch:<uri>` (readable in the UI; an XCom of earlier runs
cannot be read back in a defined order).
A change succeeds the prefix's task, whose outlet is the Asset, so Airflow records the
event and schedules the job; no change skips the task (no event). The first look is the
baseline: data that was already there does not start a run.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Asset, Variable, task
from airflow.sdk.exceptions import AirflowSkipException

from sat_tasks.config import sat_setting
from sat_tasks.spec import TrainingJob

WATCH_DAG_ID = "sat_data_changes"
VARIABLE_PREFIX = "sat_data_watch:"


def watched_prefixes(jobs: list[TrainingJob]) -> dict[str, list[str]]:
    """Asset URI -> the names of the jobs it schedules."""
    prefixes: dict[str, list[str]] = {}
    for job in jobs:
        if job.schedule and job.schedule.startswith("asset:"):
            prefixes.setdefault(job.schedule[len("asset:"):], []).append(job.name)
    return prefixes


def build_watch_dag(jobs: list[TrainingJob], fileloc: str | None = None) -> DAG | None:
    """The watcher DAG for the asset-scheduled jobs among `jobs` (None when there are none)."""
    from sat_tasks.airflow.dag_factory import DEFAULT_ARGS, START_DATE

    prefixes = watched_prefixes(jobs)
    if not prefixes:
        return None
    interval = timedelta(seconds=float(sat_setting("data_watch_interval_seconds", default="60")))
    with DAG(dag_id=WATCH_DAG_ID, schedule=interval, start_date=START_DATE, catchup=False, max_active_runs=1,
             default_args={**DEFAULT_ARGS, "retries": 0}, tags=["sat", "data-watch"],
             doc_md=__doc__) as dag:
        if fileloc:
            dag.fileloc = fileloc
        for number, (uri, names) in enumerate(sorted(prefixes.items()), start=1):
            _watch_task(uri, names, f"watch_{number}")
    return dag


def _watch_task(uri: str, names: list[str], task_id: str):
    @task(task_id=task_id, outlets=[Asset(uri)], multiple_outputs=False,  # one XCom, not one per key too
          doc_md=f"Watches `{uri}` for {', '.join(names)}.")
    def watch() -> dict:
        from sat_tasks.io.object_storage import object_storage_hook, prefix_fingerprint

        now = prefix_fingerprint(object_storage_hook(sat_setting("object_storage_conn_id")), uri)
        key = f"{VARIABLE_PREFIX}{uri}"
        before = Variable.get(key, default=None, deserialize_json=True)
        Variable.set(key, now, description=f"what {WATCH_DAG_ID} last saw under {uri}", serialize_json=True)
        if before is None:
            raise AirflowSkipException(f"{uri}: first look ({now['objects']} objects); a change from here on "
                                       f"starts {', '.join(names)}")
        if before["digest"] == now["digest"]:
            raise AirflowSkipException(f"{uri}: unchanged ({now['objects']} objects)")
        print(f"[sat] {uri} changed ({before['objects']} -> {now['objects']} objects): an Asset event for "
              f"{', '.join(names)}", flush=True)
        return now

    return watch()
