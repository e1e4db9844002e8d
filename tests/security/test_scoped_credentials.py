"""Issue 29.2: a training attempt's Object Storage credentials reach its own run only (ADR 0020).

The policy function on its own; then the embedded Object Storage (moto behind `io.s3_gate`)
with the temporary credentials SAT's `AssumeRole` gets for a run: its data and results work,
every other run's and job's objects are AccessDenied, the service keys still do everything;
then one attempt through the local backend, whose training writes its mirror and is refused
another run's prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from sat_tasks.backends.local.launch import launch_attempt
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.object_policy import (
    PolicyInputError,
    grant_of,
    is_allowed,
    object_arn,
    run_session_policy,
)
from sat_tasks.io import scoped_credentials
from sat_tasks.io.local_s3 import (
    LOCAL_ACCESS_KEY,
    LOCAL_REGION,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.scoped_credentials import (
    ScopedCredentialsError,
    assume_run_role,
    run_policy,
)
from sat_tasks.spec import parse_spec

BUCKET = "sat-scope-test"


def _job(name: str, data: str = f"s3://{BUCKET}/datasets/{{name}}/", command: str = "python probe.py"):
    return parse_spec({
        "name": name, "nodes": 1, "job_failover": False,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": data.format(name=name)}, "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": command,
    }).with_backend("local")


# ---- the policy ---------------------------------------------------------------------------------
def test_the_policy_names_exactly_the_runs_prefixes():
    policy = run_session_policy(read_only={"data.source": "s3://data/corpus/", "storage.script_url": "s3://code/train.py"},
                                read_write={"results": "s3://res/out/job-1/run-a/"})
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["ReadObjects"]["Action"] == ["s3:GetObject"]
    assert by_sid["ReadObjects"]["Resource"] == ["arn:aws:s3:::code/train.py", "arn:aws:s3:::code/train.py/*",
                                                 "arn:aws:s3:::data/corpus/*"]
    assert by_sid["ReadWriteObjects"]["Resource"] == ["arn:aws:s3:::res/out/job-1/run-a/*"]
    assert "s3:PutObject" in by_sid["ReadWriteObjects"]["Action"]
    lists = [s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"]]
    assert {(s["Resource"][0], tuple(s["Condition"]["StringLike"]["s3:prefix"])) for s in lists} == {
        ("arn:aws:s3:::code", ("train.py/*",)), ("arn:aws:s3:::data", ("corpus/*",)),
        ("arn:aws:s3:::res", ("out/job-1/run-a/*",))}
    for statement in policy["Statement"]:  # no wildcard but the one closing each granted folder
        for resource in statement["Resource"]:
            assert "?" not in resource and resource.count("*") <= 1 and (resource.endswith("/*") or "*" not in resource)


@pytest.mark.parametrize(("action", "resource", "prefix", "allowed"), [
    pytest.param("s3:PutObject", object_arn("res", "out/job-1/run-a/checkpoints/x"), None, True, id="own-write"),
    pytest.param("s3:GetObject", object_arn("data", "corpus/part-0.jsonl"), None, True, id="data-read"),
    pytest.param("s3:PutObject", object_arn("data", "corpus/part-0.jsonl"), None, False, id="data-write"),
    pytest.param("s3:PutObject", object_arn("res", "out/job-10/run-a/x"), None, False, id="sibling-job-10"),
    pytest.param("s3:GetObject", object_arn("res", "out/job-1/run-ab/x"), None, False, id="sibling-run-ab"),
    pytest.param("s3:GetObject", object_arn("data", "corpus2/x"), None, False, id="sibling-data"),
    pytest.param("s3:GetObject", object_arn("code", "train.py.bak"), None, False, id="sibling-script"),
    pytest.param("s3:GetObject", object_arn("code", "train.py"), None, True, id="script"),
    pytest.param("s3:ListBucket", object_arn("res"), "out/job-1/run-a/checkpoints/", True, id="list-own"),
    pytest.param("s3:ListBucket", object_arn("res"), "out/job-1/run-a", False, id="list-without-slash"),
    pytest.param("s3:ListBucket", object_arn("res"), "out/job-10/", False, id="list-sibling"),
    pytest.param("s3:ListBucket", object_arn("res"), None, False, id="list-bucket"),
    pytest.param("s3:DeleteBucket", object_arn("res"), None, False, id="other-action"),
])
def test_the_policy_allows_the_runs_prefixes_and_nothing_beside_them(action, resource, prefix, allowed):
    policy = run_session_policy(read_only={"data.source": "s3://data/corpus/", "storage.script_url": "s3://code/train.py"},
                                read_write={"results": "s3://res/out/job-1/run-a/"})
    assert is_allowed(policy, action, resource, {"s3:prefix": prefix} if prefix is not None else {}) is allowed


@pytest.mark.parametrize("uri", [
    pytest.param("s3://bucket", id="bucket"), pytest.param("s3://bucket/", id="bucket-slash"),
    pytest.param("s3://bucket/a*/", id="star"), pytest.param("s3://bucket/a/../b/", id="dotdot"),
    pytest.param("https://bucket/a/", id="not-s3"),
])
def test_a_prefix_that_would_widen_the_policy_is_refused(uri):
    with pytest.raises(PolicyInputError, match="data.source"):
        grant_of(uri, "data.source")


def test_an_unknown_policy_element_or_condition_allows_nothing():
    statement = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    assert is_allowed({"Statement": [statement]}, "s3:GetObject", object_arn("b", "k"))
    assert not is_allowed({"Statement": [{**statement, "NotResource": "x"}]}, "s3:GetObject", object_arn("b", "k"))
    assert not is_allowed({"Statement": [{**statement, "Condition": {"IpAddress": {"aws:SourceIp": "1.2.3.4"}}}]},
                          "s3:GetObject", object_arn("b", "k"))
    assert not is_allowed(None, "s3:GetObject", object_arn("b", "k"))


# ---- the embedded Object Storage enforces it ---------------------------------------------------
@pytest.fixture(scope="module")
def store(s3_server, s3_hook):
    """Two jobs' data and one foreign run's results, written with the service keys."""
    client = _client(s3_server)
    if not s3_hook.check_for_bucket(BUCKET):
        client.create_bucket(Bucket=BUCKET)
    for key in ("datasets/job-a/part-0.txt", "datasets/job-b/part-0.txt", "results/job-b/other-run/status.json",
                "results/job-b/other-run/stop.json", "results/job-a/run-10/checkpoints/progress.json"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
    return s3_server


def _client(server, **credentials):
    credentials = credentials or {"aws_access_key_id": server.access_key, "aws_secret_access_key": server.secret_key}
    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name=LOCAL_REGION, **credentials)


@pytest.fixture(scope="module")
def scoped(store):
    """The S3 client of run `run-1` of job `job-a`, with the credentials SAT's AssumeRole gets for it."""
    sts = boto3.client("sts", endpoint_url=store.endpoint_url, region_name=LOCAL_REGION,
                       aws_access_key_id=store.access_key, aws_secret_access_key=store.secret_key)
    layout = JobRun(_job("job-a"), "run-1")
    issued = assume_run_role(sts, layout, attempt=1)
    assert issued.access_key_id != LOCAL_ACCESS_KEY and issued.session_token
    assert issued.secret_access_key not in repr(issued) and issued.session_token not in repr(issued)
    client = _client(store, aws_access_key_id=issued.access_key_id, aws_secret_access_key=issued.secret_access_key,
                     aws_session_token=issued.session_token)
    _, results_prefix = layout.results_uri[len("s3://"):].split("/", 1)
    return client, results_prefix


def test_the_runs_own_data_and_results_are_reachable(scoped):
    client, results = scoped
    assert client.get_object(Bucket=BUCKET, Key="datasets/job-a/part-0.txt")["Body"].read() == b"{}"
    client.put_object(Bucket=BUCKET, Key=results + "checkpoints/checkpoint-1/weights.bin", Body=b"w")
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=results + "checkpoints/")
    assert [o["Key"] for o in listed["Contents"]] == [results + "checkpoints/checkpoint-1/weights.bin"]
    client.copy_object(Bucket=BUCKET, Key=results + "checkpoints/copy.bin",
                       CopySource={"Bucket": BUCKET, "Key": results + "checkpoints/checkpoint-1/weights.bin"})
    client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": results + "checkpoints/copy.bin"}]})
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=results + "checkpoints/big.bin")
    client.abort_multipart_upload(Bucket=BUCKET, Key=results + "checkpoints/big.bin", UploadId=upload["UploadId"])


@pytest.mark.parametrize("call", [
    pytest.param(lambda c, r: c.put_object(Bucket=BUCKET, Key="results/job-b/other-run/stop.json", Body=b"{}"),
                 id="write-another-runs-stop"),
    pytest.param(lambda c, r: c.get_object(Bucket=BUCKET, Key="results/job-b/other-run/status.json"),
                 id="read-another-runs-status"),
    pytest.param(lambda c, r: c.put_object(Bucket=BUCKET, Key="results/job-a/run-10/checkpoints/progress.json",
                                           Body=b"{}"), id="write-sibling-run-10"),
    pytest.param(lambda c, r: c.get_object(Bucket=BUCKET, Key="datasets/job-b/part-0.txt"), id="read-another-jobs-data"),
    pytest.param(lambda c, r: c.put_object(Bucket=BUCKET, Key="datasets/job-a/part-0.txt", Body=b"x"),
                 id="write-own-data"),
    pytest.param(lambda c, r: c.list_objects_v2(Bucket=BUCKET), id="list-the-bucket"),
    pytest.param(lambda c, r: c.list_objects_v2(Bucket=BUCKET, Prefix="results/job-b/"), id="list-another-job"),
    pytest.param(lambda c, r: c.list_buckets(), id="list-buckets"),
    pytest.param(lambda c, r: c.delete_objects(Bucket=BUCKET, Delete={"Objects": [
        {"Key": r + "checkpoints/x"}, {"Key": "results/job-b/other-run/status.json"}]}), id="batch-delete-one-foreign"),
    pytest.param(lambda c, r: c.copy_object(Bucket=BUCKET, Key=r + "stolen.json", CopySource={
        "Bucket": BUCKET, "Key": "results/job-b/other-run/status.json"}), id="copy-from-another-run"),
    pytest.param(lambda c, r: c.put_object(Bucket=BUCKET, Key=r + "../../job-b/other-run/stop.json", Body=b"{}"),
                 id="dot-dot-key"),
    pytest.param(lambda c, r: c.put_object_acl(Bucket=BUCKET, Key=r + "x", ACL="public-read"), id="acl"),
])
def test_everything_else_is_access_denied(scoped, store, call):
    client, results = scoped
    with pytest.raises(ClientError) as raised:
        call(client, results)
    assert raised.value.response["Error"]["Code"] == "AccessDenied"
    assert _client(store).get_object(Bucket=BUCKET, Key="results/job-b/other-run/status.json")["Body"].read() == b"{}"


def test_the_temporary_key_without_its_token_or_an_unknown_key_is_refused(store, scoped):
    client, _ = scoped
    key_id = client._request_signer._credentials.access_key
    for credentials, code in (({"aws_access_key_id": key_id, "aws_secret_access_key": "x"}, "AccessDenied"),
                              ({"aws_access_key_id": "made-up", "aws_secret_access_key": "x"}, "InvalidAccessKeyId")):
        with pytest.raises(ClientError) as raised:
            _client(store, **credentials).get_object(Bucket=BUCKET, Key="datasets/job-a/part-0.txt")
        assert raised.value.response["Error"]["Code"] == code
    sts = boto3.client("sts", endpoint_url=store.endpoint_url, region_name=LOCAL_REGION,
                       aws_access_key_id=key_id, aws_secret_access_key=client._request_signer._credentials.secret_key,
                       aws_session_token=client._request_signer._credentials.token)
    with pytest.raises(ClientError):  # a session cannot mint itself a wider one
        sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/sat-training", RoleSessionName="wider")


def test_a_dag_scoped_percent_encoded_prefix_is_granted_exactly(store):
    """Issue 29.4's prefix (`<destination>/<dag>/<job>/<run_key>/`, `%3A` in the key) through the gate."""
    from sat_tasks.io.run_layout import scoped

    sts = boto3.client("sts", endpoint_url=store.endpoint_url, region_name=LOCAL_REGION,
                       aws_access_key_id=store.access_key, aws_secret_access_key=store.secret_key)
    layout = JobRun(scoped(_job("job-a"), "team_dag"), "manual__2026-01-01T00:00:00+00:00")
    issued = assume_run_role(sts, layout, attempt=1)
    client = _client(store, aws_access_key_id=issued.access_key_id, aws_secret_access_key=issued.secret_access_key,
                     aws_session_token=issued.session_token)
    _, prefix = layout.results_uri[len("s3://"):].split("/", 1)
    assert "%3A" in prefix and "/team_dag/" in layout.results_uri
    client.put_object(Bucket=BUCKET, Key=prefix + "checkpoints/x", Body=b"x")
    twin = prefix.replace("%3A", "_", 1)  # the legacy lossy key of a distinct run id
    with pytest.raises(ClientError) as raised:
        client.put_object(Bucket=BUCKET, Key=twin + "checkpoints/x", Body=b"x")
    assert raised.value.response["Error"]["Code"] == "AccessDenied"


def test_the_service_keys_still_do_everything(store):
    client = _client(store)
    assert client.list_objects_v2(Bucket=BUCKET)["KeyCount"] >= 5
    client.put_object(Bucket=BUCKET, Key="results/job-b/other-run/status.json", Body=b"{}")
    assert any(b["Name"] == BUCKET for b in client.list_buckets()["Buckets"])


def test_a_store_without_sts_is_a_clear_error_naming_the_setting():
    class NoSts:
        def assume_role(self, **_):
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "NotImplemented"}}, "AssumeRole")

    with pytest.raises(ScopedCredentialsError, match=r"\[sat\] scoped_credentials = off"):
        assume_run_role(NoSts(), JobRun(_job("job-a"), "run-1"), attempt=1)


def test_turned_off_the_attempt_gets_the_service_keys_and_a_warning(monkeypatch, s3_hook):
    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "off")
    lines: list[str] = []
    env = scoped_credentials.training_credentials(JobRun(_job("job-a"), "run-1"), s3_hook, 1, lines.append)
    assert env["AWS_ACCESS_KEY_ID"] == LOCAL_ACCESS_KEY and "AWS_SESSION_TOKEN" not in env
    assert any("WARNING" in line and "scoped_credentials = off" in line for line in lines)
    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "maybe")
    with pytest.raises(ScopedCredentialsError, match="must be 'on' or 'off'"):
        scoped_credentials.training_credentials(JobRun(_job("job-a"), "run-1"), s3_hook, 1, lines.append)


def test_the_runs_policy_takes_its_prefix_from_the_run_layout():
    layout = JobRun(_job("job-a"), "manual__2026-01-01T00:00:00+00:00")
    policy = run_policy(layout)
    bucket, prefix = layout.results_uri[len("s3://"):].split("/", 1)
    assert is_allowed(policy, "s3:PutObject", object_arn(bucket, prefix + "checkpoints/x"))
    assert not is_allowed(policy, "s3:PutObject", object_arn(bucket, prefix.rstrip("/") + "x/checkpoints/x"))


# ---- end to end: one attempt through the local backend -----------------------------------------
PROBE = """
import os
from ckpt_engine.storage import open_storage

mirror = open_storage(os.environ["CKPT_MIRROR_URL"])
mirror.write_atomic("checkpoint-1/manifest.json", b"{{}}")
mirror.promote("checkpoint-1", "checkpoint-2")
print("OWN-MIRROR", mirror.list_dir(""), flush=True)
print("SERVICE-KEY-IN-ENV", os.environ["AWS_ACCESS_KEY_ID"] == {service_key!r}, flush=True)
for url in ({foreign!r}, {data!r}):
    try:
        open_storage(url).write_atomic("planted.bin", b"x")
        print("FOREIGN-WRITE-ALLOWED", url, flush=True)
    except Exception as exc:
        print("FOREIGN-WRITE-REFUSED", url, "AccessDenied" in repr(exc) or "AccessDenied" in str(exc.__cause__),
              flush=True)
"""


def test_a_local_attempt_mirrors_its_own_checkpoints_and_cannot_write_another_runs_prefix(store, s3_hook):
    run = JobRun(_job("job-e2e"), "run-1")
    foreign = f"s3://{BUCKET}/results/job-b/other-run/"
    run.code_dir.mkdir(parents=True, exist_ok=True)
    (run.code_dir / "probe.py").write_text(PROBE.format(service_key=LOCAL_ACCESS_KEY, foreign=foreign,
                                                         data=run.job.data.source))
    lines: list[str] = []
    record = launch_attempt(run, Plan(attempt=1), lines.append)
    output = Path(run.job_log).read_text()
    assert record.exit_code == 0, output
    assert "OWN-MIRROR ['checkpoint-2']" in output
    assert "SERVICE-KEY-IN-ENV False" in output
    assert f"FOREIGN-WRITE-REFUSED {foreign} True" in output
    assert f"FOREIGN-WRITE-REFUSED {run.job.data.source} True" in output
    assert "FOREIGN-WRITE-ALLOWED" not in output
    mirrored = s3_hook.list_keys(bucket_name=BUCKET, prefix=run.mirror_uri.split("/", 3)[3])
    assert any(key.endswith("checkpoint-2/manifest.json") for key in mirrored)
    assert not s3_hook.check_for_key("results/job-b/other-run/planted.bin", bucket_name=BUCKET)
    assert any("scoped to" in line for line in lines)  # the job log says what the attempt may touch
    assert store.secret_key not in output and not any(store.secret_key in line for line in lines)
    assert json.loads(s3_hook.read_key(run.status_uri.split("/", 3)[3], bucket_name=BUCKET))  # SAT's own records


# ---- Kubernetes: each attempt's pods read their own Secret, SAT's helper pods the shared one ------------
def test_training_pods_reference_their_attempts_secret_and_helper_pods_the_shared_one():
    from sat_tasks.backends.kubernetes import names, pods, staging
    from sat_tasks.backends.kubernetes.settings import KubernetesSettings

    job = _job("job-k8s").with_backend("kubernetes")
    settings = KubernetesSettings()
    for attempt in (1, 2):
        rendered = pods.render_attempt_manifests(job, run_id="run-1", plan=Plan(attempt=attempt), settings=settings)
        refs = {env["name"]: env["valueFrom"]["secretKeyRef"] for pod in rendered if pod["kind"] == "Pod"
                for env in pod["spec"]["containers"][0]["env"] if "secretKeyRef" in env.get("valueFrom", {})}
        own = names.attempt_credentials_name(job, "run-1", attempt)
        assert refs == {"AWS_ACCESS_KEY_ID": {"name": own, "key": "access_key_id"},
                        "AWS_SECRET_ACCESS_KEY": {"name": own, "key": "secret_access_key"},
                        "AWS_SESSION_TOKEN": {"name": own, "key": "session_token"}}
    secret = pods.attempt_credentials_secret(job, run_id="run-1", attempt=2, namespace="sat-jobs", credentials={
        "AWS_ACCESS_KEY_ID": "ASIA1", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"})
    assert secret["metadata"]["labels"][names.LABEL_ATTEMPT_ID] == names.attempt_name(job, "run-1", 2)  # cleanup
    assert secret["stringData"] == {"access_key_id": "ASIA1", "secret_access_key": "s", "session_token": "t"}
    helper = staging.build_staging_pod(job, "run-1", namespace="sat-jobs", settings=settings)
    helper_refs = {env["valueFrom"]["secretKeyRef"]["name"] for env in helper["spec"]["containers"][0]["env"]
                   if "secretKeyRef" in env.get("valueFrom", {})}
    assert helper_refs == {settings.object_storage_secret}  # staging is SAT's own task: the service keys
