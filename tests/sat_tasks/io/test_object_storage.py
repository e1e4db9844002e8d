"""Staging and upload through S3Hook against the embedded S3 server."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from sat_tasks.core import bounded
from sat_tasks.io import object_storage as storage

BUCKET = "stage-tests"


@pytest.fixture(scope="module")
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    return BUCKET


def put(hook, key: str, data: bytes) -> None:
    hook.load_bytes(data, key=key, bucket_name=BUCKET, replace=True)


def test_stage_copies_verifies_and_is_idempotent(s3_hook, bucket, tmp_path):
    files = {f"ds1/dir{i % 3}/file{i}.txt": f"line {i}\n".encode() * (i + 1) for i in range(25)}
    for key, data in files.items():
        put(s3_hook, key, data)
    lines: list[str] = []
    report = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/ds1/", tmp_path, log=lines.append, workers=4)
    assert report.files == 25 and report.transferred == 25 and report.skipped == 0
    assert report.checksum_verified == 25 and report.checks == {"crc32": 25}  # boto3 uploads with CRC32
    assert any("verified: 25 by CRC32" in line for line in lines)
    for key, data in files.items():
        assert (tmp_path / key.removeprefix("ds1/")).read_bytes() == data
    assert any("staging 25 objects" in line for line in lines)
    assert not list(tmp_path.rglob("*.part"))

    again = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/ds1/", tmp_path, log=lambda _: None)
    assert again.transferred == 0 and again.skipped == 25

    # A locally damaged file (same size, other bytes) is detected by its checksum and fetched again.
    victim = tmp_path / "dir0" / "file0.txt"
    victim.write_bytes(b"X" * victim.stat().st_size)
    third = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/ds1/", tmp_path, log=lambda _: None)
    assert third.transferred == 1 and victim.read_bytes() == files["ds1/dir0/file0.txt"]


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("evil/../../escape.txt", id="dotdot"),
        pytest.param("evil/./x/../../../etc/passwd", id="dot-and-dotdot"),
        pytest.param("evil//abs.txt", id="double-slash-absolute"),
    ],
)
def test_stage_refuses_keys_escaping_the_target(s3_hook, bucket, tmp_path, key):
    prefix = key.split("/")[0] + "/"
    put(s3_hook, key, b"payload")
    with pytest.raises(storage.UnsafeKeyError, match="escape the target directory"):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/{prefix}", tmp_path / "dest", log=lambda _: None)
    assert not (tmp_path / "escape.txt").exists()
    assert not list((tmp_path / "dest").rglob("*")) if (tmp_path / "dest").exists() else True
    s3_hook.delete_objects(BUCKET, [key])


def test_safe_relative_path_rules():
    assert str(storage.safe_relative_path("p/a/b.txt", "p/")) == "a/b.txt"
    for bad in ("p/../x", "p//x", "p/a\\b", "p/"):
        with pytest.raises(storage.UnsafeKeyError):
            storage.safe_relative_path(bad, "p/")


def test_stage_empty_prefix_is_a_clear_error(s3_hook, bucket, tmp_path):
    with pytest.raises(storage.SourceNotFoundError, match="no objects under s3://stage-tests/nothing-here/"):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/nothing-here/", tmp_path, log=lambda _: None)


def test_upload_dir_round_trip_and_multipart(s3_hook, bucket, tmp_path):
    src = tmp_path / "out"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("hello")
    big = (b"0123456789abcdef" * 65536) * 10  # 10 MiB: above the 8 MiB multipart threshold
    (src / "sub" / "big.bin").write_bytes(big)
    (src / "skip").mkdir()
    (src / "skip" / "x").write_text("not uploaded")
    report = storage.upload_dir(s3_hook, src, f"s3://{BUCKET}/up/run1", log=lambda _: None, exclude=("skip",))
    assert report.files == 2
    head = s3_hook.head_object("up/run1/sub/big.bin", bucket_name=BUCKET)
    assert head["ContentLength"] == len(big)
    assert "-" in head["ETag"]  # multipart upload
    back = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/up/run1/", tmp_path / "back", log=lambda _: None)
    assert back.files == 2
    assert hashlib.sha256((tmp_path / "back" / "sub" / "big.bin").read_bytes()).digest() == hashlib.sha256(big).digest()


def test_json_helpers(s3_hook, bucket):
    uri = f"s3://{BUCKET}/json/doc.json"
    assert storage.read_json(s3_hook, uri) is None
    assert storage.read_json(s3_hook, "s3://no-such-bucket-here/doc.json") is None
    storage.write_json(s3_hook, uri, {"a": [1, 2]})
    assert storage.read_json(s3_hook, uri) == {"a": [1, 2]}


def test_read_json_is_bounded_whatever_a_job_wrote(s3_hook, bucket):
    """A run's training process writes some of the JSON SAT reads back (progress.json): one read holds at most
    `max_bytes` (MAX_JSON_BYTES by default) and refuses the rest with the object and the bound named."""
    uri = f"s3://{BUCKET}/json/progress.json"
    document = {"step": 7, "padding": "x" * 4000}
    storage.write_json(s3_hook, uri, document)
    assert storage.read_json(s3_hook, uri, max_bytes=len(json.dumps(document, indent=2))) == document  # at the bound
    with pytest.raises(bounded.ObjectTooLargeError, match=r"progress\.json holds 3\.9 KiB, more than the 1\.0 KiB"):
        storage.read_json(s3_hook, uri, max_bytes=1024)
    assert bounded.MAX_JSON_BYTES == 64 << 20


def test_read_json_stops_at_the_bound_when_the_body_is_longer_than_its_length_says():
    read = []

    class Body:
        def read(self, amount):
            read.append(amount)
            return b" " * amount  # never ends

        def close(self):
            read.append("closed")

    class Client:
        exceptions = SimpleNamespace(NoSuchKey=KeyError)

        def get_object(self, Bucket, Key):
            return {"ContentLength": 10, "Body": Body()}

    hook = SimpleNamespace(get_conn=Client)
    with pytest.raises(bounded.ObjectTooLargeError, match="more than the 3.0 MiB"):
        storage.read_json(hook, "s3://job-results/progress.json", max_bytes=3 << 20)
    assert read[-1] == "closed" and len(read) == 5  # four chunks of 1 MiB (the fourth passes the bound), then closed


# ---- which check an object gets ---------------------------------------------------------------------
MD5_OF_HELLO = hashlib.md5(b"hello", usedforsecurity=False).hexdigest()
SSE_KMS_ETAG = "9b2cf535f27731c974343645a3985328"  # 32 hex digits, but not the content's MD5 (SSE-KMS)


@pytest.mark.parametrize(("meta", "expected"), [
    pytest.param({"ETag": f'"{MD5_OF_HELLO}"', "ChecksumSHA256": "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=",
                  "ChecksumCRC32": "NhCmhg=="}, "sha256", id="sha256-beats-crc32"),
    pytest.param({"ETag": f'"{MD5_OF_HELLO}"', "ChecksumCRC32": "NhCmhg=="}, "crc32", id="crc32"),
    pytest.param({"ETag": f'"{MD5_OF_HELLO}"'}, "md5", id="single-part-md5-etag"),
    pytest.param({"ETag": f'"{SSE_KMS_ETAG}"', "ServerSideEncryption": "aws:kms"}, "size", id="sse-kms-etag"),
    pytest.param({"ETag": f'"{SSE_KMS_ETAG}"', "ServerSideEncryption": "aws:kms:dsse"}, "size", id="dsse-kms-etag"),
    pytest.param({"ETag": f'"{SSE_KMS_ETAG}"', "SSECustomerAlgorithm": "AES256"}, "size", id="sse-c-etag"),
    pytest.param({"ETag": f'"{MD5_OF_HELLO}"', "ServerSideEncryption": "AES256"}, "md5", id="sse-s3-keeps-md5"),
    pytest.param({"ETag": f'"{SSE_KMS_ETAG}"', "ServerSideEncryption": "aws:kms", "ChecksumCRC32": "NhCmhg=="},
                 "crc32", id="sse-kms-with-a-checksum"),
    pytest.param({"ETag": '"a45f1422f2dbe3d2890829dd76adba1b-2"', "ChecksumCRC32": "kG1jvw==-2",
                  "ChecksumType": "COMPOSITE"}, "size", id="composite-checksum"),
    pytest.param({"ETag": '"a45f1422f2dbe3d2890829dd76adba1b-2"', "ChecksumCRC32": "kG1jvw=="}, "size",
                 id="multipart-without-full-object-type"),
    pytest.param({"ETag": '"a45f1422f2dbe3d2890829dd76adba1b-2"', "ChecksumCRC32": "WT3GYg==",
                  "ChecksumType": "FULL_OBJECT"}, "crc32", id="multipart-full-object-crc"),
    pytest.param({"ETag": '"a45f1422f2dbe3d2890829dd76adba1b-2"'}, "size", id="multipart-etag"),
])
def test_object_check_picks_the_strongest_check_the_object_allows(meta, expected):
    assert storage.object_check(meta).method == expected


def test_crt_checksums_are_passed_over_when_they_cannot_be_computed(monkeypatch):
    monkeypatch.setattr(storage, "_crt_checksums", dict)
    meta = {"ETag": f'"{MD5_OF_HELLO}"', "ChecksumCRC32C": "mnG7TA==", "ChecksumCRC32": "NhCmhg=="}
    assert storage.object_check(meta).method == "crc32"
    assert storage.object_check({"ETag": f'"{MD5_OF_HELLO}"', "ChecksumCRC64NVME": "AAAAAAAAAAA="}).method == "md5"


@pytest.mark.parametrize(("method", "expected"), [
    ("sha256", "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="), ("sha1", "qvTGHdzF6KLavt4PO0gs2a6pQ00="),
    ("crc32", "NhCmhg=="), ("md5", MD5_OF_HELLO),
])
def test_file_checksums_are_encoded_as_s3_returns_them(tmp_path, method, expected):
    path = tmp_path / "hello"
    path.write_bytes(b"hello")
    assert storage.file_checksum(path, method) == expected


def _plain_client(hook):
    """A client of the same endpoint that adds no checksum to uploads (as older SDKs and other tools)."""
    import boto3
    from botocore.config import Config

    conn = hook.conn_config
    return boto3.client("s3", endpoint_url=conn.endpoint_url, aws_access_key_id=conn.aws_access_key_id,
                        aws_secret_access_key=conn.aws_secret_access_key, region_name="us-east-1",
                        config=Config(request_checksum_calculation="when_required"))


def test_each_object_gets_the_check_it_allows_and_the_summary_says_which(s3_hook, bucket, tmp_path):
    client = _plain_client(s3_hook)
    client.put_object(Bucket=BUCKET, Key="mixed/sha.txt", Body=b"hello", ChecksumAlgorithm="SHA256")
    client.put_object(Bucket=BUCKET, Key="mixed/md5.txt", Body=b"hello")
    client.put_object(Bucket=BUCKET, Key="mixed/kms.txt", Body=b"hello", ServerSideEncryption="aws:kms")
    # S3 gives an SSE-KMS object an ETag that is not its MD5; the embedded server does not, so say it here.
    real_kms_etag = lambda parsed, **_: parsed.get("ServerSideEncryption") == "aws:kms" and parsed.update(
        ETag=f'"{SSE_KMS_ETAG}"')
    events = s3_hook.get_conn().meta.events
    for operation in ("GetObject", "HeadObject"):
        events.register(f"after-call.s3.{operation}", real_kms_etag)
    try:
        lines: list[str] = []
        report = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/mixed/", tmp_path, log=lines.append)
        # The MD5-looking ETag of the SSE-KMS object raised no false alarm: it got a size check.
        assert report.checks == {"sha256": 1, "md5": 1, "size": 1} and report.transferred == 3
        assert any("verified: 1 by MD5, 1 by SHA256, 1 by size only" in line for line in lines)
        again = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/mixed/", tmp_path, log=lambda _: None)
        assert again.skipped == 3 and again.checks == report.checks
    finally:
        for operation in ("GetObject", "HeadObject"):
            events.unregister(f"after-call.s3.{operation}", real_kms_etag)


def test_a_download_that_does_not_match_its_checksum_is_refused(s3_hook, bucket, tmp_path, monkeypatch):
    put(s3_hook, "bad/a.txt", b"hello world")
    real = storage.verify_file

    def changed_on_the_way(path, check, size):
        path.write_bytes(b"HELLO WORLD")  # same size, other bytes
        return real(path, check, size)

    monkeypatch.setattr(storage, "verify_file", changed_on_the_way)
    with pytest.raises(storage.TransferVerificationError, match=r"bad/a.txt: CRC32 does not match"):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/bad/", tmp_path, log=lambda _: None)
    assert not list(tmp_path.rglob("*.txt")) and not list(tmp_path.rglob("*.part"))


def test_multipart_objects_are_checked_by_a_full_object_checksum_or_their_size(s3_hook, bucket, tmp_path):
    big = (b"0123456789abcdef" * 65536) * 10  # 10 MiB: multipart
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(big)
    storage.upload_dir(s3_hook, tmp_path / "src", f"s3://{BUCKET}/mp/", log=lambda _: None)
    report = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/mp/", tmp_path / "dst", log=lambda _: None)
    head = s3_hook.get_conn().head_object(Bucket=BUCKET, Key="mp/big.bin", ChecksumMode="ENABLED")
    assert report.checks == {storage.object_check(head).method: 1}
    assert (tmp_path / "dst" / "big.bin").read_bytes() == big


def test_a_runs_metrics_over_the_bound_are_named_and_the_rest_read(s3_hook, bucket, monkeypatch):
    """The series files are the training process's: one over the bound is a problem of the run's metrics, not a
    read of all of it into memory, and the other series and the status history still come."""
    from sat_tasks.io.metrics import read_object_storage

    base = f"s3://{BUCKET}/bounded-run/"
    sample = {"series": "training", "time": 1.0, "attempt": 1, "node": "n", "step": 1, "loss": 2.0}
    put(s3_hook, "bounded-run/metrics/attempt-1/n/training.jsonl", (json.dumps(sample) + "\n").encode())
    put(s3_hook, "bounded-run/metrics/attempt-1/n/system.jsonl", b"x" * 5000)
    storage.write_json(s3_hook, base + "status.json", [{"status": "Running", "at": "2026-12-03T00:00:00+00:00"}])
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 4096)
    metrics = read_object_storage(base, s3_hook)
    assert any(p.startswith("metrics/attempt-1/n/system.jsonl: ") and "more than the 4.0 KiB" in p
               for p in metrics.problems), metrics.problems
    assert metrics.history and [r["step"] for r in metrics.records.get("training", [])] == [1]
