"""AWS Signature Version 4, checked on the server side (the embedded Object Storage's gate, ADR 0037).

`parse(environ)` reads who claims to sign a WSGI request: the `Authorization:
AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...` header, or a presigned
URL's `X-Amz-Algorithm`/`X-Amz-Credential`/`X-Amz-Date`/`X-Amz-Expires`/`X-Amz-SignedHeaders`/
`X-Amz-Signature` query. Anything else (no credentials, SigV2's `AWS key:signature`,
SigV4a, a malformed scope) raises `SignatureError`.

`verify(environ, signed, secret)` rebuilds the canonical request as AWS documents it
(https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html) and compares
signatures in constant time:

- canonical URI: the path URI-encoded once, `/` kept (S3 does not encode it twice; other
  services do, and both forms are tried for them); the path as sent is tried too, so a
  client that encoded a reserved character differently still matches what it signed;
- canonical query: every parameter but `X-Amz-Signature`, names and values URI-encoded
  (`%20` for a space, `%2B` for `+`), sorted by name then value;
- canonical headers: the signed ones, lower-case, values trimmed and inner spaces folded;
  `host` must be among them;
- payload hash: `x-amz-content-sha256` as sent (a hex digest, `UNSIGNED-PAYLOAD`, or a
  `STREAMING-*` value; the chunks' own signatures are not checked), `UNSIGNED-PAYLOAD` for a
  presigned S3 URL, else the SHA-256 of the body. A hex digest is checked against the body.

The request's `X-Amz-Date` must lie within `max_skew` (15 minutes) of the server's clock; a
presigned URL is good from `X-Amz-Date` (less the skew) until `X-Amz-Expires` (at most 7 days)
after it. No secret, signature or string to sign ever goes into an error message.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlsplit

from sat_tasks.errors import SatError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = datetime.timedelta(minutes=15)
MAX_PRESIGNED_SECONDS = 7 * 24 * 3600
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


class SignatureError(SatError):
    """A request whose signature is missing, malformed, wrong or out of date; `code` and `status` as S3 answers."""

    def __init__(self, message: str, code: str = "AccessDenied", status: int = 403) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class SignedRequest:
    """What a request claims: who signed it, for which scope, over which headers."""

    key_id: str
    amz_date: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    presigned: bool
    expires: int | None = None
    token: str | None = None

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"

    def __repr__(self) -> str:  # the signature is no secret, but it has no place in a log either
        return f"SignedRequest(key_id={self.key_id!r}, scope={self.scope!r}, presigned={self.presigned})"


def parse(environ: dict[str, Any]) -> SignedRequest:
    """The SigV4 claims of a WSGI request; SignatureError for an unsigned, SigV2 or malformed one."""
    header = environ.get("HTTP_AUTHORIZATION", "").strip()
    query = dict(_query_pairs(environ.get("QUERY_STRING", "")))
    if header:
        algorithm, _, rest = header.partition(" ")
        if algorithm != ALGORITHM:
            if algorithm == "AWS":
                raise SignatureError("Signature Version 2 is not accepted: sign requests with AWS4-HMAC-SHA256")
            raise SignatureError(f"unsupported authorization algorithm {algorithm[:40]!r}: use {ALGORITHM}")
        fields = {}
        for part in rest.split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value.strip()
        missing = {"Credential", "SignedHeaders", "Signature"} - set(fields)
        if missing:
            raise SignatureError(f"the Authorization header lacks {', '.join(sorted(missing))}",
                                 code="AuthorizationHeaderMalformed", status=400)
        amz_date = environ.get("HTTP_X_AMZ_DATE", "").strip()
        if not amz_date:
            raise SignatureError("a signed request needs an X-Amz-Date header", code="AuthorizationHeaderMalformed",
                                 status=400)
        return _claims(fields["Credential"], amz_date, fields["SignedHeaders"], fields["Signature"],
                       presigned=False, token=environ.get("HTTP_X_AMZ_SECURITY_TOKEN"))
    if "X-Amz-Signature" in query or "X-Amz-Credential" in query:
        if query.get("X-Amz-Algorithm") != ALGORITHM:
            raise SignatureError(f"a presigned URL must use X-Amz-Algorithm={ALGORITHM}",
                                 code="AuthorizationQueryParametersError", status=400)
        missing = {"X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
                   "X-Amz-Signature"} - set(query)
        if missing:
            raise SignatureError(f"the presigned URL lacks {', '.join(sorted(missing))}",
                                 code="AuthorizationQueryParametersError", status=400)
        try:
            expires = int(query["X-Amz-Expires"])
        except ValueError:
            raise SignatureError("X-Amz-Expires must be a whole number of seconds",
                                 code="AuthorizationQueryParametersError", status=400) from None
        if not 0 < expires <= MAX_PRESIGNED_SECONDS:
            raise SignatureError(f"X-Amz-Expires must lie between 1 and {MAX_PRESIGNED_SECONDS} seconds",
                                 code="AuthorizationQueryParametersError", status=400)
        return _claims(query["X-Amz-Credential"], query["X-Amz-Date"], query["X-Amz-SignedHeaders"],
                       query["X-Amz-Signature"], presigned=True, token=query.get("X-Amz-Security-Token"),
                       expires=expires)
    if "Signature" in query and "AWSAccessKeyId" in query:
        raise SignatureError("Signature Version 2 is not accepted: sign requests with AWS4-HMAC-SHA256")
    raise SignatureError("the request carries no credentials: sign it with AWS Signature Version 4")


def _claims(credential: str, amz_date: str, signed_headers: str, signature: str, *, presigned: bool,
            token: str | None, expires: int | None = None) -> SignedRequest:
    parts = credential.rsplit("/", 4)
    if len(parts) != 5 or not parts[0] or parts[4] != "aws4_request":
        raise SignatureError("the credential must read <key id>/<yyyymmdd>/<region>/<service>/aws4_request",
                             code="AuthorizationHeaderMalformed", status=400)
    key_id, date, region, service, _ = parts
    try:
        datetime.datetime.strptime(amz_date, _AMZ_DATE)
    except ValueError:
        raise SignatureError("X-Amz-Date must read yyyymmddTHHMMSSZ", code="AuthorizationHeaderMalformed",
                             status=400) from None
    if amz_date[:8] != date:
        raise SignatureError("the credential's date is not the day of X-Amz-Date",
                             code="AuthorizationHeaderMalformed", status=400)
    names = tuple(signed_headers.split(";"))
    if any(name != name.lower() or not name for name in names) or list(names) != sorted(names):
        raise SignatureError("SignedHeaders must be lower-case names, sorted, separated by ';'",
                             code="AuthorizationHeaderMalformed", status=400)
    if "host" not in names:
        raise SignatureError("the host header must be signed")
    if not _SIGNATURE.fullmatch(signature):
        raise SignatureError("the signature must be 64 lower-case hex digits", code="AuthorizationHeaderMalformed",
                             status=400)
    return SignedRequest(key_id, amz_date, date, region, service, names, signature, presigned, expires, token)


def verify(environ: dict[str, Any], signed: SignedRequest, secret: str, *,
           now: datetime.datetime | None = None, max_skew: datetime.timedelta = MAX_SKEW) -> None:
    """Raise SignatureError unless `signed` is `secret`'s valid, current signature of this request.

    Reads a body whose hash the request names or that the signature covers, and puts it back
    (`wsgi.input`) for the application.
    """
    now = now or datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    when = datetime.datetime.strptime(signed.amz_date, _AMZ_DATE)
    if signed.presigned:
        if when - now > max_skew:
            raise SignatureError("the presigned URL is dated in the future", code="RequestTimeTooSkewed")
        if now > when + datetime.timedelta(seconds=signed.expires or 0):
            raise SignatureError("Request has expired")
    elif abs(now - when) > max_skew:
        raise SignatureError("the difference between the request time and the server's time is too large",
                             code="RequestTimeTooSkewed")
    payload = _payload_hash(environ, signed)
    key = signing_key(secret, signed.date, signed.region, signed.service)
    headers = canonical_headers(environ, signed.signed_headers)
    for canonical_uri in canonical_uris(environ, signed.service):
        for query in canonical_queries(environ.get("QUERY_STRING", ""), signed.presigned):
            request = "\n".join((environ.get("REQUEST_METHOD", "GET").upper(), canonical_uri, query, headers,
                                 ";".join(signed.signed_headers), payload))
            string_to_sign = "\n".join((ALGORITHM, signed.amz_date, signed.scope,
                                        hashlib.sha256(request.encode("utf-8")).hexdigest()))
            expected = hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
            if hmac.compare_digest(expected, signed.signature):
                return
    raise SignatureError("The request signature we calculated does not match the signature you provided",
                         code="SignatureDoesNotMatch")


@functools.lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The day's signing key of `secret` for `region` and `service` (cached: one per key, day and scope)."""
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key


def uri_encode(raw: bytes, *, keep_slash: bool = False) -> str:
    """AWS's UriEncode: every byte but `A-Za-z0-9-._~` as `%XY` (upper-case), `/` kept in a path."""
    return quote(raw, safe="/~" if keep_slash else "~")


def canonical_uris(environ: dict[str, Any], service: str) -> list[str]:
    """The canonical URIs a client may have signed for this path, the AWS form first."""
    decoded = environ.get("PATH_INFO", "").encode("latin-1") or b"/"
    candidates = [uri_encode(decoded, keep_slash=True)]
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        path = urlsplit(raw).path if "://" in raw else raw.partition("?")[0]
        candidates.append(path or "/")
    if service != "s3":  # every other service encodes the encoded path once more
        candidates.append(uri_encode(candidates[0].encode("latin-1"), keep_slash=True))
    return list(dict.fromkeys(candidates))


def canonical_queries(query_string: str, presigned: bool) -> list[str]:
    """The canonical query string (AWS form first, then the parameters as sent, sorted)."""
    raw = environ_bytes(query_string)
    pairs = [pair.partition(b"=") for pair in raw.split(b"&") if pair]
    if presigned:
        pairs = [p for p in pairs if unquote_to_bytes(p[0]) != b"X-Amz-Signature"]
    encoded = sorted((uri_encode(unquote_to_bytes(name)), uri_encode(unquote_to_bytes(value)))
                     for name, _, value in pairs)
    as_sent = sorted((name.decode("latin-1"), value.decode("latin-1")) for name, _, value in pairs)
    candidates = ["&".join(f"{name}={value}" for name, value in encoded),
                  "&".join(f"{name}={value}" for name, value in as_sent)]
    return list(dict.fromkeys(candidates))


def canonical_headers(environ: dict[str, Any], names: Iterable[str]) -> str:
    """`name:value\\n` for each signed header, values trimmed with inner whitespace folded to one space."""
    lines = []
    for name in names:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        value = environ.get(key, "")
        if isinstance(value, str):
            value = value.encode("latin-1", "replace").decode("utf-8", "replace")
        lines.append(f"{name}:{' '.join(str(value).split())}\n")
    return "".join(lines)


def environ_bytes(text: str) -> bytes:
    """A WSGI string (the bytes as latin-1) back as bytes."""
    return text.encode("latin-1", "replace")


def _payload_hash(environ: dict[str, Any], signed: SignedRequest) -> str:
    claimed = environ.get("HTTP_X_AMZ_CONTENT_SHA256", "").strip()
    if signed.presigned:
        query = dict(_query_pairs(environ.get("QUERY_STRING", "")))
        claimed = query.get("X-Amz-Content-Sha256") or claimed
        if not claimed:
            return UNSIGNED_PAYLOAD if signed.service == "s3" else hashlib.sha256(read_body(environ)).hexdigest()
    if not claimed:
        return hashlib.sha256(read_body(environ)).hexdigest()
    if _HEX64.fullmatch(claimed):
        if claimed != EMPTY_SHA256 or _content_length(environ):
            actual = hashlib.sha256(read_body(environ)).hexdigest()
            if not hmac.compare_digest(actual, claimed):
                raise SignatureError("The provided 'x-amz-content-sha256' header does not match what was computed",
                                     code="XAmzContentSHA256Mismatch", status=400)
        return claimed
    if claimed == UNSIGNED_PAYLOAD or claimed.startswith("STREAMING-"):
        return claimed
    raise SignatureError("x-amz-content-sha256 must be a SHA-256 hex digest, UNSIGNED-PAYLOAD or STREAMING-*",
                         code="InvalidArgument", status=400)


def _content_length(environ: dict[str, Any]) -> int:
    try:
        return max(0, int(environ.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def read_body(environ: dict[str, Any]) -> bytes:
    """The request's body (Content-Length bytes, or to the end of a terminated chunked input), put back to read."""
    cached = environ.get("sat.body")
    if cached is not None:
        return cached
    stream = environ.get("wsgi.input")
    if stream is None:
        body = b""
    elif environ.get("CONTENT_LENGTH"):
        body = stream.read(_content_length(environ))
    elif environ.get("wsgi.input_terminated"):
        body = stream.read()
    else:
        body = b""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["sat.body"] = body
    return body


def _query_pairs(query_string: str) -> list[tuple[str, str]]:
    """The query's parameters, percent-decoded (`+` stays `+`, as SigV4 clients mean it)."""
    pairs = []
    for pair in environ_bytes(query_string).split(b"&"):
        if pair:
            name, _, value = pair.partition(b"=")
            pairs.append((unquote_to_bytes(name).decode("utf-8", "replace"),
                          unquote_to_bytes(value).decode("utf-8", "replace")))
    return pairs
