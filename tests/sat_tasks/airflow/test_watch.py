"""The data watcher: one task per watched prefix, its outlet the Asset the jobs are scheduled on."""

from __future__ import annotations

import copy

from airflow.sdk import Asset

from sat_tasks.airflow.watch import WATCH_DAG_ID, build_watch_dag, watched_prefixes
from sat_tasks.io.object_storage import prefix_fingerprint
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE


def _job(name: str, schedule: str | None):
    spec = copy.deepcopy(BASE)
    spec["name"] = name
    if schedule:
        spec["schedule"] = schedule
    return parse_spec(spec)


def test_no_asset_scheduled_job_no_dag():
    assert build_watch_dag([_job("nightly", "@daily"), _job("manual", None)]) is None


def test_one_task_per_prefix_with_the_asset_as_outlet():
    jobs = [_job("job-a", "asset:s3://data/x/"), _job("job-b", "asset:s3://data/x/"), _job("job-c", "asset:s3://data/y/"),
            _job("job-d", "0 3 * * *")]
    assert watched_prefixes(jobs) == {"s3://data/x/": ["job-a", "job-b"], "s3://data/y/": ["job-c"]}
    dag = build_watch_dag(jobs)
    assert dag.dag_id == WATCH_DAG_ID and dag.max_active_runs == 1
    outlets = {task.task_id: [asset.uri for asset in task.outlets] for task in dag.tasks}
    # the same Asset the job DAGs are scheduled on (Airflow normalises the URI the same way for both)
    assert outlets == {"watch_1": [Asset("s3://data/x/").uri], "watch_2": [Asset("s3://data/y/").uri]}


def test_fingerprint_changes_with_added_replaced_and_removed_objects(s3_hook):
    bucket = "watch-tests"
    if not s3_hook.check_for_bucket(bucket):
        s3_hook.create_bucket(bucket_name=bucket, region_name="us-east-1")
    uri = f"s3://{bucket}/data/"
    empty = prefix_fingerprint(s3_hook, uri)
    assert empty["objects"] == 0
    s3_hook.load_bytes(b"one", key="data/a.txt", bucket_name=bucket, replace=True)
    s3_hook.load_bytes(b"other prefix", key="elsewhere/b.txt", bucket_name=bucket, replace=True)
    one = prefix_fingerprint(s3_hook, uri)
    assert one["objects"] == 1 and one != empty
    assert prefix_fingerprint(s3_hook, uri) == one  # nothing changed: the same
    s3_hook.load_bytes(b"ONE", key="data/a.txt", bucket_name=bucket, replace=True)
    replaced = prefix_fingerprint(s3_hook, uri)
    assert replaced["objects"] == 1 and replaced != one
    s3_hook.delete_objects(bucket=bucket, keys=["data/a.txt"])
    assert prefix_fingerprint(s3_hook, uri) == empty
