"""Object Storage URIs (`s3://bucket/prefix`): the rule a spec checks, and splitting one."""

from __future__ import annotations

import re

S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
S3_URI_RULE = "must be an Object Storage URI s3://<bucket>/<prefix> (bucket 3-63 chars, lowercase)"
_S3_URI_RE = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$", re.DOTALL)


def check_s3_uri(value: str) -> str:
    """Return the URI when it is a well-formed `s3://bucket[/prefix]`, else raise ValueError."""
    match = _S3_URI_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(S3_URI_RULE)
    if any(part == ".." for part in (match.group("key") or "").split("/")):
        raise ValueError("must not contain '..' path segments")
    return value


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into (bucket, prefix)."""
    match = _S3_URI_RE.match(uri)
    if not match:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    return match.group("bucket"), match.group("key") or ""
