"""A plain-http (insecure) image check contacts only a registry the operator allows (issue 44.7): `[sat]
registry_hosts`, else loopback and the hosts of the shared registry connections. An `insecure: true` image probed
any host:port from the worker before.
"""

from __future__ import annotations

import copy
import itertools
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from sat_tasks.errors import JobStopped
from sat_tasks.io.registry import (
    ImageCheckInconclusive,
    operator_registry_hosts,
    plain_http_refusal,
)
from sat_tasks.pipeline import steps
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE
from tests.security.test_registry_bounds import stand_in  # noqa: F401 (the fixture)

RUNS = itertools.count(1)


def _answer_404(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(404)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _check(host: str):
    """check_image of a job whose own registry login names `host` over plain http."""
    spec = copy.deepcopy(BASE)
    spec.update(name="probe", results={"destination": "s3://sat-demo/results/"},
                image={"url": f"{host}/team/model:v1", "registry_conn_id": "sat_registry_probe", "insecure": True})
    job = parse_spec(spec)
    conn = SimpleNamespace(host=host, login=None, password=None, schema="http", extra_dejson={})
    return steps.check_image(job, f"manual__probe-{next(RUNS)}", log=lambda _line: None,
                             get_connection=lambda conn_id: conn)


@pytest.mark.usefixtures("demo_bucket")
def test_a_host_the_operator_does_not_list_is_never_contacted(stand_in, monkeypatch):  # noqa: F811
    listener = stand_in(_answer_404)
    monkeypatch.setenv("AIRFLOW__SAT__REGISTRY_HOSTS", "registry.example.com")
    with pytest.raises(JobStopped, match=r"image.url: the registry 127\.0\.0\.1:\d+ is not one a plain-http"):
        _check(listener.host)
    assert listener.seen == []


@pytest.mark.usefixtures("demo_bucket")
def test_loopback_is_allowed_when_the_operator_lists_none(stand_in, monkeypatch):  # noqa: F811
    listener = stand_in(_answer_404)
    monkeypatch.delenv("AIRFLOW__SAT__REGISTRY_HOSTS", raising=False)
    with pytest.raises(ImageCheckInconclusive):  # not a registry: unreachable, but it was allowed to ask
        _check(listener.host)
    assert listener.seen and listener.seen[0] == ("GET", "/v2/")


@pytest.mark.parametrize("ref,hosts,loopback,allowed", [
    ("10.0.0.5:2375/x/y:1", [], True, False),
    ("metadata.google.internal/x/y:1", ["registry.example.com"], False, False),
    ("10.0.0.5:2375/x/y:1", ["10.0.0.5"], False, True),
    ("10.0.0.5:2375/x/y:1", ["10.0.0.5:5000"], False, False),
    ("registry.example.com:5000/x/y:1", ["Registry.Example.com:5000"], False, True),
    ("localhost:5000/x/y:1", [], True, True),
    ("[::1]:5000/x/y:1", [], True, True),
    ("127.0.0.1:5000/x/y:1", ["registry.example.com"], False, False),
])
def test_the_allow_list(ref, hosts, loopback, allowed):
    assert (plain_http_refusal(ref, hosts, loopback) is None) is allowed


def test_the_default_is_loopback_and_the_shared_registry_connections(monkeypatch):
    monkeypatch.delenv("AIRFLOW__SAT__REGISTRY_HOSTS", raising=False)
    monkeypatch.setenv("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS", "team_robot")
    conns = {"team_robot": SimpleNamespace(host="https://registry.team.example:5000/")}
    assert operator_registry_hosts(lambda conn_id: conns[conn_id]) == (["registry.team.example:5000"], True)
    monkeypatch.setenv("AIRFLOW__SAT__REGISTRY_HOSTS", "a.example, b.example:5000")
    assert operator_registry_hosts(lambda conn_id: conns[conn_id]) == (["a.example", "b.example:5000"], False)
