"""The embedded Object Storage's access check: every request signed, temporary credentials held to their policy.

moto's server keeps the session policy `AssumeRole` was given but its IAM mode never
evaluates it (nor `s3:prefix` conditions), and with that mode off it checks nothing at all,
signatures included. `PolicyGate` wraps moto's WSGI app and decides each request before moto
sees it (ADRs 0020, 0037):

- every request must carry a valid AWS Signature Version 4 (`io.sigv4`: the Authorization
  header or a presigned URL, within 15 minutes of this clock, `host` signed) by a key the gate
  knows: SigV2, unsigned requests and made-up secrets are refused;
- the service keys (`LOCAL_ACCESS_KEY` with the secret generated per deployment or server,
  `local_s3.LocalS3Server.secret_key`: SAT's own tasks)
  may do everything, moto's own `/moto-api/` included;
- temporary credentials (`X-Amz-Security-Token`) from moto's STS are checked against their
  session's secret, must carry the session's token, be unexpired, and may make only S3
  requests that `core.object_policy.is_allowed` grants for their session policy (no session
  policy: nothing), and must not belong to a run that ended or was deleted
  (`io.scoped_credentials.revoked_because`, read from moto's own objects; ADR 0039);
- anything else (another key id, `/moto-api/` for anyone but the service) is refused.

A request is mapped to its IAM action and resource as S3 documents them (path-style
addressing only; an unknown sub-resource is refused). Refusals are S3's XML errors (STS's for
a request signed for STS); no secret or signature is ever in one.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse
from xml.etree import ElementTree

from sat_tasks.core.object_policy import LIST_ACTION, PREFIX_KEY, is_allowed, object_arn
from sat_tasks.io import sigv4

# Query parameters of a listing (ListObjects, ListObjectsV2): any other one on a bucket is refused.
LIST_PARAMS = frozenset({"list-type", "prefix", "delimiter", "max-keys", "continuation-token", "start-after",
                         "fetch-owner", "encoding-type", "marker", "x-id"})
# Sub-resources of an object that are not reading, writing or deleting its bytes: refused.
OBJECT_SUBRESOURCES = frozenset({"acl", "tagging", "retention", "legal-hold", "torrent", "attributes", "restore",
                                 "select", "select-type"})
MAX_DELETE_BODY = 1 << 20  # a DeleteObjects request of 1000 keys is far below this
MOTO_API = "/moto-api"  # moto's dashboard, reset and state API: the service's alone


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
    secret: str

    def __repr__(self) -> str:
        return f"Session(expiration={self.expiration.isoformat()})"


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, as S3 says it: `code`, `message`, HTTP `status`."""

    message: str
    code: str = "AccessDenied"
    status: int = 403


def moto_session(access_key_id: str) -> Session | None:
    """The session of moto's STS that issued `access_key_id`, in any account (None: not a temporary key)."""
    from moto.sts.models import sts_backends

    for account in list(sts_backends.keys()):
        for partition_backend in list(sts_backends[account].values()):
            found = partition_backend.get_assumed_role_from_access_key(access_key_id)
            if found is not None:
                return Session(found.session_token, found.policy, found.expiration, found.secret_access_key)
    return None


def moto_object(bucket: str, key: str) -> bytes | None:
    """An object's bytes as moto's S3 holds it, in any account (None: no such bucket or key)."""
    from moto.s3.exceptions import MissingBucket
    from moto.s3.models import s3_backends

    for account in list(s3_backends.keys()):
        for backend in list(s3_backends[account].values()):  # one per partition
            try:
                found = backend.get_object(bucket, key)
            except MissingBucket:  # not in this account or partition
                found = None
            if found is not None:
                return bytes(found.value)
    return None


def moto_revocation(session: Session) -> str | None:
    """Why the session's run no longer grants it anything (ended, deleted), or None."""
    from sat_tasks.io.scoped_credentials import revoked_because

    return revoked_because(session.policy, moto_object)


class PolicyGate:
    """WSGI middleware in front of moto's app (call order: build it around the app; the server calls it).

    `service_keys` maps each service key id to its secret (the deployment's generated one).
    """

    def __init__(self, app: Callable, service_keys: Mapping[str, str],
                 sessions: Callable[[str], Session | None] = moto_session,
                 revoked: Callable[[Session], str | None] = moto_revocation) -> None:
        self.app = app
        self.service_keys = dict(service_keys)
        if not all(isinstance(secret, str) and secret for secret in self.service_keys.values()):
            raise ValueError("every service key needs its secret")
        self.sessions = sessions
        self.revoked = revoked

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        refusal = self.refusal(environ)
        if refusal is None:
            return self.app(environ, start_response)
        body = error_body(refusal, sts=signed_for_sts(environ))
        start_response(f"{refusal.status} {_REASONS.get(refusal.status, 'Forbidden')}",
                       [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def refusal(self, environ: dict[str, Any]) -> Refusal | None:
        """Why the request is refused, or None when it may go on to moto."""
        try:
            signed = sigv4.parse(environ)
        except sigv4.SignatureError as exc:
            return Refusal(f"Access Denied: {exc}", exc.code, exc.status)
        secret = self.service_keys.get(signed.key_id)
        session = None
        if secret is None:
            session = self.sessions(signed.key_id)
            if session is None:
                return Refusal("The AWS access key Id you provided does not exist in our records.",
                               "InvalidAccessKeyId")
            if signed.token != session.token:
                return Refusal("Access Denied: the security token does not belong to this access key")
            if session.expiration.replace(tzinfo=None) <= _utcnow():
                return Refusal("Access Denied: the temporary credentials have expired", "ExpiredToken", 400)
            secret = session.secret
        try:
            sigv4.verify(environ, signed, secret)
        except sigv4.SignatureError as exc:
            return Refusal(str(exc), exc.code, exc.status)
        if session is None:
            return None  # the service's own key, signed with its secret: everything
        revoked = self.revoked(session)  # after the signature: only the key's holder learns it
        if revoked:
            return Refusal(f"Access Denied: the temporary credentials were revoked: {revoked}")
        if environ.get("PATH_INFO", "").startswith(MOTO_API):
            return Refusal("Access Denied: moto's API is the service's alone")
        if signed.service != "s3":
            return Refusal(f"Access Denied: temporary credentials may make S3 requests only, not {signed.service}")
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        try:
            accesses = s3_accesses(environ, query)
        except ValueError as exc:
            return Refusal(f"Access Denied: {exc}")
        for access in accesses:
            context = {PREFIX_KEY: access.prefix} if access.prefix is not None else {}
            if not is_allowed(session.policy, access.action, access.resource, context):
                return Refusal(f"Access Denied: {access.action} on {access.resource} is outside this session's "
                               "policy")
        return None


_REASONS = {400: "Bad Request", 403: "Forbidden"}


def error_body(refusal: Refusal, *, sts: bool = False) -> bytes:
    """The XML error of a refusal: S3's `<Error>`, or STS's `<ErrorResponse>` (query protocol)."""
    error = f"<Code>{_xml_text(refusal.code)}</Code><Message>{_xml_text(refusal.message)}</Message>"
    if sts:
        return (f'<?xml version="1.0" encoding="UTF-8"?><ErrorResponse><Error><Type>Sender</Type>{error}</Error>'
                "<RequestId>sat-gate</RequestId></ErrorResponse>").encode()
    return f'<?xml version="1.0" encoding="UTF-8"?><Error>{error}<RequestId>sat-gate</RequestId></Error>'.encode()


def signed_for_sts(environ: dict[str, Any]) -> bool:
    """Whether the request's credential scope names STS (its errors then take STS's XML shape)."""
    scope = environ.get("HTTP_AUTHORIZATION", "").partition("Credential=")[2].partition(",")[0]
    return scope.endswith("/sts/aws4_request")


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
            source_bucket, source_key = copy_source(source)
            accesses.append(S3Access("s3:GetObject", object_arn(source_bucket, source_key)))
        return accesses
    raise ValueError(f"{method} on an object is not granted")


def copy_source(value: str) -> tuple[str, str]:
    """The bucket and key an `x-amz-copy-source` names, read exactly as moto reads it (`urlparse`, then the path
    unquoted, leading slashes off, split at the first '/'); ValueError for anything the two could read apart.

    A leading `//` makes `urlparse` take the first segment as a network location (`//a/b/c` is bucket `b` to
    moto, `a` to a plain split: issue 44.7); a scheme, `;params`, a `#fragment` or a query other than
    `versionId` are refused too, and so is a key with a '.' or '..' part, as for the destination.
    """
    parsed = urlparse(value)
    if parsed.scheme or parsed.netloc or parsed.params or parsed.fragment or value.startswith("//"):
        raise ValueError("x-amz-copy-source must be <bucket>/<key>[?versionId=<id>] (no scheme, '//', ';' or '#')")
    if set(parse_qs(parsed.query, keep_blank_values=True)) - {"versionId"}:
        raise ValueError("x-amz-copy-source takes no query but versionId")
    bucket, slash, key = unquote(parsed.path).lstrip("/").partition("/")
    if not bucket or not slash or not key:
        raise ValueError("x-amz-copy-source must name a bucket and a key")
    if any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"x-amz-copy-source key {key!r} has a '.' or '..' part")
    return bucket, key


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


def gated_moto_app(service_keys: Mapping[str, str]) -> PolicyGate:
    """moto's whole server app (S3, STS, ...) behind the gate."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        create_backend_app,
    )

    return PolicyGate(DomainDispatcherApplication(create_backend_app), service_keys)


def main(argv: list[str] | None = None) -> None:
    """`python -m sat_tasks.io.s3_gate --host H --port P`: the gated server in this process.

    The service keys come as one JSON object `{key id: secret}` on standard input (never on
    the command line, which every user of the machine can read).
    """
    import argparse
    import json
    import logging
    import os
    import sys

    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    service_keys = json.loads(sys.stdin.readline())
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto_server does: the URLs moto writes name this port
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server(args.host, args.port, gated_moto_app(service_keys), threaded=True,
                         request_handler=MotoRequestHandler)
    server.serve_forever()


if __name__ == "__main__":
    main()
