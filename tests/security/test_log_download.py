"""The job-log download streams the object in bounded chunks; it never reads the whole log into memory (issue 29.8)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sat_tasks.io.object_storage import STREAM_CHUNK_BYTES, open_object_stream
from sat_tasks.io.run_layout import RunLayout
from sat_tasks.spec import load_spec
from tests.conftest import ROOT

BUCKET = "log-stream-tests"


class _BoundedBody:
    """A botocore StreamingBody stand-in that fails a whole read (read() or read(None)) or an oversized one."""

    def __init__(self, data: bytes):
        self.data, self.offset, self.sizes, self.closed = data, 0, [], False

    def read(self, amt=None):
        if amt is None or amt > STREAM_CHUNK_BYTES:
            raise AssertionError(f"unbounded read({amt!r})")
        self.sizes.append(amt)
        chunk = self.data[self.offset:self.offset + amt]
        self.offset += len(chunk)
        return chunk

    def close(self):
        self.closed = True


class _Hook:
    def __init__(self, body: _BoundedBody):
        self.body = body
        missing = type("NoSuchKey", (Exception,), {})
        self.client = SimpleNamespace(exceptions=SimpleNamespace(NoSuchKey=missing), get_object=self._get,
                                      list_objects_v2=self._list)
        self.keys: list[str] = []

    def _get(self, Bucket, Key, Range=None):
        self.keys.append(Key)
        assert Range in (None, f"bytes=0-{len(self.body.data) - 1}"), Range  # the whole object, streamed
        return {"ContentLength": len(self.body.data), "Body": self.body}

    def _list(self, Bucket, Prefix, MaxKeys=1000):
        return {"Contents": [{"Key": Prefix, "Size": len(self.body.data)}]}  # the job log is there

    def get_conn(self):
        return self.client

    def read_key(self, *args, **kwargs):
        raise AssertionError("the whole log was read into memory")


def _consume(response) -> bytes:
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.body_iterator])

    return asyncio.run(collect())


def test_log_route_streams_the_object_in_bounded_chunks(monkeypatch):
    from fastapi.responses import StreamingResponse

    from sat_tasks.ui import sources
    from sat_tasks.ui.routers import runs

    data = bytes(range(256)) * (3 * STREAM_CHUNK_BYTES // 256) + b"tail\n"
    body = _BoundedBody(data)
    job = load_spec(ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
    hook = _Hook(body)
    monkeypatch.setattr(sources, "object_storage", lambda: hook)
    monkeypatch.setattr(runs, "object_storage", lambda: hook)
    layout = RunLayout.of(job, job.name, "manual__2026-01-01T00:00:00+00:00")
    assert not layout.job_log.is_file()  # no local copy: the Object Storage one is read
    monkeypatch.setattr(runs, "find_job_run", lambda session, dag_id, run_id: SimpleNamespace(job=job, layout=layout))

    response = runs.job_log(job.name, "manual__2026-01-01T00:00:00+00:00", session=None)
    assert isinstance(response, StreamingResponse)
    assert response.headers["content-disposition"].startswith(
        f'attachment; filename="{job.name}-manual__2026-01-01T00_00_00_00_00.log"')
    assert response.headers["content-length"] == str(len(data))
    assert response.media_type.startswith("text/plain")
    assert _consume(response) == data
    assert len(body.sizes) >= 4 and body.closed
    assert hook.keys and all(key.endswith("/job.log") for key in hook.keys)


def test_open_object_stream_reads_a_real_object_in_chunks(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    data = b"line of the job log\n" * 20_000
    s3_hook.load_bytes(data, key="run/job.log", bucket_name=BUCKET, replace=True)
    stream = open_object_stream(s3_hook, f"s3://{BUCKET}/run/job.log", chunk_size=64 << 10)
    assert stream is not None and stream.size == len(data)
    chunks = list(stream.chunks)
    assert b"".join(chunks) == data
    assert max(map(len, chunks)) <= 64 << 10 and len(chunks) > 1


def test_open_object_stream_of_a_missing_object_is_none(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    assert open_object_stream(s3_hook, f"s3://{BUCKET}/run/missing.log") is None


@pytest.mark.parametrize("amt", [pytest.param(None, id="whole"), pytest.param(STREAM_CHUNK_BYTES + 1, id="oversized")])
def test_the_stand_in_body_refuses_unbounded_reads(amt):
    with pytest.raises(AssertionError):
        _BoundedBody(b"x").read(amt)
