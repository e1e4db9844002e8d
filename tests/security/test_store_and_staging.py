"""The embedded store keeps every key and its folders private; staging keeps keys apart and leaves no temp files."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from sat_tasks.io import object_storage as storage
from sat_tasks.io.local_s3 import PersistentS3Server
from sat_tasks.service import secrets as service_secrets

BUCKET = "security-staging"


# ---- the embedded store's persistence rounds -----------------------------------------------------
class RecordedStore:
    """The few S3 calls a persistence round makes, on a dict of buckets (no server)."""

    def __init__(self, buckets: dict[str, dict[str, bytes]] | None = None) -> None:
        self.buckets = buckets if buckets is not None else {}

    def list_buckets(self) -> dict:
        return {"Buckets": [{"Name": name} for name in self.buckets]}

    def get_paginator(self, _operation: str) -> RecordedStore:
        return self

    def paginate(self, Bucket: str) -> list[dict]:
        return [{"Contents": [{"Key": key, "ETag": hashlib.md5(body).hexdigest()}
                              for key, body in sorted(self.buckets[Bucket].items())]}]

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        Path(filename).write_bytes(self.buckets[bucket][key])

    def create_bucket(self, Bucket: str) -> None:
        self.buckets.setdefault(Bucket, {})

    def put_object(self, Bucket: str, Key: str, Body) -> dict:
        self.buckets[Bucket][Key] = Body.read()
        return {"ETag": hashlib.md5(self.buckets[Bucket][Key]).hexdigest()}


def kept_and_restored(tmp_path: Path, objects: dict[str, bytes]) -> dict[str, bytes]:
    """Run one persistence round on `objects`, then restore the state directory into an empty store."""
    state = tmp_path / "object-storage"
    first = PersistentS3Server(state_dir=state, port=1)
    first.client = lambda: RecordedStore({"results": dict(objects)})
    first.sync()
    second, fresh = PersistentS3Server(state_dir=state, port=1), RecordedStore()
    second.client = lambda: fresh
    second.restore()
    return fresh.buckets.get("results", {})


@pytest.mark.parametrize("key", [
    pytest.param("..", id="dotdot"),
    pytest.param(".", id="dot"),
    pytest.param("report.part", id="part-suffix"),
    pytest.param("x.part", id="temp-name-of-x"),
])
def test_every_key_survives_a_round_and_a_restart(tmp_path: Path, key: str) -> None:
    objects = {key: b"odd key", "x": b"x", "z-later/result.json": b'{"ok": true}'}
    assert kept_and_restored(tmp_path, objects) == objects


def test_one_object_that_cannot_be_kept_does_not_stop_the_round(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    store = RecordedStore({"results": {"a-first": b"1", "z-later": b"2"}})
    real = store.download_file

    def failing(bucket: str, key: str, filename: str) -> None:
        if key == "a-first":
            raise OSError("disk says no")
        real(bucket, key, filename)

    store.download_file = failing
    server = PersistentS3Server(state_dir=tmp_path / "state", port=1)
    server.client = lambda: store
    assert server.sync() == 1
    assert (tmp_path / "state" / "results" / "z-later").read_bytes() == b"2"
    assert "could not keep s3://results/a-first" in capsys.readouterr().out
    assert not list((tmp_path / "state").rglob("*.part"))


def test_state_written_before_dots_were_encoded_is_restored_once(tmp_path: Path) -> None:
    legacy = tmp_path / "object-storage" / "results"
    legacy.mkdir(parents=True)
    (legacy / "report.json").write_bytes(b"{}")
    server, fresh = PersistentS3Server(state_dir=tmp_path / "object-storage", port=1), RecordedStore()
    server.client = lambda: fresh
    assert server.restore() == 1 and fresh.buckets == {"results": {"report.json": b"{}"}}
    assert [p.name for p in legacy.iterdir()] == ["report%2Ejson"]


def test_the_service_folders_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    service_secrets.load_or_create(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for path in home.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    server = PersistentS3Server(state_dir=tmp_path / "object-storage", port=1)
    server.client = lambda: RecordedStore({"results": {"k": b"v"}})
    server.sync()
    assert stat.S_IMODE((tmp_path / "object-storage").stat().st_mode) == 0o700


# ---- staging ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    return BUCKET


def put(hook, key: str, data: bytes) -> None:
    hook.load_bytes(data, key=key, bucket_name=BUCKET, replace=True)


def test_a_failed_download_of_x_does_not_touch_the_staged_x_part(s3_hook, bucket, tmp_path, monkeypatch):
    put(s3_hook, "pair/x", b"first x")
    put(s3_hook, "pair/x.part", b"the key x.part")
    storage.stage_prefix(s3_hook, f"s3://{BUCKET}/pair/", tmp_path, log=lambda _: None, workers=1)
    assert (tmp_path / "x.part").read_bytes() == b"the key x.part"
    put(s3_hook, "pair/x", b"x changed, longer")
    monkeypatch.setattr(storage, "verify_file", lambda path, check, size: "damaged on the way")
    with pytest.raises(storage.TransferVerificationError):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/pair/", tmp_path, log=lambda _: None, workers=1)
    assert (tmp_path / "x.part").read_bytes() == b"the key x.part"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "x.part"]


@pytest.mark.parametrize("keys, message", [
    pytest.param(["dup/a//b", "dup/a/b"], r"'dup/a//b' and 'dup/a/b' both stage to 'a/b'", id="double-slash"),
    pytest.param(["nest/a", "nest/a/b"], r"'nest/a/b' needs 'a' as a folder, which key 'nest/a'", id="file-and-folder"),
])
def test_keys_that_land_on_one_path_are_refused_naming_both(s3_hook, bucket, tmp_path, keys, message):
    for key in keys:
        put(s3_hook, key, key.encode())
    prefix = keys[0].split("/")[0]
    with pytest.raises(storage.UnsafeKeyError, match=message):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/{prefix}/", tmp_path / "dest", log=lambda _: None)
    assert not list((tmp_path / "dest").rglob("*"))


def test_a_key_named_like_a_temp_file_is_refused() -> None:
    with pytest.raises(storage.UnsafeKeyError, match="staging's temp files"):
        storage.safe_relative_path("p/x" + storage.PART_SUFFIX, "p/")


def test_a_download_that_fails_midway_leaves_no_temp_file(s3_hook, bucket, tmp_path, monkeypatch):
    put(s3_hook, "cut/a.bin", b"0123456789" * 100)

    def cut(source, handle, length=0):
        handle.write(source.read(10))
        raise ConnectionResetError("connection reset mid-body")

    monkeypatch.setattr(storage.shutil, "copyfileobj", cut)
    with pytest.raises(ConnectionResetError):
        storage.stage_prefix(s3_hook, f"s3://{BUCKET}/cut/", tmp_path, log=lambda _: None)
    assert list(tmp_path.rglob("*")) == []


class CutClient:
    def download_file(self, bucket: str, key: str, filename: str) -> None:
        Path(filename).write_bytes(b"half")
        raise ConnectionResetError("connection reset mid-body")


class CutHook:
    def get_conn(self) -> CutClient:
        return CutClient()


def test_a_script_download_that_fails_leaves_no_temp_file(tmp_path: Path) -> None:
    with pytest.raises(ConnectionResetError):
        storage.download_object(CutHook(), "s3://sat-demo/scripts/train.py", tmp_path / "code" / "train.py")
    assert list((tmp_path / "code").iterdir()) == []


