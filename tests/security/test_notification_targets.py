"""A job's notifications go only through connections the operator lists or the person may read, and only to the
connection's own host (issue 44.2): the Object Storage connection as a webhook is refused at Create, at
validate_spec and by the end-of-run notifier, and its keys reach no listener.

The listener is a real HTTP server on loopback; it must receive nothing. The Create half runs in Airflow's own
API server app (the fixtures of tests/sat_tasks/ui/test_api.py).
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import copy
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID, build_job_dag
from sat_tasks.airflow.params import params_from_spec
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import JobStopped
from sat_tasks.io.notify_targets import endpoint_problem
from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.pipeline import steps
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE
from tests.sat_tasks.ui.test_api import _good_form, admin, app, client  # noqa: F401 (module-scoped fixtures)

RUNS = itertools.count(1)


class _Listener(BaseHTTPRequestHandler):
    def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.server.received.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    do_POST = do_GET = do_PUT = _any

    def log_message(self, *args):
        return


@pytest.fixture
def listener(monkeypatch):
    """A listener on loopback (what an attacker's host would be), and `sat_test_hook`: an http connection to it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("AIRFLOW_CONN_SAT_TEST_HOOK", server.url)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


class Person:
    """A person who triggered a run; `readable`: the connections the auth manager lets them read."""

    def __init__(self, readable=frozenset(), name="mallory"):
        self.name, self.readable = name, {*readable, BASE["image"].get("registry_conn_id")}

    def may_use_workspace(self, workspace):
        return True

    def may_use_connection(self, conn_id):
        return conn_id in self.readable


def _job(name, notifications):
    spec = copy.deepcopy(BASE)
    spec.update(name=name, results={"destination": "s3://sat-demo/results/"}, notifications=notifications)
    return parse_spec(spec)


def _validate(job, person):
    run_id = f"manual__targets-{next(RUNS)}"
    with pytest.raises(JobStopped) as caught:
        steps.validate_spec(job.to_dict(), None, run_id, log=lambda _line: None, spec_with_run=True,
                            dag_id=GENERIC_DAG_ID, person=person)
    return run_id, str(caught.value)


def _steal(listener):
    return [{"webhook": "sat_object_storage", "endpoint": f"{listener.url}/steal"}]


@pytest.mark.parametrize("endpoint", ["http://evil.example/x", "https:evil.example", "//evil.example/x",
                                      "@evil.example/x", "x@evil.example", "\\\\evil.example\\x", "/a\\b", "ftp://x"])
def test_an_endpoint_is_a_path_only(endpoint):
    assert endpoint_problem(endpoint) is not None


@pytest.mark.parametrize("endpoint", [None, "", "/hooks/sat", "hooks/sat?job=a", "/a:b/c"])
def test_a_plain_path_is_an_endpoint(endpoint):
    assert endpoint_problem(endpoint) is None


@pytest.mark.usefixtures("demo_bucket")
@pytest.mark.parametrize("person", [None, Person({"sat_object_storage", "sat_test_hook"})], ids=["no-person", "reader"])
def test_validate_spec_refuses_the_object_storage_connection_as_a_webhook(listener, person):
    run_id, reason = _validate(_job("steal-keys", _steal(listener)), person)
    assert "notifications.0.webhook: the connection sat_object_storage is not an http or https connection" in reason
    assert listener.received == []
    entries = JobRun(scoped(_job("steal-keys", []), GENERIC_DAG_ID), run_id).history(log=lambda _l: None).entries()
    assert entries[-1]["status"] == "Failed" and "notifications.0.webhook" in entries[-1]["reason"]


@pytest.mark.usefixtures("demo_bucket")
def test_the_end_of_run_notifier_sends_nothing_through_a_refused_connection(listener):
    job = _job("steal-on-end", _steal(listener))
    run_id = f"manual__targets-{next(RUNS)}"
    JobRun(job, run_id).history(log=lambda _line: None).record(JobStatus.FAILED, "refused", task="validate_spec")
    dag = build_job_dag(None, dag_id=GENERIC_DAG_ID)
    with pytest.raises(RuntimeError, match=r"notifications\.0\.webhook: the connection sat_object_storage"):
        dag.on_failure_callback[0]({"dag": dag, "run_id": run_id, "params": params_from_spec(job)})
    assert listener.received == []


@pytest.mark.usefixtures("demo_bucket")
@pytest.mark.parametrize("endpoint", ["@evil.example/steal", "//evil.example/steal", "http://evil.example/steal"])
def test_an_endpoint_off_the_connections_host_is_refused(listener, endpoint):
    _run_id, reason = _validate(_job("off-host", [{"webhook": "sat_test_hook", "endpoint": endpoint}]),
                                Person({"sat_test_hook"}))
    assert "notifications.0.endpoint: must be a path on the webhook connection's URL" in reason
    assert listener.received == []


@pytest.mark.usefixtures("demo_bucket")
def test_a_webhook_needs_a_listed_connection_or_one_the_person_may_read(listener, monkeypatch):
    job = _job("unreadable", [{"webhook": "sat_test_hook", "endpoint": "/hooks/sat"}])
    _run_id, reason = _validate(job, Person())
    assert ("notifications.0.webhook: mallory may not use the connection sat_test_hook (a webhook's connection is "
            "listed in [sat] notification_connections, or an http connection the person may read)") in reason
    monkeypatch.setenv("AIRFLOW__SAT__NOTIFICATION_CONNECTIONS", "sat_test_hook")
    checked = steps.validate_spec(job.to_dict(), None, f"manual__targets-{next(RUNS)}", log=lambda _line: None,
                                  spec_with_run=True, dag_id=GENERIC_DAG_ID, person=Person())
    assert checked["notifications"][0]["webhook"] == "sat_test_hook"


@pytest.mark.usefixtures("demo_bucket")
def test_smtp_connections_come_from_the_operators_list_only(listener, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", "smtp://mail.example:25")
    job = _job("mail-keys", [{"email": ["me@example.com"], "smtp_conn_id": "sat_object_storage"}])
    _run_id, reason = _validate(job, Person({"sat_object_storage"}))
    assert "notifications.0.smtp_conn_id: the connection sat_object_storage is not listed in [sat] " \
           "notification_connections" in reason
    monkeypatch.setenv("AIRFLOW__SAT__NOTIFICATION_CONNECTIONS", "smtp_default")
    ok = _job("mail-ok", [{"email": ["me@example.com"]}])
    steps.validate_spec(ok.to_dict(), None, f"manual__targets-{next(RUNS)}", log=lambda _line: None,
                        spec_with_run=True, dag_id=GENERIC_DAG_ID, person=Person())


def test_create_refuses_the_object_storage_connection_as_a_webhook_and_starts_nothing(client, admin, listener):
    advanced = {"notifications": [{"webhook": "sat_object_storage", "endpoint": f"{listener.url}/steal"}]}
    form = _good_form("steal-at-create", advanced=json.dumps(advanced))
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 422, response.text
    errors = {e["field"]: e["rule"] for e in response.json()["errors"]}
    assert errors["notifications.0.endpoint"] == ("must be a path on the webhook connection's URL, without a "
                                                   "scheme (http:, https:, ...)")
    assert errors["notifications.0.webhook"].startswith("the connection sat_object_storage is not an http or https")
    form = _good_form("steal-at-create", advanced=json.dumps({"notifications": [{"webhook": "sat_object_storage"}]}))
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["notifications.0.webhook"]
    assert "is not an http or https connection" in response.json()["errors"][0]["rule"]
    assert listener.received == []
