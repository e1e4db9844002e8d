"""The gate reads `x-amz-copy-source` as moto does (issue 44.7): a source it could read apart from moto is refused.

`//a/b/c` is bucket `b`, key `c` to moto (`urlparse` takes `a` as a network location) and was bucket `a`, key
`b/c` to the gate: a session allowed to read `a/b/...` copied any object of bucket `b`.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlparse

import pytest

from sat_tasks.core.object_policy import object_arn
from sat_tasks.io.s3_gate import S3Access, s3_accesses


def _put(source: str) -> list[S3Access]:
    environ = {"HTTP_HOST": "127.0.0.1:9000", "PATH_INFO": "/own/runs/r1/output/copy", "REQUEST_METHOD": "PUT",
               "HTTP_X_AMZ_COPY_SOURCE": source}
    return s3_accesses(environ, {})


def _moto_reads(source: str) -> tuple[str, str]:
    """What moto's S3 responses take the copy source to be (moto/s3/responses.py, CopyObject and UploadPartCopy)."""
    parsed = urlparse(source)
    bucket, key = unquote(parsed.path).lstrip("/").split("/", 1)
    return bucket, key


@pytest.mark.parametrize("source", [
    "//own/victim/secret.bin", "///own/victim/secret.bin", "http://own/victim/secret.bin", "own/runs/r1/x;y",
    "own/runs/r1/x#frag", "own/runs/r1/x?acl", "own", "own/", "own/runs/../secret",
])
def test_a_copy_source_moto_could_read_apart_is_refused(source):
    with pytest.raises(ValueError, match="x-amz-copy-source"):
        _put(source)


@pytest.mark.parametrize("source", [
    "own/runs/r1/data.bin", "/own/runs/r1/data.bin", "own/runs/r1/a%20b.bin", "own/runs/r1/data.bin?versionId=3",
    "own/runs/r1/%2F%2Fx",
])
def test_the_gate_grants_the_object_moto_copies(source):
    put, get = _put(source)
    assert put == S3Access("s3:PutObject", object_arn("own", "runs/r1/output/copy"))
    assert get == S3Access("s3:GetObject", object_arn(*_moto_reads(source)))
    assert parse_qs(urlparse(source).query).keys() <= {"versionId"}
