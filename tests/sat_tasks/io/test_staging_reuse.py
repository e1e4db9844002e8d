"""`python -m sat_tasks.io.staging stage --reuse-dir --reuse-objects`: a warm run's unchanged objects are copied
from its staged data, not downloaded (GETs counted against the session's S3 server); a changed one is."""

from __future__ import annotations

import json
import shutil

import botocore.client
import pytest

from sat_tasks.io import staging as stage_cli

BUCKET = "sat-staging-reuse-tests"
PREFIX = "datasets/corpus/"
FILES = {"a.txt": b"hello\n", "sub/b.txt": b"world\n" * 100, "c.jsonl": b'{"text": "x"}\n'}


@pytest.fixture
def bucket(s3_server, s3_hook, monkeypatch):
    """The corpus under its prefix; the process env as the staging pod has it (no Airflow connection)."""
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    for name, data in FILES.items():
        s3_hook.load_bytes(data, key=PREFIX + name, bucket_name=BUCKET, replace=True)
    conn = s3_server.connection()
    monkeypatch.delenv("AIRFLOW_CONN_SAT_OBJECT_STORAGE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", conn["login"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", conn["password"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_hook


@pytest.fixture
def gets(monkeypatch) -> list[str]:
    """The key of every GetObject the S3 server answers (a download), in order."""
    calls: list[str] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(self, operation_name, api_params):
        if operation_name == "GetObject":
            calls.append(api_params["Key"])
        return original(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


def _etags(hook) -> dict[str, str]:
    return {m["Key"]: m["ETag"].strip('"') for m in hook.iter_file_metadata(prefix=PREFIX, bucket_name=BUCKET)}


def _stage(tmp_path, dest: str, *extra: str) -> list[str]:
    return ["stage", "--source", f"s3://{BUCKET}/{PREFIX}", "--dest", str(tmp_path / dest),
            "--code-dest", str(tmp_path / f"{dest}-code"), *extra]


def _report(out: str) -> dict:
    (line,) = [x for x in out.splitlines() if x.startswith(stage_cli.REPORT_PREFIX)]
    return json.loads(line[len(stage_cli.REPORT_PREFIX):])


def _warm_copy(tmp_path, capsys):
    """The warm run's staged data (as its claim holds it), read-only as the pod mounts it, and its {key: ETag}."""
    assert stage_cli.main(_stage(tmp_path, "warm")) == 0
    capsys.readouterr()
    warm = tmp_path / "warm"
    for path in warm.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    return warm


@pytest.mark.parametrize("other_volume", [pytest.param(False, id="same-filesystem-link"),
                                          pytest.param(True, id="other-volume-copy")])
def test_unchanged_objects_are_copied_from_the_warm_run_and_not_downloaded(other_volume, bucket, gets, tmp_path,
                                                                          capsys, monkeypatch):
    warm = _warm_copy(tmp_path, capsys)
    if other_volume:  # the pod's warm claim is another mount: a hard link fails with EXDEV, the file is copied
        import errno
        import os

        def no_link(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

        monkeypatch.setattr("sat_tasks.io.warm_pool.os.link", no_link)
    objects = _etags(bucket)
    gets.clear()
    argv = _stage(tmp_path, "new", "--reuse-dir", str(warm), "--reuse-objects", json.dumps(objects))
    assert stage_cli.main(argv) == 0
    out = capsys.readouterr().out
    report = _report(out)
    assert gets == []  # not one object downloaded
    assert report["data"]["reused"] == 3 and report["data"]["redownloaded"] == 0
    assert report["data"]["transferred"] == 0 and report["data"]["skipped"] == 3
    for name, data in FILES.items():
        assert (tmp_path / "new" / name).read_bytes() == data
        linked = (tmp_path / "new" / name).stat().st_ino == (warm / name).stat().st_ino
        assert linked is not other_volume
    assert f"warm pool: 3 of 3 objects unchanged since the warm run: linked or copied from {warm}" in out


def test_a_changed_object_is_downloaded_and_the_rest_copied(bucket, gets, tmp_path, capsys):
    warm = _warm_copy(tmp_path, capsys)
    objects = _etags(bucket)
    bucket.load_bytes(b"changed since the warm run\n", key=PREFIX + "sub/b.txt", bucket_name=BUCKET, replace=True)
    gets.clear()
    argv = _stage(tmp_path, "new", "--reuse-dir", str(warm), "--reuse-objects", json.dumps(objects))
    assert stage_cli.main(argv) == 0
    report = _report(capsys.readouterr().out)
    assert gets == [PREFIX + "sub/b.txt"]
    assert (report["data"]["reused"], report["data"]["redownloaded"]) == (2, 1)
    assert (tmp_path / "new" / "sub" / "b.txt").read_bytes() == b"changed since the warm run\n"


def test_a_corrupt_warm_copy_is_caught_by_the_checksum_and_downloaded(bucket, gets, tmp_path, capsys):
    warm = _warm_copy(tmp_path, capsys)
    objects = _etags(bucket)
    (warm / "a.txt").chmod(0o644)
    (warm / "a.txt").write_bytes(b"HELLO\n")  # same size, other bytes: the ETag check sees it
    gets.clear()
    argv = _stage(tmp_path, "new", "--reuse-dir", str(warm), "--reuse-objects", json.dumps(objects))
    assert stage_cli.main(argv) == 0
    report = _report(capsys.readouterr().out)
    assert gets == [PREFIX + "a.txt"]
    assert (report["data"]["reused"], report["data"]["redownloaded"]) == (2, 1)
    assert (tmp_path / "new" / "a.txt").read_bytes() == FILES["a.txt"]


def test_without_a_reuse_dir_everything_is_downloaded(bucket, gets, tmp_path, capsys):
    assert stage_cli.main(_stage(tmp_path, "cold")) == 0
    report = _report(capsys.readouterr().out)
    assert sorted(gets) == sorted(PREFIX + name for name in FILES)
    assert "reused" not in report["data"]


@pytest.mark.parametrize("value", [pytest.param("{not json", id="not-json"),
                                   pytest.param('["a"]', id="not-an-object"),
                                   pytest.param('{"k": 1}', id="etag-not-a-string")])
def test_bad_reuse_objects_are_a_usage_error(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        stage_cli.main(_stage(tmp_path, "x", "--reuse-dir", str(tmp_path), "--reuse-objects", value))
    assert exit_info.value.code == 2
    assert "--reuse-objects" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _writable(tmp_path):
    """Let pytest remove the read-only warm copy."""
    yield
    for path in tmp_path.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(tmp_path, ignore_errors=True)
