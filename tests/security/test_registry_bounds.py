"""The image check does bounded work for an untrusted registry (issue 29.8): one deadline for the whole
check, a capped manifest read, and `/v2/` must answer as the distribution API does.

The stand-ins are tiny HTTP servers on 127.0.0.1 (threads that stop with the test); the real
registry's answers are covered in tests/sat_tasks/io/test_registry.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sat_tasks.io.registry import MAX_MANIFEST_BYTES, ImageCheckOutcome, check_image
from tests.support.registry_server import push_test_image, start_registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
API_HEADER = ("Docker-Distribution-API-Version", "registry/2.0")
MANIFEST = "/v2/team/model/manifests/v1"
HUGE = 300 << 20  # what a hostile registry claims or streams


class StandIn:
    """A loopback HTTP server whose handler is `serve(handler)`; records (method, path) and bytes sent."""

    def __init__(self, serve: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.seen: list[tuple[str, str]] = []
        self.sent = 0
        self.stop_event = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # close-delimited bodies, no keep-alive

            def _any(self) -> None:
                stand_in.seen.append((self.command, self.path))
                try:
                    serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)
        self.sent += len(data)

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[Callable[[Callable], StandIn]]:
    servers: list[StandIn] = []

    def start(serve: Callable[[BaseHTTPRequestHandler], None]) -> StandIn:
        servers.append(StandIn(serve))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _check(host: str, **kwargs):
    options = {"insecure": True, "timeout": 2, "retries": 2, "backoff": 0.01, "max_backoff": 0.05, **kwargs}
    return check_image(f"{host}/team/model:v1", **options)


def test_a_slow_drip_answer_ends_at_the_checks_deadline(stand_in) -> None:
    """Each byte comes within the read timeout, so only a deadline for the whole check ends it."""
    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        for _ in range(600):  # 30 s of drip at most; the test ends it much sooner
            if server.stop_event.wait(0.05):
                return
            handler.wfile.write(b"a")
            handler.wfile.flush()

    server = stand_in(drip)
    started = time.monotonic()
    result = _check(server.host, timeout=0.5, deadline=1.0)
    elapsed = time.monotonic() - started
    assert result.outcome is ImageCheckOutcome.UNREACHABLE and not result.pulls_fail
    assert "deadline of 1s" in result.message
    assert elapsed < 5, elapsed  # without the deadline: the 30 s of drip


def test_retries_and_backoff_stay_within_the_deadline(stand_in) -> None:
    def unavailable(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(503)
        handler.send_header(*API_HEADER)
        handler.send_header("Retry-After", "2")
        handler.end_headers()

    server = stand_in(unavailable)
    started = time.monotonic()
    result = _check(server.host, retries=10, max_backoff=2, deadline=1.0)
    assert time.monotonic() - started < 1.5
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert "deadline of 1s" in result.message
    assert len(server.seen) == 1  # the 2 s Retry-After would pass the deadline: no second try


def test_a_plain_web_server_is_not_a_registry(stand_in) -> None:
    def web(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/html")
        handler.end_headers()
        if handler.command == "GET":
            stand_in_server.write(handler, b"<html><body>It works!</body></html>")

    stand_in_server = stand_in(web)
    result = _check(stand_in_server.host)
    assert result.outcome is ImageCheckOutcome.UNREACHABLE
    assert "not an OCI distribution registry" in result.message
    assert stand_in_server.seen == [("GET", "/v2/")]  # no manifest request, no credentials sent anywhere


@pytest.mark.parametrize("ping", [
    pytest.param((200, [API_HEADER], b"{}"), id="open-with-api-header"),
    pytest.param((401, [("WWW-Authenticate", 'Basic realm="r"')],
                  b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'),
                 id="challenge-with-oci-error-body"),
])
def test_a_registry_answer_is_the_api_header_or_an_oci_error_body(stand_in, ping) -> None:
    status, headers, body = ping

    def registry(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/v2/":
            handler.send_response(status)
            for header in headers:
                handler.send_header(*header)
            handler.end_headers()
            stand_in_server.write(handler, body)
        else:
            handler.send_response(404)
            handler.end_headers()

    stand_in_server = stand_in(registry)
    result = _check(stand_in_server.host)
    assert "not an OCI distribution registry" not in result.message
    assert result.outcome in (ImageCheckOutcome.NOT_FOUND, ImageCheckOutcome.UNAUTHORIZED)


@pytest.mark.parametrize("length_header", [pytest.param(True, id="content-length"),
                                           pytest.param(False, id="close-delimited")])
def test_a_manifest_over_the_limit_is_refused_without_reading_it_whole(stand_in, length_header) -> None:
    """HEAD without a digest makes the check GET the manifest to hash it: a 300 MiB one is refused."""
    def huge_manifest(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header(*API_HEADER)
        if handler.path == "/v2/":
            handler.end_headers()
            return
        handler.send_header("Content-Type", OCI_MANIFEST)
        if length_header and handler.command == "GET":
            handler.send_header("Content-Length", str(HUGE))
        handler.end_headers()
        if handler.command == "GET":
            chunk = b"{" * (1 << 20)
            for _ in range(HUGE // len(chunk)):
                if server.stop_event.is_set():
                    return
                server.write(handler, chunk)

    server = stand_in(huge_manifest)
    result = _check(server.host)
    assert result.outcome is ImageCheckOutcome.MALFORMED and result.pulls_fail
    assert f"larger than {MAX_MANIFEST_BYTES >> 20} MiB" in result.message
    assert ("GET", MANIFEST) in server.seen
    assert server.sent < 4 * MAX_MANIFEST_BYTES  # the client stopped reading (socket buffers hold a little)


def test_a_head_that_announces_a_huge_manifest_is_refused_before_any_get(stand_in) -> None:
    def announced(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header(*API_HEADER)
        if handler.path != "/v2/":
            handler.send_header("Content-Type", OCI_MANIFEST)
            handler.send_header("Content-Length", str(HUGE))
        handler.end_headers()

    server = stand_in(announced)
    result = _check(server.host)
    assert result.outcome is ImageCheckOutcome.MALFORMED
    assert ("GET", MANIFEST) not in server.seen


def test_the_real_registry_passes_the_api_check_within_a_short_deadline(tmp_path) -> None:
    with start_registry(tmp_path, users={"u": "p"}) as server:
        digest = push_test_image(server, "team/model", "v1", "u", "p")
        result = _check(server.host, username="u", password="p", deadline=10)
    assert result.outcome is ImageCheckOutcome.OK and result.digest == digest


def test_the_check_image_task_has_an_execution_timeout_above_the_checks_deadline() -> None:
    from datetime import timedelta

    from sat_tasks.airflow.dag_factory import build_job_dag
    from sat_tasks.io.registry import DEFAULT_DEADLINE
    from sat_tasks.spec import load_spec
    from tests.conftest import ROOT

    job = load_spec(ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
    timeout = build_job_dag(job, dag_id=job.name).get_task("check_image").execution_timeout
    assert timeout is not None and timedelta(seconds=DEFAULT_DEADLINE) < timeout <= timedelta(minutes=10)
