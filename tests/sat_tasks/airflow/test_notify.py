"""Notifications of a job's end: the DAG's callbacks, Airflow's http/smtp notifiers, the job's own outcome.

The webhook is a real HTTP server on loopback (the http provider's notifier POSTs to it
through an Airflow connection); e-mail goes to a double of the smtp provider's notifier,
which would reach a mail server.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID, build_job_dag
from sat_tasks.airflow.notify import JobEndNotifier
from sat_tasks.airflow.params import params_from_spec
from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

RUNS = itertools.count(1)
NOTIFICATIONS = [{"webhook": "sat_test_hook", "endpoint": "/hooks/sat", "on": ["failed", "pending", "stopped"]},
                 {"email": ["ml-team@example.com"], "on": ["completed"]}]


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received.append((self.path, self.headers.get("Content-Type"), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        return


@pytest.fixture
def webhook(monkeypatch):
    """A webhook on loopback, reachable as the Airflow HTTP connection `sat_test_hook`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIRFLOW_CONN_SAT_TEST_HOOK", f"http://127.0.0.1:{server.server_address[1]}")
    yield server.received
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def mails(monkeypatch):
    """What the smtp provider's notifier was asked to send (it would reach a mail server)."""
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", "smtp://mail.example:25")
    monkeypatch.setenv("AIRFLOW__SAT__NOTIFICATION_CONNECTIONS", "smtp_default")  # the operator's list (issue 44.2)
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    sent = []
    monkeypatch.setattr(SmtpNotifier, "notify", lambda self, context: sent.append(
        (self.to, self.subject, self.html_content, self.smtp_conn_id)))
    return sent


def _job(name: str, notifications=NOTIFICATIONS):
    spec = copy.deepcopy(BASE)
    spec.update(name=name, results={"destination": "s3://sat-demo/results/"}, notifications=notifications)
    return parse_spec(spec)


def _ended(job, status: JobStatus, reason: str) -> str:
    run_id = f"manual__notify-{next(RUNS)}"
    JobRun(job, run_id).history(log=lambda _line: None).record(status, reason, task="finalize")
    return run_id


def test_a_spec_with_notifications_builds_a_dag_with_both_end_callbacks():
    dag = build_job_dag(_job("notify-dag"), dag_id="notify-dag")
    for callbacks, succeeded in ((dag.on_success_callback, True), (dag.on_failure_callback, False)):
        (notifier,) = callbacks
        assert isinstance(notifier, JobEndNotifier) and notifier.succeeded is succeeded
    quiet = build_job_dag(_job("quiet-dag", notifications=[]), dag_id="quiet-dag")
    assert not quiet.on_success_callback and not quiet.on_failure_callback
    generic = build_job_dag(None, dag_id=GENERIC_DAG_ID)  # its runs carry their spec: it always listens
    assert [type(c) for c in generic.on_failure_callback] == [JobEndNotifier]


@pytest.mark.usefixtures("demo_bucket")
def test_a_failed_job_posts_its_outcome_to_the_webhook_and_sends_no_mail(webhook, mails):
    job = _job("notify-failed")
    dag = build_job_dag(job, dag_id="notify-failed")
    run_id = _ended(job, JobStatus.MAX_RETRIES_EXCEEDED, "hardware fault on node-1 after 3 failovers (max 3)")
    dag.on_failure_callback[0]({"dag": dag, "run_id": run_id, "reason": "task_failure"})
    ((path, content_type, body),) = webhook
    assert path == "/hooks/sat" and content_type == "application/json"
    assert body["status"] == "Pending - maxretriesexceeded" and body["job"] == "notify-failed"
    assert body["run_id"] == run_id and body["reason"].startswith("hardware fault on node-1")
    assert body["page"] == f"/sat/jobs/notify-failed/runs/{run_id}"
    assert mails == []  # the e-mail is for completed runs only


@pytest.mark.usefixtures("demo_bucket")
def test_a_completed_job_of_the_generic_dag_mails_from_its_runs_spec(webhook, mails):
    job = _job("notify-done")
    dag = build_job_dag(None, dag_id=GENERIC_DAG_ID)
    run_id = _ended(job, JobStatus.COMPLETED, "training completed; results uploaded")
    dag.on_success_callback[0]({"dag": dag, "run_id": run_id, "params": params_from_spec(job)})
    ((to, subject, content, conn_id),) = mails
    assert to == ["ml-team@example.com"] and subject == "[SAT] Training Job notify-done Completed"
    assert "training completed; results uploaded" in content and conn_id == "smtp_default"
    assert webhook == []


@pytest.mark.usefixtures("demo_bucket")
def test_a_job_reason_is_sent_as_data_never_rendered_as_a_template(webhook):
    job = _job("notify-template")
    dag = build_job_dag(job, dag_id="notify-template")
    run_id = _ended(job, JobStatus.INTERNAL_ERROR, "Traceback: {{ conn.sat_test_hook.password }} {% raw %}")
    dag.on_failure_callback[0]({"dag": dag, "run_id": run_id})
    assert webhook[0][2]["reason"] == "Traceback: {{ conn.sat_test_hook.password }} {% raw %}"


@pytest.mark.usefixtures("demo_bucket")
def test_a_run_that_ended_before_the_job_said_how_is_notified_as_failed(webhook):
    job = _job("notify-early")
    dag = build_job_dag(job, dag_id="notify-early")
    run_id = _ended(job, JobStatus.RUNNING, "attempt 1 started")
    dag.on_failure_callback[0]({"dag": dag, "run_id": run_id, "reason": "task_failure"})
    assert [(b["status"], b["reason"]) for _p, _c, b in webhook] == [("Failed", "task_failure")]
