"""Issue 44.5 and 44.7: the training writes only its checkpoints, metrics and outputs, and its keys die with its run.

With the credentials SAT's `AssumeRole` gets for an attempt, against the embedded Object
Storage (moto behind the SigV4 gate, `io.s3_gate`): a write under `checkpoints/`, `metrics/` or
`output/` of the run's results prefix is allowed; a write of SAT's own records there (the
attempt record, the status history, the stop request, the warm state, the report, the job log)
is AccessDenied, so a forged attempt record can no longer quarantine a node. Then revocation
(ADR 0039): the credentials of a run that ended (its status terminal beyond the final
checkpoint's grace) or was deleted are refused, whatever their 12 h lifetime says.
"""

from __future__ import annotations

import datetime
import json
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from sat_tasks.io import scoped_credentials
from sat_tasks.io.local_s3 import LOCAL_REGION
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.io.scoped_credentials import assume_run_role, run_policy
from sat_tasks.spec import parse_spec

BUCKET = "sat-write-scope"


def _layout(run_id: str) -> JobRun:
    job = parse_spec({
        "name": "job-w", "nodes": 1, "job_failover": False, "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": f"s3://{BUCKET}/datasets/job-w/"}, "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python t.py"}).with_backend("local")
    return JobRun(scoped(job, "team_dag"), run_id)


def _service(server):
    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name=LOCAL_REGION,
                        aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)


def _training_client(server, layout: JobRun):
    sts = boto3.client("sts", endpoint_url=server.endpoint_url, region_name=LOCAL_REGION,
                       aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
    issued = assume_run_role(sts, layout, attempt=1)
    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name=LOCAL_REGION,
                        aws_access_key_id=issued.access_key_id, aws_secret_access_key=issued.secret_access_key,
                        aws_session_token=issued.session_token)


def _key(layout: JobRun) -> str:
    return layout.results_uri.split("/", 3)[3]


def _status(service, layout: JobRun, status: str, at: datetime.datetime) -> None:
    entry = {"status": status, "at": at.isoformat(), "reason": "test", "attempt": 1, "task": "test"}
    service.put_object(Bucket=BUCKET, Key=_key(layout) + "status.json", Body=json.dumps([entry]).encode())


@pytest.fixture(scope="module")
def store(s3_server):
    service = _service(s3_server)
    try:
        service.create_bucket(Bucket=BUCKET)
    except ClientError:
        pass
    service.put_object(Bucket=BUCKET, Key="datasets/job-w/part-0.txt", Body=b"data")
    return s3_server


def _denied(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    assert raised.value.response["Error"]["Code"] == "AccessDenied", raised.value.response
    return raised.value.response["Error"]["Message"]


# ---- 44.5: write only checkpoints/, metrics/, output/ ------------------------------------------------
SAT_RECORDS = ["attempts/attempt-1.json", "attempts/attempt-1.verdict.json", "attempts/attempt-1.log",
               "status.json", "stop.json", "warm.json", "tags.json", "report.json", "report.html", "job.log",
               "task-failures/launch_attempt_1.json", "planted.bin"]


def test_the_training_writes_its_checkpoints_metrics_and_outputs_and_never_sats_records(store):
    layout = _layout(f"manual__scope-{uuid.uuid4().hex[:6]}")
    service, prefix = _service(store), _key(layout)
    _status(service, layout, "Running", datetime.datetime.now(datetime.UTC))
    training = _training_client(store, layout)
    for key in ("checkpoints/checkpoint-1/manifest.json", "checkpoints/progress.json",
                "metrics/attempt-1/local-node-0/training.jsonl", "output/model.safetensors"):
        training.put_object(Bucket=BUCKET, Key=prefix + key, Body=b"ok")
    listed = training.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "checkpoints/")
    assert len(listed["Contents"]) == 2
    assert json.loads(training.get_object(Bucket=BUCKET, Key=prefix + "status.json")["Body"].read())  # its own state
    for record in SAT_RECORDS:
        _denied(lambda record=record: training.put_object(Bucket=BUCKET, Key=prefix + record, Body=b'{"forged": 1}'))
    _denied(lambda: training.delete_object(Bucket=BUCKET, Key=prefix + "status.json"))
    _denied(lambda: training.copy_object(Bucket=BUCKET, Key=prefix + "attempts/attempt-1.json",
                                         CopySource={"Bucket": BUCKET, "Key": prefix + "checkpoints/progress.json"}))
    _denied(lambda: training.list_objects_v2(Bucket=BUCKET, Prefix=prefix))  # the prefix's root is SAT's
    assert json.loads(service.get_object(Bucket=BUCKET, Key=prefix + "status.json")["Body"].read())[0]["status"] \
        == "Running"
    assert "attempts/attempt-1.json" not in {o["Key"][len(prefix):] for o in service.list_objects_v2(
        Bucket=BUCKET, Prefix=prefix).get("Contents", [])}


def test_the_policy_grants_the_three_folders_and_names_the_run():
    layout = _layout("manual__policy")
    policy = run_policy(layout)
    writes = next(s for s in policy["Statement"] if s["Sid"] == "ReadWriteObjects")["Resource"]
    bucket, prefix = BUCKET, _key(layout)
    assert writes == sorted(f"arn:aws:s3:::{bucket}/{prefix}{folder}*" for folder in ("checkpoints/", "metrics/",
                                                                                       "output/"))
    state = next(s for s in policy["Statement"] if s["Sid"] == "RunState")
    assert state["Action"] == ["s3:GetObject"] and state["Resource"] == [f"arn:aws:s3:::{bucket}/{prefix}status.json"]


# ---- 44.7: revoked when the run ended or was deleted ------------------------------------------------
def test_the_credentials_of_an_ended_run_are_refused_after_the_grace(store):
    service, now = _service(store), datetime.datetime.now(datetime.UTC)
    ended_now, ended_long_ago = (_layout(f"manual__ended-{n}-{uuid.uuid4().hex[:6]}") for n in (1, 2))
    clients = {}
    for layout in (ended_now, ended_long_ago):
        _status(service, layout, "Running", now)
        clients[layout.run_id] = _training_client(store, layout)
        clients[layout.run_id].put_object(Bucket=BUCKET, Key=_key(layout) + "checkpoints/a", Body=b"ok")
    _status(service, ended_now, "Stopped", now)  # a stopped pod's final checkpoint still lands
    clients[ended_now.run_id].put_object(Bucket=BUCKET, Key=_key(ended_now) + "checkpoints/final", Body=b"ok")
    _status(service, ended_long_ago, "Completed", now - datetime.timedelta(hours=1))
    training = clients[ended_long_ago.run_id]
    message = _denied(lambda: training.put_object(Bucket=BUCKET, Key=_key(ended_long_ago) + "checkpoints/b",
                                                  Body=b"late"))
    assert "revoked" in message and "ended (Completed" in message
    _denied(lambda: training.get_object(Bucket=BUCKET, Key="datasets/job-w/part-0.txt"))  # its data too
    _status(service, ended_long_ago, "Running", now)  # a person cleared the run: it runs again
    training.put_object(Bucket=BUCKET, Key=_key(ended_long_ago) + "checkpoints/c", Body=b"ok")


def test_the_credentials_of_a_deleted_run_are_refused_even_with_its_results_gone(store, s3_hook):
    service = _service(store)
    layout = _layout(f"manual__deleted-{uuid.uuid4().hex[:6]}")
    _status(service, layout, "Running", datetime.datetime.now(datetime.UTC))
    training = _training_client(store, layout)
    training.put_object(Bucket=BUCKET, Key=_key(layout) + "checkpoints/a", Body=b"ok")
    marker = scoped_credentials.revoke_run_credentials(s3_hook, layout, why="the run was deleted")
    REVOKED_PREFIX = scoped_credentials.REVOKED_PREFIX
    assert marker == f"s3://{BUCKET}/{REVOKED_PREFIX}{_key(layout)}revoked.json"
    message = _denied(lambda: training.put_object(Bucket=BUCKET, Key=_key(layout) + "checkpoints/b", Body=b"x"))
    assert "revoked" in message and "the run was deleted" in message
    service.delete_object(Bucket=BUCKET, Key=_key(layout) + "status.json")  # its results deleted: still refused
    _denied(lambda: training.list_objects_v2(Bucket=BUCKET, Prefix=_key(layout) + "checkpoints/"))
    _denied(lambda: training.put_object(Bucket=BUCKET, Key=REVOKED_PREFIX + _key(layout) + "revoked.json",
                                        Body=b"x"))  # nor can a live run's training lift a marker


def test_revocation_reads_the_runs_records_only_and_spares_a_policy_without_a_run():
    revoked_because, REVOKED_PREFIX = scoped_credentials.revoked_because, scoped_credentials.REVOKED_PREFIX
    policy = run_policy(_layout("manual__pure"))
    objects: dict[tuple[str, str], bytes] = {}
    read = lambda bucket, key: objects.get((bucket, key))
    now = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
    assert revoked_because(policy, read, now=now) is None  # no status yet: a run being set up
    prefix = _key(_layout("manual__pure"))
    objects[(BUCKET, prefix + "status.json")] = json.dumps(
        [{"status": "Failed", "at": "2026-01-01T11:00:00+00:00"}]).encode()
    assert revoked_because(policy, read, now=now, grace_seconds=7200) is None
    assert "ended (Failed" in revoked_because(policy, read, now=now, grace_seconds=60)
    objects[(BUCKET, prefix + "status.json")] = b"[{\"status\": \"Running\"}]"
    objects[(BUCKET, REVOKED_PREFIX + prefix + "revoked.json")] = b"not json"
    assert "revoked" in revoked_because(policy, read, now=now)
    legacy = {"Version": "2012-10-17", "Statement": [s for s in policy["Statement"] if s["Sid"] != "RunState"]}
    assert revoked_because(legacy, read, now=now) is None
