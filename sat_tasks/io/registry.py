"""Container-image check: can the job's image be pulled, speaking the OCI distribution API."""

from __future__ import annotations

import dataclasses
import email.utils
import enum
import hashlib
import ipaddress
import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from sat_tasks.errors import SatError

log = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_MEDIA_TYPES",
    "MAX_MANIFEST_BYTES",
    "ImageCheckInconclusive",
    "ImageCheckOutcome",
    "ImageCheckResult",
    "ImageReference",
    "MalformedReference",
    "RegistryAccess",
    "RegistryLoginRefused",
    "check_image",
    "parse_image_reference",
    "registry_access_from_connection",
]

# Docker Hub: the name users write, and the host that serves its API.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API_HOST = "registry-1.docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

# Accept header of the manifest HEAD: image manifests and indexes, Docker and OCI.
MANIFEST_MEDIA_TYPES: tuple[str, ...] = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)

# Grammar of github.com/distribution/reference (the one containerd and Docker use).
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_NAME_MAX_LENGTH = 255

RETRIABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))

# What the check reads from a registry it does not trust, at most: a manifest (4 MiB, the limit
# of the distribution spec and of containerd), a token answer, and the /v2/ ping's body.
MAX_MANIFEST_BYTES = 4 << 20
MAX_TOKEN_BYTES = 1 << 20
MAX_PING_BYTES = 64 << 10
_READ_CHUNK = 64 << 10
# Every distribution-API answer carries this header (registry, Harbor, ECR, GAR, Quay, Docker Hub).
API_VERSION_HEADER = "Docker-Distribution-API-Version"
DEFAULT_DEADLINE = 120.0  # seconds for the whole check: every request, retry, backoff and read


class ImageCheckInconclusive(SatError):
    """The registry could not say whether the image can be pulled (unreachable, 5xx, rate limited): the task retries."""


class RegistryLoginRefused(SatError):
    """The job's registry connection may not be used for this image; no credential was sent anywhere."""


class MalformedReference(SatError, ValueError):
    """The image reference breaks the reference grammar; the message names the rule."""


class _RetriesExhausted(Exception):
    """A request kept failing transiently (429, 5xx, timeout, connection) after all retries."""


class _TooLarge(Exception):
    """A body is larger than what the check reads from a registry."""


class ImageCheckOutcome(str, enum.Enum):
    """What a pull of the image would do."""

    OK = "ok"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    UNREACHABLE = "unreachable"
    MALFORMED = "malformed"
    UNTRUSTED = "untrusted"  # the registry's certificate is not signed by a CA the deployment trusts


# Outcomes a pull retry cannot fix: the job ends as "Pending - imagepullbackoff".
_PULL_FAILURES = frozenset(
    {ImageCheckOutcome.UNAUTHORIZED, ImageCheckOutcome.NOT_FOUND, ImageCheckOutcome.MALFORMED,
     ImageCheckOutcome.UNTRUSTED}
)


@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference.

    Attributes:
        registry: registry host[:port] as written, ``docker.io`` when none was written.
        repository: repository path, ``library/`` prefixed for official Docker Hub images.
        tag: the tag; ``latest`` when neither tag nor digest was written.
        digest: ``algorithm:hex`` when the reference pins one (it wins over the tag).
    """

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def api_host(self) -> str:
        """Host[:port] that serves the distribution API (Docker Hub's differs from its name)."""
        return DOCKER_HUB_API_HOST if self.registry in _DOCKER_HUB_ALIASES else self.registry

    @property
    def manifest_reference(self) -> str:
        """The ``<reference>`` of ``/v2/<name>/manifests/<reference>``: digest, else tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_image_reference(ref: str) -> ImageReference:
    """Parse ``[host[:port]/]path[:tag][@digest]`` with Docker's defaults.

    Raises:
        MalformedReference: naming the rule the reference breaks.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise MalformedReference("image reference is empty")
    if ref != ref.strip() or any(ch.isspace() for ch in ref):
        raise MalformedReference(f"image reference {ref!r} contains whitespace")
    if "://" in ref:
        raise MalformedReference(
            f"image reference {ref!r} has a URL scheme; write host/repository[:tag] without it"
        )

    if "@" in ref and "/" in ref.split("@", 1)[1]:  # user:password@host/... ; never echo it
        raise MalformedReference(
            "image reference carries credentials (user:password@host/...); give them "
            "as username and password instead"
        )
    remainder, digest = ref, None
    if "@" in remainder:
        remainder, digest = remainder.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise MalformedReference(
                f"digest {digest!r} in {ref!r} is not algorithm:hex (e.g. sha256:<64 hex digits>)"
            )
        algorithm, encoded = digest.split(":", 1)
        if algorithm == "sha256" and not re.fullmatch(r"[a-f0-9]{64}", encoded):
            raise MalformedReference(
                f"sha256 digest in {ref!r} must be 64 lowercase hex digits"
            )

    tag = None
    last_slash = remainder.rfind("/")
    if remainder.rfind(":") > last_slash:  # a colon after the last slash starts the tag
        remainder, tag = remainder.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise MalformedReference(
                f"tag {tag!r} in {ref!r} must be 1-128 of [A-Za-z0-9_.-], not starting with . or -"
            )

    if not remainder:
        raise MalformedReference(f"image reference {ref!r} has no repository name")
    registry, path = _split_registry(remainder)
    if not path:
        raise MalformedReference(f"image reference {ref!r} has no repository name")
    if len(path) > _NAME_MAX_LENGTH:
        raise MalformedReference(
            f"repository name in {ref!r} is longer than {_NAME_MAX_LENGTH} characters"
        )
    for component in path.split("/"):
        if not component:
            raise MalformedReference(f"repository name in {ref!r} has an empty path component")
        if component != component.lower():
            raise MalformedReference(f"repository name in {ref!r} must be lowercase")
        if not _PATH_COMPONENT.fullmatch(component):
            raise MalformedReference(
                f"path component {component!r} in {ref!r} must be [a-z0-9] separated by "
                "'.', '_', '__' or '-'"
            )
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if tag is None and digest is None:
        tag = "latest"
    return ImageReference(registry=registry, repository=path, tag=tag, digest=digest)


def _split_registry(name: str) -> tuple[str, str]:
    """Split ``name`` into (registry, path); the first part is a host if it looks like one."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        if not _DOMAIN.fullmatch(first):
            raise MalformedReference(f"registry host {first!r} is not a valid host[:port]")
        return first, rest
    return DOCKER_HUB, name


@dataclass(frozen=True)
class ImageCheckResult:
    """Outcome of ``check_image``; holds no credential, so it may go to logs and XCom.

    Attributes:
        outcome: what a pull would do.
        reference: the reference as given (or its canonical form when it parsed).
        message: one line for a human.
        digest: the manifest digest (``Docker-Content-Digest``) when ``outcome`` is OK.
        media_type: the manifest media type when ``outcome`` is OK.
        status_code: the last HTTP status the registry answered, if any.
    """

    outcome: ImageCheckOutcome
    reference: str
    message: str
    digest: str | None = None
    media_type: str | None = None
    status_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is ImageCheckOutcome.OK

    @property
    def pulls_fail(self) -> bool:
        """True when a pull cannot succeed by waiting: unauthorized, not found, malformed."""
        return self.outcome in _PULL_FAILURES

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "reference": self.reference,
            "message": self.message,
            "digest": self.digest,
            "media_type": self.media_type,
            "status_code": self.status_code,
            "pulls_fail": self.pulls_fail,
        }


@dataclass(frozen=True)
class RegistryAccess:
    """Credentials and scheme for one registry, as read from an Airflow connection.

    The password is kept out of ``repr``; pass the fields to ``check_image``.
    """

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure: bool = False


def registry_access_from_connection(
    conn: Any, ref: str | ImageReference, conn_id: str = "image.registry_conn_id"
) -> RegistryAccess:
    """Read login, password and scheme from a connection-like object for the image ``ref``.

    ``conn`` needs Airflow ``Connection`` attributes (``host``, ``login``, ``password``,
    ``schema``, ``extra_dejson``); none is imported here. Plain http is chosen only
    explicitly: a ``http://`` host, ``schema == "http"`` or ``{"insecure": true}`` in the
    extra. Credentials go only to the registry the connection names: a connection for
    another host gets its credentials withheld, and one without a host is refused.

    Raises:
        RegistryLoginRefused: the connection names no host (its credentials would go to
            whatever registry an image names, e.g. another connection's key pair).
    """
    image = ref if isinstance(ref, ImageReference) else parse_image_reference(ref)
    raw_host = (getattr(conn, "host", None) or "").strip()
    extra = getattr(conn, "extra_dejson", None) or {}
    insecure = (getattr(conn, "schema", None) or "").lower() == "http" or _truthy(
        extra.get("insecure")
    )
    host = raw_host
    if "://" in raw_host:
        parts = urlsplit(raw_host)
        insecure = insecure or parts.scheme == "http"
        host = parts.netloc
    host = host.split("/", 1)[0]
    if not host:
        raise RegistryLoginRefused(
            f"registry connection {conn_id!r} (image.registry_conn_id) has no host: set its Host "
            "to the registry it logs in to; its credentials are sent only to that registry"
        )
    if not _same_registry(host, image):
        log.warning(
            "registry connection is for %s, image %s is on %s: checking without credentials",
            host,
            image,
            image.registry,
        )
        return RegistryAccess(insecure=False)
    return RegistryAccess(
        username=getattr(conn, "login", None) or None,
        password=getattr(conn, "password", None) or None,
        insecure=insecure,
    )


# ---- which registries a plain-http check may contact (issue 44.7) ---------------------------------------------
def _host_port(host: str) -> tuple[str, int | None]:
    """`host[:port]` (an IPv6 literal in brackets) as (lowercase host name, port or None)."""
    parts = urlsplit("//" + host.strip().lower())
    try:
        return parts.hostname or "", parts.port
    except ValueError:  # a port that is not a number
        return parts.hostname or "", -1


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost" or hostname.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def operator_registry_hosts(get_connection: Any = None) -> tuple[list[str], bool]:
    """The registries a plain-http image check may contact, and whether loopback is among them.

    `[sat] registry_hosts` when set (`host` for any port, or `host:port`); else the hosts of the
    `[sat] shared_registry_connections` (the registries the operator configured) and loopback.
    """
    from sat_tasks.config import sat_setting, shared_registry_connections

    listed = [h.strip().lower() for h in sat_setting("registry_hosts").split(",") if h.strip()]
    if listed:
        return listed, False
    hosts = []
    for conn_id in sorted(shared_registry_connections()) if get_connection is not None else []:
        try:
            raw = (getattr(get_connection(conn_id), "host", None) or "").strip().lower()
        except Exception as exc:  # noqa: BLE001 - a shared login not defined here: no host from it
            log.warning("shared registry connection %s: %s; its host is not allowed", conn_id, type(exc).__name__)
            continue
        raw = urlsplit(raw).netloc if "://" in raw else raw
        if raw.split("/", 1)[0]:
            hosts.append(raw.split("/", 1)[0])
    return hosts, True


def plain_http_refusal(ref: str, hosts: list[str], loopback: bool) -> str | None:
    """Why a plain-http (insecure) check of the image `ref` may not contact its registry (None: it may).

    An `insecure: true` image probed any host:port from the worker (issue 44.7): its registry must be
    one of `hosts` (`host` matches any port, `host:port` that port only), or loopback when `loopback`.
    """
    try:
        image = parse_image_reference(ref)
    except MalformedReference:
        return None  # check_image says it is malformed, and contacts nothing
    hostname, port = _host_port(image.api_host)
    if loopback and _is_loopback(hostname):
        return None
    for entry in hosts:
        allowed_name, allowed_port = _host_port(entry)
        if allowed_name == hostname and allowed_port in (None, port):
            return None
    listed = ", ".join(hosts) or "none"
    return (f"image.url: the registry {image.registry} is not one a plain-http (insecure) image check may contact "
            f"([sat] registry_hosts; allowed: {listed}{', loopback' if loopback else ''})")


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def _same_registry(host: str, image: ImageReference) -> bool:
    host = host.lower()
    if host in _DOCKER_HUB_ALIASES:
        return image.registry in _DOCKER_HUB_ALIASES
    return host == image.registry.lower()


def check_image(
    ref: str,
    *,
    username: str | None = None,
    password: str | None = None,
    insecure: bool = False,
    timeout: float = 10,
    retries: int = 3,
    backoff: float = 1.0,
    max_backoff: float = 30.0,
    deadline: float = DEFAULT_DEADLINE,
    ca_file: str | None = None,
) -> ImageCheckResult:
    """Tell whether ``ref`` could be pulled, without pulling it.

    Call order: ``GET /v2/`` (ping), then the ``WWW-Authenticate`` challenge (a Bearer
    token from the realm for ``repository:<repo>:pull``, or Basic), then
    ``HEAD /v2/<repo>/manifests/<tag|digest>`` accepting ``MANIFEST_MEDIA_TYPES``.

    Args:
        ref: the image reference, e.g. ``registry.example.com/team/llm:v3``.
        username, password: registry credentials; the password is never logged,
            returned or put in an exception message.
        insecure: plain http instead of https (never chosen automatically).
        timeout: seconds per connect and per read.
        retries: extra attempts per request after 408, 429, 5xx, timeouts and
            connection errors; still failing means UNREACHABLE, never a bad image.
        backoff: first wait in seconds; it doubles per retry. A ``Retry-After`` header
            replaces it. Every wait is capped at ``max_backoff``.
        deadline: seconds for the whole check (requests, retries, waits and reads; a
            server that drips its answer byte by byte never resets it). Past it the
            answer is UNREACHABLE, like any registry that does not answer.
        ca_file: a CA certificate (PEM) to trust for this registry (`[sat] registry_ca_file`)
            instead of the default bundle. A certificate no trusted CA signed is UNTRUSTED, a
            pull failure: no retry makes it trusted.

    Bodies are read only up to a bound: a manifest over ``MAX_MANIFEST_BYTES`` is
    refused (MALFORMED), and ``/v2/`` must answer as the distribution API does (the
    ``Docker-Distribution-API-Version`` header or an OCI error body), else the host is
    "not an OCI distribution registry" (UNREACHABLE).
    """
    try:
        image = parse_image_reference(ref)
    except MalformedReference as exc:
        result = ImageCheckResult(ImageCheckOutcome.MALFORMED, str(ref), f"malformed: {exc}")
    else:
        checker = _ImageChecker(
            image,
            username=username,
            password=password,
            insecure=insecure,
            timeout=timeout,
            retries=max(0, retries),
            backoff=max(0.0, backoff),
            max_backoff=max(0.0, max_backoff),
            deadline=max(0.0, deadline),
            ca_file=ca_file,
        )
        result = checker.run_within_deadline()
    if password:  # e.g. a reference written as user:password@host/repo
        result = dataclasses.replace(
            result,
            reference=result.reference.replace(password, "***"),
            message=result.message.replace(password, "***"),
        )
    log.log(logging.INFO if result.ok else logging.WARNING, "image check: %s", result.message)
    return result


@dataclass(frozen=True)
class _Credentials:
    """What the manifest request sends after the challenge: headers and/or Basic auth."""

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    auth: tuple[bytes, bytes] | None = field(default=None, repr=False)


def _has_challenge(response: requests.Response) -> bool:
    return bool(response.headers.get("WWW-Authenticate"))


def _media_type(response: requests.Response) -> str:
    return (response.headers.get("Content-Type") or "").split(";")[0].strip()


class _ImageChecker:
    """One check of one image: ping, authenticate, HEAD the manifest."""

    def __init__(
        self,
        image: ImageReference,
        *,
        username: str | None,
        password: str | None,
        insecure: bool,
        timeout: float,
        retries: int,
        backoff: float,
        max_backoff: float,
        deadline: float = DEFAULT_DEADLINE,
        ca_file: str | None = None,
    ) -> None:
        self.image = image
        # per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a session's verify
        self.verify: str | bool = ca_file or True
        self.username = username
        self._password = password
        self.insecure = insecure
        self.scheme = "http" if insecure else "https"
        self.base_url = f"{self.scheme}://{image.api_host}"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.deadline = deadline
        self.ends_at = time.monotonic() + deadline
        self.cancelled = threading.Event()
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "sat-image-check/1"

    def __repr__(self) -> str:
        return f"_ImageChecker(image={str(self.image)!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self.session.close()

    @property
    def _basic(self) -> tuple[bytes, bytes] | None:
        """Basic credentials as UTF-8 (requests would encode str as latin-1 and fail)."""
        if self.username is None and self._password is None:
            return None
        return ((self.username or "").encode(), (self._password or "").encode())

    def _result(
        self, outcome: ImageCheckOutcome, message: str, **fields: Any
    ) -> ImageCheckResult:
        return ImageCheckResult(outcome, str(self.image), f"{outcome.value}: {message}", **fields)

    def _remaining(self) -> float:
        return self.ends_at - time.monotonic()

    def _past_deadline(self) -> ImageCheckResult:
        return self._result(
            ImageCheckOutcome.UNREACHABLE,
            f"{self.base_url} gave no complete answer within the check's deadline of "
            f"{self.deadline:g}s",
        )

    def run_within_deadline(self) -> ImageCheckResult:
        """``run`` on a daemon thread, given up at the deadline (a drip-fed answer keeps the
        per-read timeout from ever firing); the abandoned thread stops at its next read or retry."""
        outcome: list[ImageCheckResult] = []

        def work() -> None:
            try:
                outcome.append(self.run())
            finally:
                self.close()

        worker = threading.Thread(target=work, name="sat-image-check", daemon=True)
        worker.start()
        worker.join(max(0.0, self._remaining()))
        if outcome:
            return outcome[0]
        self.cancelled.set()
        return self._past_deadline()

    def run(self) -> ImageCheckResult:
        try:
            return self._check()
        except _RetriesExhausted as exc:
            return self._result(ImageCheckOutcome.UNREACHABLE, str(exc))
        except requests.exceptions.SSLError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                return self._result(
                    ImageCheckOutcome.UNTRUSTED,
                    f"untrusted: the certificate of {self.base_url} is not signed by a trusted CA "
                    "(x509: certificate signed by unknown authority); give the deployment the registry's CA "
                    "([sat] registry_ca_file)",
                )
            hint = "" if self.insecure else " (a plain-http registry needs insecure=True)"
            return self._result(
                ImageCheckOutcome.UNREACHABLE, f"TLS handshake with {self.base_url} failed{hint}"
            )
        except requests.RequestException as exc:
            return self._result(
                ImageCheckOutcome.UNREACHABLE,
                f"request to {self.base_url} failed: {type(exc).__name__}",
            )

    def _check(self) -> ImageCheckResult:
        ping = self._request("GET", f"{self.base_url}/v2/")
        if ping.status_code in (200, 401, 403) and not self._answers_as_registry(ping):
            return self._result(
                ImageCheckOutcome.UNREACHABLE,
                f"{self.base_url}/v2/ answered {ping.status_code} without the "
                f"{API_VERSION_HEADER} header or an OCI error body: not an OCI distribution "
                "registry",
                status_code=ping.status_code,
            )
        credentials: _Credentials | ImageCheckResult = _Credentials()
        challenged = ping.status_code in (401, 403)
        if challenged:
            credentials = self._answer_challenge(ping)
        elif ping.status_code != 200:
            return self._result(
                ImageCheckOutcome.UNREACHABLE,
                f"{self.base_url}/v2/ answered {ping.status_code}: not an OCI distribution "
                "registry",
                status_code=ping.status_code,
            )
        if isinstance(credentials, ImageCheckResult):
            return credentials
        response = self._head_manifest(credentials)
        if response.status_code == 401 and not challenged and _has_challenge(response):
            # /v2/ was open, but this repository asks for credentials.
            credentials = self._answer_challenge(response)
            if isinstance(credentials, ImageCheckResult):
                return credentials
            response = self._head_manifest(credentials)
        return self._classify_manifest(response, credentials)

    def _answers_as_registry(self, response: requests.Response) -> bool:
        """The distribution API's header, or its JSON error body (``{"errors": [...]}``)."""
        if response.headers.get(API_VERSION_HEADER):
            return True
        try:
            body = json.loads(_read_capped(response, MAX_PING_BYTES, self.cancelled))
        except (_TooLarge, ValueError):
            return False
        return isinstance(body, dict) and isinstance(body.get("errors"), list)

    def _answer_challenge(self, response: requests.Response) -> _Credentials | ImageCheckResult:
        """Turn a 401's ``WWW-Authenticate`` into what the manifest request sends."""
        scheme, params = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "bearer":
            return self._fetch_token(params)
        if scheme == "basic":
            if self._basic is None:
                return self._result(
                    ImageCheckOutcome.UNAUTHORIZED,
                    f"{self.image.registry} requires credentials and none were given",
                    status_code=response.status_code,
                )
            verify = self._request("GET", f"{self.base_url}/v2/", auth=self._basic)
            if verify.status_code in (401, 403):
                return self._result(
                    ImageCheckOutcome.UNAUTHORIZED,
                    f"{self.image.registry} rejected the credentials of user {self.username!r}",
                    status_code=verify.status_code,
                )
            return _Credentials(auth=self._basic)
        return self._result(
            ImageCheckOutcome.UNAUTHORIZED,
            f"{self.image.registry} answered {response.status_code} without a Basic or "
            "Bearer challenge",
            status_code=response.status_code,
        )

    def _fetch_token(self, params: Mapping[str, str]) -> _Credentials | ImageCheckResult:
        realm = params.get("realm", "")
        realm_parts = urlsplit(realm)
        if realm_parts.scheme not in ("http", "https") or not realm_parts.netloc:
            return self._result(
                ImageCheckOutcome.UNAUTHORIZED,
                f"{self.image.registry} sent a Bearer challenge without a usable realm URL",
            )
        auth = self._basic
        if auth is not None and realm_parts.scheme == "http" and not self.insecure:
            log.warning("token realm %s is plain http: not sending credentials to it", realm)
            auth = None
        query = {"scope": f"repository:{self.image.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        response = self._request("GET", realm, params=query, auth=auth)
        if response.status_code in (401, 403):
            who = f"user {self.username!r}" if auth else "anonymous access"
            return self._result(
                ImageCheckOutcome.UNAUTHORIZED,
                f"token service {realm_parts.netloc} refused {who} "
                f"for repository:{self.image.repository}:pull",
                status_code=response.status_code,
            )
        token = None
        if response.status_code == 200:
            try:
                body = json.loads(_read_capped(response, MAX_TOKEN_BYTES, self.cancelled))
            except (_TooLarge, ValueError):
                body = None
            if isinstance(body, dict):
                token = body.get("token") or body.get("access_token")
        if not token:
            return self._result(
                ImageCheckOutcome.UNREACHABLE,
                f"token service {realm_parts.netloc} answered {response.status_code} "
                "without a token",
                status_code=response.status_code,
            )
        return _Credentials(headers={"Authorization": f"Bearer {token}"})

    def _manifest_url(self) -> str:
        return (
            f"{self.base_url}/v2/{self.image.repository}/manifests/"
            f"{self.image.manifest_reference}"
        )

    def _head_manifest(self, credentials: _Credentials) -> requests.Response:
        headers = {**credentials.headers, "Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
        return self._request(
            "HEAD",
            self._manifest_url(),
            headers=headers,
            auth=credentials.auth,
            allow_redirects=True,
        )

    def _classify_manifest(
        self, response: requests.Response, credentials: _Credentials
    ) -> ImageCheckResult:
        status = response.status_code
        if status == 200:
            digest = response.headers.get("Docker-Content-Digest")
            media_type = _media_type(response)
            if _content_length(response) > MAX_MANIFEST_BYTES:
                return self._manifest_too_large(status)
            if not digest:
                try:
                    digest, media_type = self._digest_by_get(credentials, media_type)
                except _TooLarge:
                    return self._manifest_too_large(status)
            return self._result(
                ImageCheckOutcome.OK,
                f"{self.image} resolves to {digest} ({media_type or 'unknown media type'})",
                digest=digest,
                media_type=media_type or None,
                status_code=status,
            )
        if status in (401, 403):
            who = f"user {self.username!r}" if self._basic else "anonymous access"
            return self._result(
                ImageCheckOutcome.UNAUTHORIZED,
                f"{who} may not pull {self.image.repository} from {self.image.registry} "
                "(no access, or the repository does not exist)",
                status_code=status,
            )
        if status == 404:
            return self._result(
                ImageCheckOutcome.NOT_FOUND,
                f"{self._explain_not_found(credentials)} on {self.image.registry}",
                status_code=status,
            )
        return self._result(
            ImageCheckOutcome.UNREACHABLE,
            f"{self.image.registry} answered {status} to the manifest request",
            status_code=status,
        )

    def _manifest_too_large(self, status: int) -> ImageCheckResult:
        return self._result(
            ImageCheckOutcome.MALFORMED,
            f"the manifest of {self.image} is larger than {MAX_MANIFEST_BYTES >> 20} MiB, the "
            "distribution spec's limit: refused (a pull would refuse it too)",
            status_code=status,
        )

    def _digest_by_get(
        self, credentials: _Credentials, media_type: str
    ) -> tuple[str | None, str]:
        """Some registries omit ``Docker-Content-Digest`` on HEAD: hash the manifest body."""
        if self.image.digest:
            return self.image.digest, media_type
        response = self._request(
            "GET",
            self._manifest_url(),
            headers={**credentials.headers, "Accept": ", ".join(MANIFEST_MEDIA_TYPES)},
            auth=credentials.auth,
        )
        if response.status_code != 200:
            response.close()
            return None, media_type
        body = _read_capped(response, MAX_MANIFEST_BYTES, self.cancelled)
        return "sha256:" + hashlib.sha256(body).hexdigest(), _media_type(response)

    def _explain_not_found(self, credentials: _Credentials) -> str:
        """A 404 HEAD says nothing more: the tag list tells a missing repository apart."""
        missing = (
            f"digest {self.image.digest}" if self.image.digest else f"tag {self.image.tag}"
        )
        try:
            response = self.session.get(
                f"{self.base_url}/v2/{self.image.repository}/tags/list",
                headers=credentials.headers,
                auth=credentials.auth,
                timeout=max(0.001, min(self.timeout, self._remaining())),
                stream=True,  # only the status is read
                verify=self.verify,
            )
            response.close()
        except requests.RequestException:
            response = None
        if response is not None and response.status_code == 404:
            return f"repository {self.image.repository} does not exist"
        if response is not None and response.status_code == 200:
            return f"{missing} does not exist in {self.image.repository}"
        return f"{missing} of {self.image.repository} not found"

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """Send with retries on 408, 429, 5xx, timeouts and connection errors, within the deadline.

        The body is not read (``stream=True``): callers read what they need, bounded.
        """
        target = urlsplit(url).netloc + urlsplit(url).path
        problem = ""
        for attempt in range(self.retries + 1):
            retry_after: float | None = None
            remaining = self._remaining()
            if remaining <= 0 or self.cancelled.is_set():
                raise _RetriesExhausted(
                    f"{problem + '; ' if problem else ''}no answer within the check's deadline "
                    f"of {self.deadline:g}s"
                )
            try:
                response = self.session.request(
                    method, url, stream=True, timeout=min(self.timeout, remaining), verify=self.verify, **kwargs
                )
            except requests.exceptions.SSLError:
                raise
            except requests.exceptions.Timeout:
                problem = f"{method} {target} timed out after {self.timeout:g}s"
            except requests.exceptions.ConnectionError:
                problem = f"cannot connect to {urlsplit(url).netloc}"
            else:
                if response.status_code not in RETRIABLE_STATUS:
                    return response
                problem = f"{method} {target} answered {response.status_code}"
                retry_after = _parse_retry_after(response.headers.get("Retry-After"))
                response.close()
            if attempt == self.retries:
                break
            delay = self.backoff * (2**attempt) if retry_after is None else retry_after
            delay = min(delay, self.max_backoff)
            if delay >= self._remaining():
                raise _RetriesExhausted(
                    f"{problem}; the next retry would pass the check's deadline of {self.deadline:g}s"
                )
            log.info(
                "image check: %s; retry %d/%d in %.2fs", problem, attempt + 1, self.retries, delay
            )
            time.sleep(delay)
        tries = self.retries + 1
        raise _RetriesExhausted(f"{problem} ({tries} {'try' if tries == 1 else 'tries'})")


def _content_length(response: requests.Response) -> int:
    try:
        return int(response.headers.get("Content-Length") or 0)
    except ValueError:
        return 0


def _read_capped(response: requests.Response, limit: int, cancelled: threading.Event) -> bytes:
    """The body, read in chunks and given up past ``limit`` bytes (or when the check is cancelled)."""
    if _content_length(response) > limit:
        response.close()
        raise _TooLarge(limit)
    body = bytearray()
    try:
        for chunk in response.iter_content(_READ_CHUNK):
            body += chunk
            if len(body) > limit or cancelled.is_set():
                raise _TooLarge(limit)
    finally:
        response.close()
    return bytes(body)


def _parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds, from delta-seconds or an HTTP date; None when absent."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


_CHALLENGE_PARAM = re.compile(r'([A-Za-z][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="…",service="…"`` -> ("bearer", {"realm": …, "service": …})."""
    header = header.strip()
    if not header:
        return "", {}
    scheme, _, rest = header.partition(" ")
    params = {
        match.group(1).lower(): (
            match.group(2).replace('\\"', '"') if match.group(2) is not None else match.group(3)
        )
        for match in _CHALLENGE_PARAM.finditer(rest)
    }
    return scheme.lower(), params
