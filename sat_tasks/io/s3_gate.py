"""The embedded Object Storage's access check: temporary credentials get only what their session policy allows.

moto's server keeps the session policy `AssumeRole` was given but its IAM mode never
evaluates it (nor `s3:prefix` conditions), and with that mode off it checks nothing at all.
`PolicyGate` wraps moto's WSGI app and decides each request before moto sees it (ADR 0020):

- the service keys (`LOCAL_ACCESS_KEY`: SAT's own tasks) may do everything, as before;
- temporary credentials (`X-Amz-Security-Token`) from moto's STS must carry the session's
  token, be unexpired, and may make only S3 requests that `core.object_policy.is_allowed`
  grants for their session policy (no session policy: nothing);
- anything else (another key id, no credentials, moto's own `/moto-api/`) is refused.

A request is mapped to its IAM action and resource as S3 documents them (path-style
addressing only; an unknown sub-resource is refused). Signatures are not verified (moto does
not either): the session token, which only the attempt holds, is the proof.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.etree import ElementTree

from sat_tasks.core.object_policy import LIST_ACTION, PREFIX_KEY, is_allowed, object_arn

# Query parameters of a listing (ListObjects, ListObjectsV2): any other one on a bucket is refused.
LIST_PARAMS = frozenset({"list-type", "prefix", "delimiter", "max-keys", "continuation-token", "start-after",
                         "fetch-owner", "encoding-type", "marker", "x-id"})
# Sub-resources of an object that are not reading, writing or deleting its bytes: refused.
OBJECT_SUBRESOURCES = frozenset({"acl", "tagging", "retention", "legal-hold", "torrent", "attributes", "restore",
                                 "select", "select-type"})
MAX_DELETE_BODY = 1 << 20  # a DeleteObjects request of 1000 keys is far below this


@dataclass(frozen=True)
class S3Access:
    """One IAM action a request needs: on `resource`, with `prefix` (ListBucket's `s3:prefix`) if any."""

    action: str
    resource: str
    prefix: str | None = None


@dataclass(frozen=True)
class Session:
    """What the gate needs of an `AssumeRole` session."""

    token: str
    policy: str | None
    expiration: datetime.datetime


def moto_session(access_key_id: str) -> Session | None:
    """The session of moto's STS that issued `access_key_id`, in any account (None: not a temporary key)."""
    from moto.sts.models import sts_backends

    for account in list(sts_backends.keys()):
        for partition_backend in list(sts_backends[account].values()):
            found = partition_backend.get_assumed_role_from_access_key(access_key_id)
            if found is not None:
                return Session(found.session_token, found.policy, found.expiration)
    return None


class PolicyGate:
    """WSGI middleware in front of moto's app (call order: build it around the app; the server calls it)."""

    def __init__(self, app: Callable, service_keys: Iterable[str],
                 sessions: Callable[[str], Session | None] = moto_session) -> None:
        self.app = app
        self.service_keys = frozenset(service_keys)
        self.sessions = sessions

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        refusal = self.refusal(environ)
        if refusal is None:
            return self.app(environ, start_response)
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                f"<Message>{_xml_text(refusal)}</Message></Error>").encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why the request is refused, or None when it may go on to moto."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        key_id, service = credential_of(environ, query)
        if key_id is None:
            return "Access Denied: the request carries no credentials"
        if key_id in self.service_keys:
            return None
        session = self.sessions(key_id)
        if session is None:
            return "Access Denied: unknown access key"
        token = environ.get("HTTP_X_AMZ_SECURITY_TOKEN") or _first(query, "X-Amz-Security-Token")
        if token != session.token:
            return "Access Denied: the security token does not belong to this access key"
        if session.expiration.replace(tzinfo=None) <= _utcnow():
            return "Access Denied: the temporary credentials have expired"
        if service != "s3":
            return f"Access Denied: temporary credentials may make S3 requests only, not {service}"
        try:
            accesses = s3_accesses(environ, query)
        except ValueError as exc:
            return f"Access Denied: {exc}"
        for access in accesses:
            context = {PREFIX_KEY: access.prefix} if access.prefix is not None else {}
            if not is_allowed(session.policy, access.action, access.resource, context):
                return f"Access Denied: {access.action} on {access.resource} is outside this session's policy"
        return None


def credential_of(environ: dict[str, Any], query: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """The access key id and the signed service of a request (SigV4 header or query, SigV2); Nones if unsigned."""
    header = environ.get("HTTP_AUTHORIZATION", "")
    scope = ""
    if "Credential=" in header:
        scope = header.partition("Credential=")[2].partition(",")[0].strip()
    elif _first(query, "X-Amz-Credential"):
        scope = _first(query, "X-Amz-Credential")
    elif header.startswith("AWS ") and ":" in header:
        return header[4:].partition(":")[0].strip(), "s3"
    if not scope:
        return None, None
    parts = scope.split("/")
    return parts[0], parts[3] if len(parts) > 3 else None


def s3_accesses(environ: dict[str, Any], query: dict[str, list[str]]) -> list[S3Access]:
    """The IAM actions an S3 request needs (path-style); ValueError for what a session may never do."""
    host = environ.get("HTTP_HOST", "").rpartition(":")[0] or environ.get("HTTP_HOST", "")
    if not _is_plain_host(host):
        raise ValueError(f"only path-style requests are served to temporary credentials, not host {host!r}")
    path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8")  # WSGI's str is the bytes as latin-1
    bucket, _, key = path.lstrip("/").partition("/")
    method = environ.get("REQUEST_METHOD", "GET").upper()
    if not bucket:
        raise ValueError("listing the buckets is not granted")
    if not key:
        return _bucket_accesses(environ, method, bucket, query)
    if any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"key {key!r} has a '.' or '..' part")
    if set(query) & OBJECT_SUBRESOURCES:
        raise ValueError(f"sub-resource {sorted(set(query) & OBJECT_SUBRESOURCES)} is not granted")
    resource = object_arn(bucket, key)
    if method in ("GET", "HEAD"):
        action = "s3:ListMultipartUploadParts" if "uploadId" in query else "s3:GetObject"
        return [S3Access(action, resource)]
    if method == "DELETE":
        return [S3Access("s3:AbortMultipartUpload" if "uploadId" in query else "s3:DeleteObject", resource)]
    if method == "POST" and ("uploads" in query or "uploadId" in query):
        return [S3Access("s3:PutObject", resource)]
    if method == "PUT":
        accesses = [S3Access("s3:PutObject", resource)]
        source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
        if source:
            source_bucket, _, source_key = unquote(source.partition("?")[0]).lstrip("/").partition("/")
            accesses.append(S3Access("s3:GetObject", object_arn(source_bucket, source_key)))
        return accesses
    raise ValueError(f"{method} on an object is not granted")


def _bucket_accesses(environ: dict[str, Any], method: str, bucket: str,
                     query: dict[str, list[str]]) -> list[S3Access]:
    if method == "POST" and "delete" in query:
        return [S3Access("s3:DeleteObject", object_arn(bucket, key)) for key in _deleted_keys(environ)]
    if method in ("GET", "HEAD") and not set(query) - LIST_PARAMS:
        prefix = _first(query, "prefix") if method == "GET" else None
        return [S3Access(LIST_ACTION, object_arn(bucket), prefix or None)]
    raise ValueError(f"{method} on bucket {bucket} with {sorted(query)} is not granted")


def _deleted_keys(environ: dict[str, Any]) -> list[str]:
    """The keys of a DeleteObjects body; the body is put back for moto to read."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        raise ValueError("a DeleteObjects request needs a Content-Length") from None
    if length > MAX_DELETE_BODY:
        raise ValueError("a DeleteObjects body this large is not served to temporary credentials")
    body = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise ValueError("the DeleteObjects body is not XML") from None
    keys = [element.text or "" for element in root.iter() if element.tag.rpartition("}")[2] == "Key"]
    if not keys:
        raise ValueError("a DeleteObjects request without keys")
    return keys


def _is_plain_host(host: str) -> bool:
    """An IP address or `localhost`: the host of a path-style request (a bucket's name would come first)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _first(query: dict[str, list[str]], name: str) -> str:
    return (query.get(name) or [""])[0]


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def gated_moto_app(service_keys: Iterable[str]) -> PolicyGate:
    """moto's whole server app (S3, STS, ...) behind the gate."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        create_backend_app,
    )

    return PolicyGate(DomainDispatcherApplication(create_backend_app), service_keys)


def main(argv: list[str] | None = None) -> None:
    """`python -m sat_tasks.io.s3_gate --host H --port P --service-key ID`: the gated server in this process."""
    import argparse
    import logging
    import os

    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-key", action="append", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto_server does: the URLs moto writes name this port
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server(args.host, args.port, gated_moto_app(args.service_key), threaded=True,
                         request_handler=MotoRequestHandler)
    server.serve_forever()


if __name__ == "__main__":
    main()
