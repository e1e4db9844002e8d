"""A co-tenant's probe, run as a Training Job's command (tests/e2e/test_service.py, issue 29): what it sees, reaches.

It prints one line, `SAT-TENANCY-PROBE <json>`, into the job's log:

- `env`: its whole environment, every name with its value, except the values of the attempt's
  temporary `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, shown as `sha256:<digest>` (the
  test compares digests; the log is readable by every viewer of the DAG);
- `probes`: for each Object Storage request it tries with the credentials SAT gave this
  attempt (the standard AWS variables, `CKPT_S3_ENDPOINT_URL`), `allowed` or the error code
  the store answered (`HTTP <status>` when the answer had no code); and, as issue 42's
  co-tenant did, with the service's key id (`sat-local`, no secret) and a made-up secret, and
  moto's `/moto-api/reset` (ADR 0037).

Its own results prefix is `CKPT_MIRROR_URL` without `checkpoints/` (the runtime contract). The
job's `env` names the other targets: `SAT_PROBE_DATA` (its own `data.source`), `SAT_PROBE_SCRIPTS`
(its `storage.script_url`), `SAT_PROBE_OTHER_RUN` and `SAT_PROBE_TWIN_RUN` (results prefixes of
another run of its job and of a generic-DAG run of the same name, each holding `victim.txt`),
`SAT_PROBE_OTHER_BUCKET` (a bucket holding `victim.txt`). It never fails on an answer: the test
judges them.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

HIDDEN = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MARK = "SAT-TENANCY-PROBE"
SERVICE_KEY_ID = "sat-local"  # the embedded store's service key id: no secret (its secret is generated)


def split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def outcome(call) -> str:
    try:
        call()
    except ClientError as exc:
        return exc.response.get("Error", {}).get("Code") or \
            f"HTTP {exc.response.get('ResponseMetadata', {}).get('HTTPStatusCode')}"
    except BotoCoreError as exc:
        return f"error {type(exc).__name__}"
    return "allowed"


def moto_reset(endpoint: str, credentials: Credentials):
    """POST /moto-api/reset, SigV4-signed with `credentials`: `allowed` or the store's error code."""
    def call() -> str:
        request = AWSRequest(method="POST", url=endpoint.rstrip("/") + "/moto-api/reset", data=b"")
        S3SigV4Auth(credentials, "s3", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")).add_auth(request)
        prepared = request.prepare()
        try:
            with urllib.request.urlopen(urllib.request.Request(prepared.url, data=b"", method="POST",
                                                               headers=dict(prepared.headers)), timeout=60):
                return "allowed"
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            return body.partition("<Code>")[2].partition("</Code>")[0] or f"HTTP {exc.code}"
        except OSError as exc:
            return f"error {type(exc).__name__}"
    return call


def environment() -> dict[str, str]:
    return {name: f"sha256:{hashlib.sha256(value.encode()).hexdigest()}" if name in HIDDEN else value
            for name, value in sorted(os.environ.items())}


def main() -> None:
    endpoint = os.environ["CKPT_S3_ENDPOINT_URL"]
    config = Config(retries={"max_attempts": 2}, connect_timeout=10, read_timeout=60,
                    s3={"addressing_style": "path"})
    s3 = boto3.client("s3", endpoint_url=endpoint, config=config)
    sts = boto3.client("sts", endpoint_url=endpoint, config=config)
    mirror = os.environ["CKPT_MIRROR_URL"]
    assert mirror.endswith("/checkpoints/"), mirror
    bucket, own = split(mirror[:-len("checkpoints/")])
    data_bucket, data = split(os.environ["SAT_PROBE_DATA"])
    scripts_bucket, scripts = split(os.environ["SAT_PROBE_SCRIPTS"])
    _, other = split(os.environ["SAT_PROBE_OTHER_RUN"])
    _, twin = split(os.environ["SAT_PROBE_TWIN_RUN"])
    elsewhere = os.environ["SAT_PROBE_OTHER_BUCKET"]
    listed = {}

    def list_data() -> None:
        listed.update(s3.list_objects_v2(Bucket=data_bucket, Prefix=data))

    def put(bucket_name: str, key: str):
        return lambda: s3.put_object(Bucket=bucket_name, Key=key, Body=b"planted by the tenancy probe")

    def get(bucket_name: str, key: str):
        return lambda: s3.get_object(Bucket=bucket_name, Key=key)["Body"].read()

    probes = {"list its data": outcome(list_data)}
    first = next((o["Key"] for o in listed.get("Contents", [])), data + "part-00.txt")
    probes.update({
        "read its data": outcome(get(data_bucket, first)),
        # its own results: the training writes checkpoints/, metrics/ and output/ only (issue 44.5, ADR 0039)
        "write its own results": outcome(put(bucket, own + "output/tenancy-probe/written.txt")),
        "read its own results": outcome(get(bucket, own + "output/tenancy-probe/written.txt")),
        "list its own results": outcome(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=own + "output/")),
        "delete its own results": outcome(lambda: s3.delete_object(Bucket=bucket,
                                                                   Key=own + "output/tenancy-probe/written.txt")),
        # SAT's own records of its run: never the training's to write
        "write its attempt record": outcome(put(bucket, own + "attempts/attempt-1.json")),
        "write its status history": outcome(put(bucket, own + "status.json")),
        "write its stop request": outcome(put(bucket, own + "stop.json")),
        "write its report": outcome(put(bucket, own + "report.json")),
        # read-only: its data and its scripts
        "write its data": outcome(put(data_bucket, data + "planted.txt")),
        "write its scripts": outcome(put(scripts_bucket, scripts + "planted.py")),
        # another run of the same job (the same DAG): read, list, write, stop, plant a checkpoint, delete
        "read another run's results": outcome(get(bucket, other + "victim.txt")),
        "list another run's results": outcome(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=other)),
        "write another run's results": outcome(put(bucket, other + "planted.txt")),
        "stop another run": outcome(put(bucket, other + "stop.json")),
        "plant a checkpoint in another run": outcome(put(bucket, other + "checkpoints/checkpoint-999/planted.bin")),
        "copy another run's results into its own": outcome(lambda: s3.copy_object(
            Bucket=bucket, Key=own + "output/tenancy-probe/copied.txt",
            CopySource={"Bucket": bucket, "Key": other + "victim.txt"})),
        "delete another run's results": outcome(lambda: s3.delete_object(Bucket=bucket, Key=other + "victim.txt")),
        # a run of another DAG (the generic DAG) with the same job name
        "read another DAG's run": outcome(get(bucket, twin + "victim.txt")),
        "write another DAG's run": outcome(put(bucket, twin + "status.json")),
        # the bucket and the store as a whole
        "list the bucket": outcome(lambda: s3.list_objects_v2(Bucket=bucket)),
        "list every job's results": outcome(lambda: s3.list_objects_v2(Bucket=bucket,
                                                                       Prefix=own.split("/")[0] + "/")),
        "list the buckets": outcome(s3.list_buckets),
        "read another bucket": outcome(get(elsewhere, "victim.txt")),
        "write another bucket": outcome(put(elsewhere, "planted.txt")),
        "create a bucket": outcome(lambda: s3.create_bucket(Bucket="sat-tenancy-planted")),
        "get wider credentials from STS": outcome(lambda: sts.assume_role(
            RoleArn="arn:aws:iam::123456789012:role/sat", RoleSessionName="wider", DurationSeconds=900)),
    })
    # Issue 42's co-tenant: the service's key id with a made-up secret; moto's reset (ADR 0037).
    forged = boto3.client("s3", endpoint_url=endpoint, config=config, aws_access_key_id=SERVICE_KEY_ID,
                          aws_secret_access_key="made-up-secret")
    probes.update({
        "read another run's results as the service": outcome(
            lambda: forged.get_object(Bucket=bucket, Key=other + "victim.txt")["Body"].read()),
        "write another run's results as the service": outcome(
            lambda: forged.put_object(Bucket=bucket, Key=other + "planted.txt", Body=b"planted")),
        "reset the store as the service": moto_reset(endpoint, Credentials(SERVICE_KEY_ID, "made-up-secret"))(),
        "reset the store with its own credentials": moto_reset(endpoint, Credentials(
            os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
            os.environ.get("AWS_SESSION_TOKEN")))(),
    })
    print(f"{MARK} {json.dumps({'env': environment(), 'probes': probes}, sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
