"""SAT's S3Hook: one per process and connection content, and no stack walk for the User-Agent."""

from __future__ import annotations

import inspect
import json

import pytest

from sat_tasks.io import object_storage_hook as shared
from sat_tasks.io.object_storage import object_storage_hook

CONN_ID = "sat_hook_share_test"


def _connection(monkeypatch, key: str, port: int = 9) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "aws", "login": key, "password": "secret-" + key,
        "extra": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}))


@pytest.fixture(autouse=True)
def _fresh():
    shared.forget_hooks()
    yield
    shared.forget_hooks()


def test_one_hook_per_connection_content_and_a_new_one_when_it_changes(monkeypatch):
    _connection(monkeypatch, "alice")
    first = object_storage_hook(CONN_ID)
    assert object_storage_hook(CONN_ID) is first
    assert first.get_conn() is object_storage_hook(CONN_ID).get_conn()  # one client
    _connection(monkeypatch, "alice-rotated")  # the key rotated: a new hook with the new key
    rotated = object_storage_hook(CONN_ID)
    assert rotated is not first
    assert rotated.get_conn()._request_signer._credentials.access_key == "alice-rotated"
    _connection(monkeypatch, "alice-rotated", port=10)  # another endpoint, same key
    assert object_storage_hook(CONN_ID) is not rotated


def test_a_connection_that_cannot_be_read_gets_a_fresh_hook_each_time(monkeypatch):
    monkeypatch.delenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", raising=False)
    assert shared.connection_fingerprint(CONN_ID) is None
    assert object_storage_hook(CONN_ID) is not object_storage_hook(CONN_ID)


def test_the_oldest_connections_hook_is_dropped_past_the_bound(monkeypatch):
    hooks = []
    for n in range(shared.MAX_KEPT + 1):
        _connection(monkeypatch, f"key{n}")
        hooks.append(object_storage_hook(CONN_ID))
    _connection(monkeypatch, "key0")
    assert object_storage_hook(CONN_ID) is not hooks[0]  # dropped: made again
    _connection(monkeypatch, f"key{shared.MAX_KEPT}")
    assert object_storage_hook(CONN_ID) is hooks[-1]  # still kept


def test_the_client_names_sat_as_its_caller_without_walking_the_stack(monkeypatch):
    _connection(monkeypatch, "bob")
    walks = []
    real_stack = inspect.stack
    monkeypatch.setattr(inspect, "stack", lambda *a, **k: walks.append(1) or real_stack(*a, **k))
    client = object_storage_hook(CONN_ID).get_conn()
    assert "Caller/SAT" in client.meta.config.user_agent_extra
    assert walks == []
    assert "secret-bob" not in client.meta.config.user_agent_extra
