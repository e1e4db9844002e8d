"""Staging and upload through S3Hook against the embedded S3 server."""

from __future__ import annotations

import hashlib

import pytest

from sat_tasks import storage

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
    assert report.checksum_verified == 25
    for key, data in files.items():
        assert (tmp_path / key.removeprefix("ds1/")).read_bytes() == data
    assert any("staging 25 objects" in line for line in lines)
    assert not list(tmp_path.rglob("*.part"))

    again = storage.stage_prefix(s3_hook, f"s3://{BUCKET}/ds1/", tmp_path, log=lambda _: None)
    assert again.transferred == 0 and again.skipped == 25

    # A locally damaged file (same size, other bytes) is detected by its MD5 and fetched again.
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
    storage.write_json(s3_hook, uri, {"a": [1, 2]})
    assert storage.read_json(s3_hook, uri) == {"a": [1, 2]}
