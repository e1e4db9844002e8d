"""Tests of sat_tasks.registry against a real docker-registry and a scripted stub server."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from sat_tasks.io.registry import (
    MANIFEST_MEDIA_TYPES,
    ImageCheckOutcome,
    ImageReference,
    MalformedReference,
    RegistryAccess,
    check_image,
    parse_image_reference,
    registry_access_from_connection,
)
from tests.support.registry_server import (
    RegistryServer,
    free_port,
    push_test_image,
    start_registry,
)

USER = "trainer"
PASSWORD = "S3cr3t-pa55word-never-logged"
UTF8_USER, UTF8_PASSWORD = "jürgen", "pässwörd-€"
FAST = {"retries": 2, "backoff": 0.01, "max_backoff": 0.05, "timeout": 2}
DIGEST_A = "sha256:" + "a" * 64
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


# ---------------------------------------------------------------- real registry


@dataclass
class PushedImages:
    server: RegistryServer
    by_tag: str  # digest of team/model:v1 (OCI image manifest)
    index: str  # digest of team/model:multi (OCI image index)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PushedImages]:
    users = {USER: PASSWORD, UTF8_USER: UTF8_PASSWORD}
    with start_registry(tmp_path_factory.mktemp("registry"), users=users) as server:
        yield PushedImages(
            server=server,
            by_tag=push_test_image(server, "team/model", "v1", USER, PASSWORD),
            index=push_test_image(server, "team/model", "multi", USER, PASSWORD, index=True),
        )


def check_local(registry: PushedImages, path: str, **kwargs) -> object:
    options = {"username": USER, "password": PASSWORD, "insecure": True, **FAST, **kwargs}
    return check_image(f"{registry.server.host}/{path}", **options)


def test_ok_by_tag(registry: PushedImages) -> None:
    result = check_local(registry, "team/model:v1")
    assert result.outcome is ImageCheckOutcome.OK
    assert result.digest == registry.by_tag
    assert result.media_type == OCI_MANIFEST
    assert not result.pulls_fail
    assert registry.by_tag in result.message


def test_ok_by_tag_of_an_index(registry: PushedImages) -> None:
    result = check_local(registry, "team/model:multi")
    assert result.outcome is ImageCheckOutcome.OK
    assert (result.digest, result.media_type) == (registry.index, OCI_INDEX)


def test_ok_with_non_ascii_credentials(registry: PushedImages) -> None:
    result = check_local(registry, "team/model:v1", username=UTF8_USER, password=UTF8_PASSWORD)
    assert result.outcome is ImageCheckOutcome.OK


def test_ok_by_digest(registry: PushedImages) -> None:
    result = check_local(registry, f"team/model@{registry.by_tag}")
    assert result.outcome is ImageCheckOutcome.OK
    assert result.digest == registry.by_tag


@pytest.mark.parametrize(
    ("credentials", "expected_text"),
    [
        pytest.param({"password": "wrong"}, "rejected the credentials", id="wrong-password"),
        pytest.param({"username": "nobody"}, "rejected the credentials", id="unknown-user"),
        pytest.param(
            {"username": None, "password": None}, "none were given", id="no-credentials"
        ),
    ],
)
def test_unauthorized(registry: PushedImages, credentials: dict, expected_text: str) -> None:
    result = check_local(registry, "team/model:v1", **credentials)
    assert result.outcome is ImageCheckOutcome.UNAUTHORIZED
    assert expected_text in result.message
    assert result.pulls_fail


@pytest.mark.parametrize(
    ("path", "expected_text"),
    [
        pytest.param("team/model:v2", "tag v2 does not exist in team/model", id="missing-tag"),
        pytest.param(f"team/model@{DIGEST_A}", f"digest {DIGEST_A}", id="missing-digest"),
        pytest.param("team/absent:v1", "repository team/absent does not exist", id="missing-repo"),
    ],
)
def test_not_found(registry: PushedImages, path: str, expected_text: str) -> None:
    result = check_local(registry, path)
    assert result.outcome is ImageCheckOutcome.NOT_FOUND
    assert expected_text in result.message
    assert result.pulls_fail


def test_plain_http_registry_needs_insecure(registry: PushedImages) -> None:
    result = check_local(registry, "team/model:v1", insecure=False)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert "insecure=True" in result.message
    assert not result.pulls_fail


def test_unreachable_port_is_retried_then_unreachable() -> None:
    started = time.monotonic()
    result = check_image(f"127.0.0.1:{free_port()}/team/model:v1", insecure=True, **FAST)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert "cannot connect" in result.message and "3 tries" in result.message
    assert not result.pulls_fail
    assert time.monotonic() - started < 30  # FAST backoffs; the default ones would take minutes


def test_no_password_in_logs_results_or_reprs(
    registry: PushedImages, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # urllib3's request lines too
    results = [
        check_local(registry, "team/model:v1"),
        check_local(registry, "team/model:v2"),
        check_local(registry, "team/model:v1", password=PASSWORD + "-wrong"),
        check_image(f"{USER}:{PASSWORD}@{registry.server.host}/x", password=PASSWORD),
    ]
    assert results[-1].outcome is ImageCheckOutcome.MALFORMED
    with pytest.raises(MalformedReference, match="carries credentials") as raised:
        parse_image_reference(f"{USER}:{PASSWORD}@{registry.server.host}/team/model:v1")
    texts = [caplog.text, str(raised.value), repr(raised.value)]
    texts += [repr(r) + str(r) + json.dumps(r.to_dict()) for r in results]
    access = RegistryAccess(username=USER, password=PASSWORD, insecure=True)
    texts.append(repr(access) + str(access))
    for text in texts:
        assert PASSWORD not in text


# ---------------------------------------------------------------- scripted stub


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


Route = Callable[[Seen], Reply]


class StubRegistry:
    """A tiny HTTP server on 127.0.0.1: ``(method, path)`` routes to scripted replies.

    A route is a callable or a list of replies consumed in order (the last one repeats).
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[tuple[str, str], Route | list[Reply]] = {}
        self.seen: list[Seen] = []
        self.api_version_header = True
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                seen = Seen(
                    self.command, parts.path, parse_qs(parts.query), dict(self.headers.items())
                )
                stub.seen.append(seen)
                reply = stub._reply(seen)
                time.sleep(reply.delay)
                try:
                    self.send_response(reply.status)
                    if stub.api_version_header:  # as every distribution-API answer carries it
                        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def _reply(self, seen: Seen) -> Reply:
        route = self.routes.get((seen.method, seen.path))
        if route is None:
            return Reply(404, {"Content-Type": "application/json"}, b'{"errors":[]}')
        if callable(route):
            return route(seen)
        return route.pop(0) if len(route) > 1 else route[0]

    def count(self, method: str, path: str) -> int:
        return sum(1 for s in self.seen if (s.method, s.path) == (method, path))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


MANIFEST_PATH = "/v2/team/model/manifests/v1"
MANIFEST_OK = Reply(200, {"Docker-Content-Digest": DIGEST_A, "Content-Type": OCI_MANIFEST})


@pytest.fixture
def stub() -> Iterator[StubRegistry]:
    server = StubRegistry()
    server.routes[("GET", "/v2/")] = [Reply(200)]
    yield server
    server.stop()


def check_stub(stub: StubRegistry, **kwargs) -> object:
    return check_image(f"{stub.host}/team/model:v1", insecure=True, **{**FAST, **kwargs})


def test_manifest_head_accepts_docker_and_oci_media_types(stub: StubRegistry) -> None:
    stub.routes[("HEAD", MANIFEST_PATH)] = [MANIFEST_OK]
    assert check_stub(stub).outcome is ImageCheckOutcome.OK
    accept = next(s for s in stub.seen if s.method == "HEAD").headers["Accept"]
    assert set(MANIFEST_MEDIA_TYPES) <= {t.strip() for t in accept.split(",")}
    assert len(MANIFEST_MEDIA_TYPES) == 4


@pytest.mark.parametrize(
    "retry_after",
    [
        pytest.param({}, id="no-retry-after"),
        pytest.param({"Retry-After": "0"}, id="retry-after-seconds"),
        pytest.param({"Retry-After": "3600"}, id="retry-after-capped"),
        pytest.param({"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"}, id="retry-after-date"),
    ],
)
def test_rate_limit_then_ok_is_retried(stub: StubRegistry, retry_after: dict) -> None:
    stub.routes[("HEAD", MANIFEST_PATH)] = [Reply(429, retry_after), MANIFEST_OK]
    started = time.monotonic()
    result = check_stub(stub)
    assert result.outcome is ImageCheckOutcome.OK
    assert stub.count("HEAD", MANIFEST_PATH) == 2
    assert time.monotonic() - started < 60  # a long Retry-After (3600 s, 2099) is capped by max_backoff


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(429), id="rate-limited"),
        pytest.param(Reply(503), id="unavailable"),
        pytest.param(Reply(500), id="server-error"),
        pytest.param(Reply(200, delay=0.5), id="timeout"),
    ],
)
def test_persistent_transient_failure_is_unreachable_not_a_bad_image(
    stub: StubRegistry, reply: Reply
) -> None:
    stub.routes[("HEAD", MANIFEST_PATH)] = [reply]
    result = check_stub(stub, timeout=0.2)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert not result.pulls_fail
    assert stub.count("HEAD", MANIFEST_PATH) == FAST["retries"] + 1


def test_ping_answered_with_404_is_not_a_registry(stub: StubRegistry) -> None:
    stub.routes[("GET", "/v2/")] = [Reply(404)]
    result = check_stub(stub)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert "not an OCI distribution registry" in result.message


def test_missing_digest_header_is_computed_from_the_manifest(stub: StubRegistry) -> None:
    body = b'{"schemaVersion":2}'
    stub.routes[("HEAD", MANIFEST_PATH)] = [Reply(200, {"Content-Type": OCI_MANIFEST})]
    stub.routes[("GET", MANIFEST_PATH)] = [Reply(200, {"Content-Type": OCI_MANIFEST}, body)]
    result = check_stub(stub)
    assert result.outcome is ImageCheckOutcome.OK
    assert result.digest == "sha256:" + hashlib.sha256(body).hexdigest()


def test_open_ping_then_basic_challenge_on_the_repository(stub: StubRegistry) -> None:
    def manifest(seen: Seen) -> Reply:
        if seen.headers.get("Authorization") == _basic(USER, PASSWORD):
            return MANIFEST_OK
        return Reply(401, {"WWW-Authenticate": 'Basic realm="repo"'})

    def ping(seen: Seen) -> Reply:
        authorized = seen.headers.get("Authorization") == _basic(USER, PASSWORD)
        return Reply(200) if authorized or "Authorization" not in seen.headers else Reply(401)

    stub.routes[("GET", "/v2/")] = ping
    stub.routes[("HEAD", MANIFEST_PATH)] = manifest
    assert check_stub(stub, username=USER, password=PASSWORD).outcome is ImageCheckOutcome.OK


# ---------------------------------------------------------------- Bearer token flow

TOKEN = "tok-granted-to-trainer"


@pytest.fixture
def bearer_stub(stub: StubRegistry) -> StubRegistry:
    """Registry and token service on one stub: a token only for the right Basic login."""
    challenge = f'Bearer realm="{stub.url}/token",service="stub-registry"'

    def token(seen: Seen) -> Reply:
        auth = seen.headers.get("Authorization")
        if auth is None:
            return Reply(200, {"Content-Type": "application/json"}, b'{"token":"anonymous"}')
        if auth != _basic(USER, PASSWORD):
            return Reply(401, {"Content-Type": "application/json"}, b'{"details":"bad login"}')
        body = json.dumps({"access_token": TOKEN, "expires_in": 300}).encode()
        return Reply(200, {"Content-Type": "application/json"}, body)

    def manifest(seen: Seen) -> Reply:
        if seen.headers.get("Authorization") == f"Bearer {TOKEN}":
            return MANIFEST_OK
        return Reply(401, {"WWW-Authenticate": challenge + ',error="insufficient_scope"'})

    stub.routes[("GET", "/v2/")] = [Reply(401, {"WWW-Authenticate": challenge})]
    stub.routes[("GET", "/token")] = token
    stub.routes[("HEAD", MANIFEST_PATH)] = manifest
    return stub


def test_bearer_token_flow_ok(bearer_stub: StubRegistry, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    result = check_stub(bearer_stub, username=USER, password=PASSWORD)
    assert result.outcome is ImageCheckOutcome.OK
    assert result.digest == DIGEST_A
    token_request = next(s for s in bearer_stub.seen if s.path == "/token")
    assert token_request.query == {
        "scope": ["repository:team/model:pull"],
        "service": ["stub-registry"],
    }
    assert token_request.headers["Authorization"] == _basic(USER, PASSWORD)
    assert TOKEN not in caplog.text + repr(result) and PASSWORD not in caplog.text


@pytest.mark.parametrize(
    ("credentials", "expected_text"),
    [
        pytest.param({"username": USER, "password": "wrong"}, "refused user", id="wrong-password"),
        pytest.param({}, "anonymous access may not pull", id="anonymous-token-no-access"),
    ],
)
def test_bearer_token_flow_unauthorized(
    bearer_stub: StubRegistry, credentials: dict, expected_text: str
) -> None:
    result = check_stub(bearer_stub, **credentials)
    assert result.outcome is ImageCheckOutcome.UNAUTHORIZED
    assert expected_text in result.message
    assert result.pulls_fail
    assert bearer_stub.count("GET", "/token") == 1


def test_bearer_token_service_down_is_unreachable(bearer_stub: StubRegistry) -> None:
    bearer_stub.routes[("GET", "/token")] = [Reply(503)]
    result = check_stub(bearer_stub, username=USER, password=PASSWORD)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert bearer_stub.count("GET", "/token") == FAST["retries"] + 1


@pytest.fixture
def tls_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StubRegistry]:
    """An https stub whose self-signed certificate requests trusts via REQUESTS_CA_BUNDLE."""
    cert, key = _self_signed_certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    server = StubRegistry(tls=context)
    server.routes[("GET", "/v2/")] = [Reply(200)]
    yield server
    server.stop()


def test_https_is_the_default(tls_stub: StubRegistry) -> None:
    tls_stub.routes[("HEAD", MANIFEST_PATH)] = [MANIFEST_OK]
    result = check_image(f"{tls_stub.host}/team/model:v1", **FAST)
    assert result.outcome is ImageCheckOutcome.OK


def test_no_credentials_to_a_plain_http_realm_of_an_https_registry(
    tls_stub: StubRegistry, stub: StubRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    challenge = f'Bearer realm="{stub.url}/token",service="s"'
    tls_stub.routes[("GET", "/v2/")] = [Reply(401, {"WWW-Authenticate": challenge})]
    tls_stub.routes[("HEAD", MANIFEST_PATH)] = [Reply(401, {"WWW-Authenticate": challenge})]
    stub.routes[("GET", "/token")] = [Reply(200, {}, b'{"token":"anonymous"}')]
    ref = f"{tls_stub.host}/team/model:v1"
    result = check_image(ref, username=USER, password=PASSWORD, **FAST)
    assert result.outcome is ImageCheckOutcome.UNAUTHORIZED
    token_request = next(s for s in stub.seen if s.path == "/token")
    assert "Authorization" not in token_request.headers
    assert "not sending credentials" in caplog.text


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# ---------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        pytest.param("ubuntu", ("docker.io", "library/ubuntu", "latest", None), id="hub-official"),
        pytest.param("org/img:1.0", ("docker.io", "org/img", "1.0", None), id="hub-user"),
        pytest.param(
            "docker.io/library/ubuntu:22.04",
            ("docker.io", "library/ubuntu", "22.04", None),
            id="hub-explicit",
        ),
        pytest.param(
            "localhost:5000/a/b/c:v", ("localhost:5000", "a/b/c", "v", None), id="host-port"
        ),
        pytest.param("localhost/x", ("localhost", "x", "latest", None), id="localhost"),
        pytest.param(
            f"ghcr.io/o/r@{DIGEST_A}", ("ghcr.io", "o/r", None, DIGEST_A), id="digest"
        ),
        pytest.param(
            f"nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST_A}",
            ("nvcr.io", "nvidia/pytorch", "24.05-py3", DIGEST_A),
            id="tag-and-digest",
        ),
        pytest.param("[::1]:5000/x:t", ("[::1]:5000", "x", "t", None), id="ipv6"),
        pytest.param(
            "team/a.b_c__d-e/f---g:T_1",
            ("docker.io", "team/a.b_c__d-e/f---g", "T_1", None),
            id="separators",
        ),
    ],
)
def test_parse_image_reference(ref: str, expected: tuple) -> None:
    image = parse_image_reference(ref)
    assert (image.registry, image.repository, image.tag, image.digest) == expected
    assert image.manifest_reference == (expected[3] or expected[2])


def test_docker_hub_api_host() -> None:
    assert parse_image_reference("ubuntu").api_host == "registry-1.docker.io"
    assert parse_image_reference("r.example.com:443/x").api_host == "r.example.com:443"
    assert str(parse_image_reference("ubuntu")) == "docker.io/library/ubuntu:latest"


@pytest.mark.parametrize(
    ("ref", "rule"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("ubuntu latest", "whitespace", id="whitespace"),
        pytest.param("https://r.io/x", "URL scheme", id="scheme"),
        pytest.param("Team/Model", "lowercase", id="uppercase"),
        pytest.param("r.io/team/Model:v1", "lowercase", id="uppercase-path"),
        pytest.param("x:-v1", "tag", id="tag-leading-dash"),
        pytest.param("x:" + "v" * 129, "tag", id="tag-too-long"),
        pytest.param("x@sha256:abc", "digest", id="short-digest"),
        pytest.param("x@sha256:" + "A" * 64, "64 lowercase hex", id="uppercase-digest"),
        pytest.param("x@", "digest", id="empty-digest"),
        pytest.param("r.io/", "no repository", id="no-repository"),
        pytest.param(":v1", "no repository", id="only-tag"),
        pytest.param("a//b", "empty path component", id="empty-component"),
        pytest.param("team/../x", "path component", id="dot-dot"),
        pytest.param("team/-x", "path component", id="leading-dash"),
        pytest.param("r_io:5000/x", "registry host", id="bad-host"),
        pytest.param("a" * 256, "longer than 255", id="name-too-long"),
    ],
)
def test_malformed_reference(ref: str, rule: str) -> None:
    with pytest.raises(MalformedReference, match=rule):
        parse_image_reference(ref)
    result = check_image(ref)
    assert result.outcome is ImageCheckOutcome.MALFORMED
    assert rule in result.message and "\n" not in result.message
    assert result.pulls_fail


# ---------------------------------------------------------------- results, connections


def test_result_to_dict_is_json() -> None:
    result = check_image("Bad/Ref")
    assert json.loads(json.dumps(result.to_dict())) == {
        "outcome": "malformed",
        "reference": "Bad/Ref",
        "message": result.message,
        "digest": None,
        "media_type": None,
        "status_code": None,
        "pulls_fail": True,
    }


@pytest.mark.parametrize(
    ("conn", "expected"),
    [
        pytest.param(
            SimpleNamespace(
                host="r.example.com", login="u", password="p", schema="", extra_dejson={}
            ),
            RegistryAccess("u", "p", insecure=False),
            id="https-by-default",
        ),
        pytest.param(
            SimpleNamespace(host="http://r.example.com/", login="u", password="p"),
            RegistryAccess("u", "p", insecure=True),
            id="http-url-host",
        ),
        pytest.param(
            SimpleNamespace(
                host="r.example.com", login="u", password="p", extra_dejson={"insecure": "true"}
            ),
            RegistryAccess("u", "p", insecure=True),
            id="insecure-extra",
        ),
        pytest.param(
            SimpleNamespace(host="other.example.com", login="u", password="p", schema="http"),
            RegistryAccess(),
            id="other-registry-gets-no-credentials",
        ),
        pytest.param(
            SimpleNamespace(host="https://r.example.com/v2/", login="u", password="p"),
            RegistryAccess("u", "p", insecure=False),
            id="url-with-path",
        ),
    ],
)
def test_registry_access_from_connection(conn: SimpleNamespace, expected: RegistryAccess) -> None:
    assert registry_access_from_connection(conn, "r.example.com/team/model:v1") == expected


def test_docker_hub_connection_matches_docker_hub_images() -> None:
    conn = SimpleNamespace(host="index.docker.io", login="u", password="p")
    assert registry_access_from_connection(conn, "ubuntu") == RegistryAccess("u", "p")


def test_image_reference_is_a_value() -> None:
    assert parse_image_reference("ubuntu") == ImageReference(
        "docker.io", "library/ubuntu", "latest", None
    )
