"""The embedded Object Storage checks every request's SigV4 signature (ADR 0037, issue 42.2).

A request with the service's key id and a made-up secret, unsigned, SigV2, replayed outside
the 15-minute window, or a presigned URL past its expiry is refused; requests signed by
botocore with the generated service secret or a session's temporary credentials go on for
every S3 operation SAT and its trainings make (keys with spaces, unicode and `+`, multipart,
copy, batch delete, listing by prefix, presigned GET/PUT), and STS's AssumeRole too.
`/moto-api/` is the service's alone. The canonical requests follow AWS's own examples.
"""

from __future__ import annotations

import datetime
import io
import json
import time
import urllib.parse
import uuid

import boto3
import pytest
import requests
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from ckpt_engine.storage.s3 import PART_BYTES, S3Storage
from sat_tasks.io import object_storage as storage
from sat_tasks.io import sigv4
from sat_tasks.io.local_s3 import (
    LOCAL_ACCESS_KEY,
    LOCAL_REGION,
    LocalS3Server,
    generate_secret,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.s3_gate import PolicyGate, Session
from sat_tasks.io.scoped_credentials import assume_run_role
from sat_tasks.spec import parse_spec

BUCKET = "sat-signed-test"
ODD_KEYS = ("with space/a b.txt", "ünïcödé/ключ-🙂.bin", "plus+sign/a+b=c&d.txt", "tilde~/x!'()*$@;:,?.json",
            "percent%2Fliteral/%41.txt")


def _client(server, service: str = "s3", *, key_id: str | None = None, secret: str | None = None,
            token: str | None = None, **config):
    return boto3.client(service, endpoint_url=server.endpoint_url, region_name=LOCAL_REGION,
                        aws_access_key_id=key_id or server.access_key,
                        aws_secret_access_key=secret or server.secret_key, aws_session_token=token,
                        config=Config(retries={"max_attempts": 1}, **config))


def _code(call) -> tuple[str, int]:
    with pytest.raises(ClientError) as raised:
        call()
    return raised.value.response["Error"]["Code"], raised.value.response["ResponseMetadata"]["HTTPStatusCode"]


def _signed(server, method: str, path: str, *, secret: str | None = None, body: bytes = b"", headers=None,
            service: str = "s3", key_id: str | None = None) -> AWSRequest:
    """A request signed by botocore's own signer (S3's or the generic one), ready to send with `_send`."""
    request = AWSRequest(method=method, url=server.endpoint_url + path, data=body, headers=headers or {})
    credentials = Credentials(key_id or server.access_key, secret or server.secret_key)
    (S3SigV4Auth if service == "s3" else SigV4Auth)(credentials, service, LOCAL_REGION).add_auth(request)
    return request


def _send(request: AWSRequest, body: bytes | None = None) -> requests.Response:
    prepared = request.prepare()
    return requests.request(prepared.method, prepared.url, headers=dict(prepared.headers),
                            data=prepared.body if body is None else body, timeout=30)


def _error_code(response: requests.Response) -> str:
    return response.text.partition("<Code>")[2].partition("</Code>")[0]


@pytest.fixture(scope="module")
def server(s3_server):
    """The session's embedded store (generated secret), with this module's bucket."""
    client = _client(s3_server)
    try:
        client.create_bucket(Bucket=BUCKET)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    return s3_server


@pytest.fixture
def shifted_clock(monkeypatch):
    """Sign as if botocore's clock read now + `delta` (a replay of a request signed then)."""
    def shift(delta: datetime.timedelta) -> None:
        monkeypatch.setattr("botocore.auth.get_current_datetime",
                            lambda: datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + delta)
    return shift


def _job(name: str):
    return parse_spec({
        "name": name, "nodes": 1, "job_failover": False,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": f"s3://{BUCKET}/datasets/{name}/"}, "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python train.py",
    }).with_backend("local")


@pytest.fixture(scope="module")
def scoped(server):
    """A run's temporary credentials (STS AssumeRole signed with the service key) and its results prefix."""
    layout = JobRun(_job("signed-job"), "run-1")
    issued = assume_run_role(_client(server, "sts"), layout, attempt=1)
    _, results = layout.results_uri[len("s3://"):].split("/", 1)
    return issued, results


# ---- the made-up secret, the unsigned and the old ------------------------------------------------------------------
def test_the_service_key_id_with_a_made_up_secret_is_refused_everywhere(server):
    """The co-tenant probe of issue 42: the constant key id and any secret. Refused for S3, STS and moto's API."""
    forged = _client(server, secret="made-up-" + generate_secret())
    assert _code(lambda: forged.list_objects_v2(Bucket=BUCKET)) == ("SignatureDoesNotMatch", 403)
    assert _code(lambda: forged.put_object(Bucket=BUCKET, Key="forged.txt", Body=b"x")) == (
        "SignatureDoesNotMatch", 403)
    assert _code(lambda: forged.create_bucket(Bucket="forged-bucket")) == ("SignatureDoesNotMatch", 403)
    forged_sts = _client(server, "sts", secret="made-up")
    assert _code(lambda: forged_sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/sat-training",
                                                RoleSessionName="forged"))[0] == "SignatureDoesNotMatch"
    for method, path in (("POST", "/moto-api/reset"), ("GET", "/moto-api/data.json")):
        response = _send(_signed(server, method, path, secret="made-up"))
        assert response.status_code == 403 and _error_code(response) == "SignatureDoesNotMatch"
    client = _client(server)
    assert not client.list_objects_v2(Bucket=BUCKET, Prefix="forged").get("Contents")
    assert "forged-bucket" not in {b["Name"] for b in client.list_buckets()["Buckets"]}


def test_the_service_secret_is_generated_per_server_and_kept_out_of_reprs(server):
    other = LocalS3Server()
    assert other.secret_key != server.secret_key and len(server.secret_key) >= 32
    assert server.secret_key not in repr(server) and other.access_key == LOCAL_ACCESS_KEY
    assert json.loads(server.connection_env()["AIRFLOW_CONN_SAT_OBJECT_STORAGE"])["password"] == server.secret_key
    assert _code(lambda: _client(server, secret=other.secret_key).list_buckets())[0] == "SignatureDoesNotMatch"


def test_unsigned_sigv2_and_sigv4a_requests_are_refused_with_an_s3_error(server):
    unsigned = requests.get(f"{server.endpoint_url}/{BUCKET}", timeout=30)
    assert unsigned.status_code == 403 and _error_code(unsigned) == "AccessDenied"
    assert unsigned.headers["Content-Type"] == "application/xml" and "no credentials" in unsigned.text
    v2 = _client(server, signature_version="s3")  # botocore's HmacV1 (SigV2), with the right secret
    assert _code(lambda: v2.list_objects_v2(Bucket=BUCKET)) == ("AccessDenied", 403)
    v2_url = _client(server).generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "x"})
    assert "AWSAccessKeyId=" in v2_url  # botocore presigns S3 with SigV2 unless told s3v4
    answer = requests.get(v2_url, timeout=30)
    assert answer.status_code == 403 and "Signature Version 2" in answer.text
    sigv4a = requests.get(f"{server.endpoint_url}/{BUCKET}", timeout=30, headers={
        "Authorization": f"AWS4-ECDSA-P256-SHA256 Credential={LOCAL_ACCESS_KEY}/20260101/s3/aws4_request, "
                         "SignedHeaders=host, Signature=00"})
    assert sigv4a.status_code == 403 and "unsupported authorization algorithm" in sigv4a.text


def test_host_must_be_signed_and_a_tampered_request_fails(server):
    request = _signed(server, "GET", f"/{BUCKET}?list-type=2")
    header = request.headers["Authorization"]
    without_host = header.replace("SignedHeaders=host;", "SignedHeaders=")
    response = _send(request.__class__(method="GET", url=request.url, headers={**request.headers,
                                                                                "Authorization": without_host}))
    assert response.status_code == 403 and "host header must be signed" in response.text
    assert _send(request).status_code == 200  # the same request, as signed
    tampered = AWSRequest(method="GET", url=request.url.replace("list-type=2", "list-type=2&prefix=results"),
                          headers=dict(request.headers))
    assert _error_code(_send(tampered)) == "SignatureDoesNotMatch"


def test_a_body_that_is_not_the_signed_one_is_refused(server):
    request = _signed(server, "PUT", f"/{BUCKET}/body-check.txt", body=b"what was signed")
    swapped = _send(request, body=b"what was sent!!")  # same length, another body
    assert swapped.status_code == 400 and _error_code(swapped) == "XAmzContentSHA256Mismatch"
    assert _send(request).status_code == 200
    assert _client(server).get_object(Bucket=BUCKET, Key="body-check.txt")["Body"].read() == b"what was signed"


# ---- the clock -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("minutes", [-16, 16, -60 * 24])
def test_a_request_signed_outside_the_skew_window_is_refused(server, shifted_clock, minutes):
    shifted_clock(datetime.timedelta(minutes=minutes))
    client = _client(server)
    assert _code(lambda: client.head_bucket(Bucket=BUCKET))[1] == 403
    assert _code(lambda: client.list_objects_v2(Bucket=BUCKET)) == ("RequestTimeTooSkewed", 403)


def test_a_request_signed_within_the_window_is_served(server, shifted_clock):
    shifted_clock(datetime.timedelta(minutes=-14))
    assert _client(server).list_objects_v2(Bucket=BUCKET)["ResponseMetadata"]["HTTPStatusCode"] == 200
    shifted_clock(datetime.timedelta(minutes=14))
    assert _client(server).list_objects_v2(Bucket=BUCKET)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_a_replayed_signed_request_is_refused_once_its_date_is_outside_the_window(server, shifted_clock):
    """A request captured and sent again: its signature is valid, its date is 16 minutes old."""
    shifted_clock(datetime.timedelta(minutes=-16))
    captured = _signed(server, "GET", f"/{BUCKET}/body-check.txt")
    response = _send(captured)
    assert response.status_code == 403 and _error_code(response) == "RequestTimeTooSkewed"


# ---- presigned URLs --------------------------------------------------------------------------------------------
def test_a_presigned_url_works_then_expires(server, shifted_clock):
    v4 = _client(server, signature_version="s3v4")
    v4.put_object(Bucket=BUCKET, Key="presigned/a b+c.txt", Body=b"shared")
    url = v4.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "presigned/a b+c.txt"},
                                    ExpiresIn=3600)
    assert "X-Amz-Signature=" in url and requests.get(url, timeout=30).content == b"shared"
    other_key = url.replace("a%20b%2Bc.txt", "other.txt")
    assert requests.get(other_key, timeout=30).status_code == 403
    put_url = v4.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": "presigned/put.bin"})
    assert requests.put(put_url, data=b"uploaded", timeout=30).status_code == 200
    assert v4.get_object(Bucket=BUCKET, Key="presigned/put.bin")["Body"].read() == b"uploaded"

    short = v4.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "presigned/a b+c.txt"},
                                      ExpiresIn=1)
    deadline = time.monotonic() + 60
    while requests.get(short, timeout=30).status_code == 200:  # good for its second, then expired
        assert time.monotonic() < deadline, "the presigned URL did not expire"
        time.sleep(0.2)
    expired = requests.get(short, timeout=30)
    assert expired.status_code == 403 and "Request has expired" in expired.text

    shifted_clock(datetime.timedelta(minutes=-20))  # signed 20 minutes ago for 15: expired 5 minutes ago
    old = _client(server, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "presigned/a b+c.txt"}, ExpiresIn=900)
    assert requests.get(old, timeout=30).status_code == 403
    shifted_clock(datetime.timedelta(minutes=-20))  # signed 20 minutes ago for an hour: still good
    valid = _client(server, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "presigned/a b+c.txt"}, ExpiresIn=3600)
    assert requests.get(valid, timeout=30).content == b"shared"
    shifted_clock(datetime.timedelta(minutes=30))  # dated in the future beyond the skew
    future = _client(server, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "presigned/a b+c.txt"}, ExpiresIn=3600)
    assert _error_code(requests.get(future, timeout=30)) == "RequestTimeTooSkewed"


# ---- what SAT does with the service key ---------------------------------------------------------------------------
def test_the_service_key_does_every_operation_sat_uses(server, s3_hook, tmp_path):
    """upload_dir (a file large enough for multipart), read/write_json, listing by prefix, staging back, copy,
    batch delete; keys with spaces, unicode, `+`, `%`."""
    assert s3_hook.conn_config.aws_secret_access_key == server.secret_key  # the connection carries the secret
    prefix = f"service-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "src"
    for key in ODD_KEYS:
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(key.encode())
    (src / "big.bin").write_bytes(bytes(range(256)) * ((10 << 20) // 256))  # 10 MiB: over S3Hook's 8 MiB multipart threshold
    report = storage.upload_dir(s3_hook, src, f"s3://{BUCKET}/{prefix}/", log=lambda _line: None)
    assert report.files == len(ODD_KEYS) + 1
    head = s3_hook.get_conn().head_object(Bucket=BUCKET, Key=f"{prefix}/big.bin")
    assert head["ContentLength"] == 10 << 20 and "-" in head["ETag"]  # a multipart object
    storage.write_json(s3_hook, f"s3://{BUCKET}/{prefix}/ünï code/status+1.json", {"ok": True})
    assert storage.read_json(s3_hook, f"s3://{BUCKET}/{prefix}/ünï code/status+1.json") == {"ok": True}
    listed = s3_hook.list_keys(bucket_name=BUCKET, prefix=f"{prefix}/plus+sign/")
    assert listed == [f"{prefix}/plus+sign/a+b=c&d.txt"]
    staged = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/{prefix}/", tmp_path / "back", log=lambda _line: None)
    assert staged.files == len(ODD_KEYS) + 2
    for key in ODD_KEYS:
        assert (tmp_path / "back" / key).read_bytes() == key.encode()
    client = s3_hook.get_conn()
    client.copy_object(Bucket=BUCKET, Key=f"{prefix}/copied/ключ 🙂", CopySource={
        "Bucket": BUCKET, "Key": f"{prefix}/ünïcödé/ключ-🙂.bin"})
    assert client.get_object(Bucket=BUCKET, Key=f"{prefix}/copied/ключ 🙂")["Body"].read() == ODD_KEYS[1].encode()
    keys = s3_hook.list_keys(bucket_name=BUCKET, prefix=f"{prefix}/")
    deleted = client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})
    assert len(deleted["Deleted"]) == len(keys) and not s3_hook.list_keys(bucket_name=BUCKET, prefix=f"{prefix}/")


# ---- what a training does with its temporary credentials -------------------------------------------------------
def test_scoped_credentials_do_every_operation_a_training_uses(server, scoped):
    """ckpt_engine's S3Storage (the mirror) with the run's session: multipart upload of a large file, list, copy
    (promote), batch delete, odd keys; presigned GET signed with the session's secret and token."""
    issued, results = scoped
    client = _client(server, key_id=issued.access_key_id, secret=issued.secret_access_key,
                     token=issued.session_token)
    mirror = S3Storage(f"s3://{BUCKET}/{results}checkpoints/", client=client)
    big = bytes(range(256)) * ((PART_BYTES + (1 << 20)) // 256)  # more than one part
    mirror.upload_stream("checkpoint-1/weights.bin", io.BytesIO(big))
    head = client.head_object(Bucket=BUCKET, Key=f"{results}checkpoints/checkpoint-1/weights.bin")
    assert head["ContentLength"] == len(big) and "-" in head["ETag"]
    for key in ODD_KEYS:
        mirror.write_atomic(f"checkpoint-1/{key}", key.encode())
    mirror.write_atomic("checkpoint-1/manifest.json", b"{}")
    assert mirror.list_dir("") == ["checkpoint-1"]
    mirror.promote("checkpoint-1", "checkpoint-2")  # copy each object, then a batch delete
    assert mirror.list_dir("") == ["checkpoint-2"]
    out = io.BytesIO()
    mirror.download_stream("checkpoint-2/weights.bin", out)
    assert out.getvalue() == big
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{results}checkpoints/checkpoint-2/plus+sign/")
    assert [o["Key"] for o in listed["Contents"]] == [f"{results}checkpoints/checkpoint-2/plus+sign/a+b=c&d.txt"]
    url = _client(server, key_id=issued.access_key_id, secret=issued.secret_access_key, token=issued.session_token,
                  signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": f"{results}checkpoints/checkpoint-2/manifest.json"})
    assert "X-Amz-Security-Token=" in url and requests.get(url, timeout=30).content == b"{}"
    mirror.delete_tree("checkpoint-2")
    assert mirror.list_dir("") == []


def test_scoped_credentials_with_a_made_up_secret_or_another_sessions_token_are_refused(server, scoped):
    issued, results = scoped
    key = f"{results}planted.txt"
    wrong_secret = _client(server, key_id=issued.access_key_id, secret="made-up", token=issued.session_token)
    assert _code(lambda: wrong_secret.put_object(Bucket=BUCKET, Key=key, Body=b"x")) == (
        "SignatureDoesNotMatch", 403)
    other = assume_run_role(_client(server, "sts"), JobRun(_job("signed-other"), "run-1"), attempt=1)
    mixed = _client(server, key_id=issued.access_key_id, secret=issued.secret_access_key, token=other.session_token)
    assert _code(lambda: mixed.put_object(Bucket=BUCKET, Key=key, Body=b"x")) == ("AccessDenied", 403)
    assert not _client(server).list_objects_v2(Bucket=BUCKET, Prefix=key).get("Contents")


def test_a_session_may_not_reach_moto_api_nor_sts(server, scoped):
    issued, _ = scoped
    credentials = Credentials(issued.access_key_id, issued.secret_access_key, issued.session_token)
    request = AWSRequest(method="GET", url=server.endpoint_url + "/moto-api/data.json")
    S3SigV4Auth(credentials, "s3", LOCAL_REGION).add_auth(request)
    response = _send(request)
    assert response.status_code == 403 and "moto's API is the service's alone" in response.text
    sts = _client(server, "sts", key_id=issued.access_key_id, secret=issued.secret_access_key,
                  token=issued.session_token)
    assert _code(lambda: sts.get_caller_identity())[0] == "AccessDenied"


def test_moto_api_is_served_to_the_service_key_alone():
    """On a store of its own process (a thread's would share moto's state with the session's store): a reset
    signed with the service secret wipes it; nothing else reaches moto's API."""
    with LocalS3Server(process=True) as own:
        _client(own).create_bucket(Bucket="kept-bucket")
        unsigned = requests.post(own.endpoint_url + "/moto-api/reset", timeout=30)
        assert unsigned.status_code == 403
        assert _send(_signed(own, "POST", "/moto-api/reset", secret="made-up")).status_code == 403
        assert [b["Name"] for b in _client(own).list_buckets()["Buckets"]] == ["kept-bucket"]
        assert _send(_signed(own, "GET", "/moto-api/data.json")).status_code == 200
        assert _send(_signed(own, "POST", "/moto-api/reset")).status_code == 200
        assert _client(own).list_buckets()["Buckets"] == []


def test_a_store_in_its_own_process_gets_its_secret_on_a_pipe():
    """`process=True` (make up, benchmarks): the secret is not on the command line, and the gate checks it."""
    with LocalS3Server(process=True) as own:
        assert own.secret_key not in " ".join(own._server.args)
        _client(own).create_bucket(Bucket="piped-bucket")
        assert _code(lambda: _client(own, secret="made-up").list_buckets())[0] == "SignatureDoesNotMatch"


# ---- the canonical request: AWS's published examples, and the gate's own checks ---------------------------------
AWS_EXAMPLE_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _environ(path: str, query: str = "", **headers) -> dict:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
               "HTTP_HOST": "examplebucket.s3.amazonaws.com", "wsgi.input": io.BytesIO()}
    environ.update({"HTTP_" + name.upper(): value for name, value in headers.items()})
    return environ


def test_aws_documented_header_example_verifies():
    """S3's 'GET Object' SigV4 example (Authorization header, Range signed)."""
    environ = _environ("/test.txt", range="bytes=0-9", x_amz_content_sha256=sigv4.EMPTY_SHA256,
                       x_amz_date="20130524T000000Z", authorization=(
                           "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                           "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                           "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"))
    signed = sigv4.parse(environ)
    sigv4.verify(environ, signed, AWS_EXAMPLE_SECRET, now=datetime.datetime(2013, 5, 24, 0, 5))
    with pytest.raises(sigv4.SignatureError, match="does not match"):
        sigv4.verify(environ, signed, AWS_EXAMPLE_SECRET + "x", now=datetime.datetime(2013, 5, 24, 0, 5))
    with pytest.raises(sigv4.SignatureError) as raised:
        sigv4.verify(environ, signed, AWS_EXAMPLE_SECRET, now=datetime.datetime(2013, 5, 24, 0, 16))
    assert raised.value.code == "RequestTimeTooSkewed"


def test_aws_documented_presigned_example_verifies_until_it_expires():
    query = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1"
             "%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
             "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")
    environ = _environ("/test.txt", query)
    signed = sigv4.parse(environ)
    assert signed.presigned and signed.expires == 86400 and signed.key_id == "AKIAIOSFODNN7EXAMPLE"
    sigv4.verify(environ, signed, AWS_EXAMPLE_SECRET, now=datetime.datetime(2013, 5, 24, 23, 59))
    with pytest.raises(sigv4.SignatureError, match="expired"):
        sigv4.verify(environ, signed, AWS_EXAMPLE_SECRET, now=datetime.datetime(2013, 5, 25, 0, 0, 1))


def test_the_gate_needs_every_service_keys_secret_and_shows_none_in_a_session_repr():
    with pytest.raises(ValueError, match="needs its secret"):
        PolicyGate(lambda *_: [], {LOCAL_ACCESS_KEY: ""})
    session = Session("token-value", None, datetime.datetime(2030, 1, 1), "secret-value")
    assert "secret-value" not in repr(session) and "token-value" not in repr(session)


def test_canonical_query_encodes_as_aws_says():
    """Names and values percent-encoded once (`%20`, `%2B`, `%2F`), sorted; `X-Amz-Signature` left out."""
    raw = "prefix=a%2Bb%20c%2Fd&list-type=2&uploads&X-Amz-Signature=ff"
    assert sigv4.canonical_queries(raw, presigned=True)[0] == "list-type=2&prefix=a%2Bb%20c%2Fd&uploads="
    assert urllib.parse.quote("ü", safe="") == sigv4.uri_encode("ü".encode())
