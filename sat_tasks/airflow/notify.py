"""Notifications of a job's end (`notifications:` in the spec) through Airflow's notifiers, as the DAG's callbacks.

`job_end_callbacks(job)` gives `build_job_dag` the DAG's `on_success_callback` and
`on_failure_callback`: one `JobEndNotifier`, which Airflow calls (in the DAG processor) when
the run ends either way. It reads the job's own outcome (the last status of the run's status
history: Completed, Failed, a Pending - * word, Stopped), not the DAG run's state, and hands
it to the provider notifier of each notification that wants that end: the http provider's
`HttpNotifier` (a JSON POST to an Airflow HTTP connection) or the smtp provider's
`SmtpNotifier` (through an SMTP connection). URLs, tokens and mail servers stay in those
connections. The message is sent as data: nothing a job wrote is rendered as a template.
Each notification is checked before it is sent (`io.notify_targets`: a listed or readable
http connection, an endpoint on its host; a listed SMTP connection): a refused one is not sent.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from typing import Any

from airflow.sdk import BaseNotifier

from sat_tasks.airflow.person_access import triggering_person
from sat_tasks.core.links import job_page_path
from sat_tasks.core.status import TERMINAL, JobStatus
from sat_tasks.io.notify_targets import notification_problems
from sat_tasks.spec import TrainingJob


@dataclass(frozen=True)
class JobOutcome:
    """What a notification says: the job, its run, how it ended and why, and where its page is."""

    job: str
    dag_id: str
    run_id: str
    status: str
    reason: str
    at: str | None
    page: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def subject(self) -> str:
        return f"[SAT] Training Job {self.job} {self.status}"

    def html(self) -> str:
        esc = html.escape
        return (f"<p>Training Job <b>{esc(self.job)}</b> (run {esc(self.run_id)}) ended: <b>{esc(self.status)}</b>"
                f"{' at ' + esc(self.at) if self.at else ''}.</p><p>{esc(self.reason)}</p>"
                f"<p>{esc(self.page)}</p>")


def outcome_of(job: TrainingJob, dag_id: str, run_id: str, *, succeeded: bool, reason: str = "") -> JobOutcome:
    """The job's outcome from its status history (its last entry); the DAG run's state when there is none."""
    from sat_tasks.io.run_layout import JobRun

    last: dict[str, Any] = {}
    try:
        entries = JobRun(job, run_id).history(log=lambda _line: None).entries()
        last = entries[-1] if entries else {}
    except Exception:  # noqa: BLE001 - Object Storage unreadable: say what Airflow knows
        last = {}
    if last.get("status") not in {status.value for status in TERMINAL}:  # the run ended before the job said how
        last = {"status": (JobStatus.COMPLETED if succeeded else JobStatus.FAILED).value,
                "reason": reason or "the DAG run ended", "at": None}
    return JobOutcome(job=job.name, dag_id=dag_id, run_id=run_id, status=str(last["status"]),
                      reason=str(last.get("reason") or ""), at=last.get("at"), page=job_page_path(dag_id, run_id))


def provider_notifier(notification: Any, outcome: JobOutcome) -> BaseNotifier:
    """The provider's notifier for one `Notification` of the spec, carrying `outcome`."""
    if notification.webhook is not None:
        from airflow.providers.http.notifications import HttpNotifier

        return HttpNotifier(http_conn_id=notification.webhook, endpoint=notification.endpoint or "",
                            method="POST", json=outcome.to_dict(), headers={"Content-Type": "application/json"})
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return SmtpNotifier(to=list(notification.email), subject=outcome.subject, html_content=outcome.html(),
                        smtp_conn_id=notification.smtp_conn_id)


class JobEndNotifier(BaseNotifier):
    """The DAG's end callback: tell each of the job's notifications that wants this end.

    `spec`: the job of a spec file's DAG; None for the generic DAG, whose run carries it (the
    spec `validate_spec` returned, else the run's params).
    """

    template_fields = ()

    def __init__(self, *, spec: dict[str, Any] | None = None, succeeded: bool) -> None:
        super().__init__()
        self.spec = spec
        self.succeeded = succeeded

    def notify(self, context: Any) -> None:
        job = self.job_of(context)
        if job is None or not job.notifications:
            return
        dag = context.get("dag")
        dag_id = getattr(dag, "dag_id", None) or context.get("dag_id") or ""
        outcome = outcome_of(job, dag_id, context["run_id"], succeeded=self.succeeded,
                             reason=str(context.get("reason") or ""))
        person = None if self.spec is not None else triggering_person(context.get("dag_run"))
        errors = []
        for i, notification in enumerate(job.notifications):
            if notification.wants(outcome.status):
                # Checked again before anything is sent (issue 44.2): a run validate_spec refused for its
                # notifications ends here too, and its connection must hear nothing.
                refused = notification_problems([notification], person.may_use_connection if person else None,
                                                person=person.name if person else "the person")
                if refused:
                    errors.append("refused: " + "; ".join(r.replace("notifications.0.", f"notifications.{i}.", 1)
                                                          for r in refused))
                    continue
                try:
                    provider_notifier(notification, outcome).notify(context)  # not __call__: nothing rendered
                except Exception as exc:  # noqa: BLE001 - one unreachable hook must not silence the others
                    errors.append(f"{notification.webhook or ', '.join(notification.email or [])}: "
                                  f"{type(exc).__name__}: {exc}")
        if errors:
            raise RuntimeError("some notifications of the job's end failed: " + "; ".join(errors))

    def job_of(self, context: Any) -> TrainingJob | None:
        """The run's job: the spec file's, else the spec validate_spec returned, else the run's params."""
        spec = self.spec
        if spec is None and context.get("ti") is not None:
            try:
                spec = context["ti"].xcom_pull(task_ids="validate_spec")
            except Exception:  # noqa: BLE001 - no XCom reachable: the params below
                spec = None
        if spec is None and context.get("params"):
            from sat_tasks.airflow.params import spec_from_params
            from sat_tasks.spec import parse_spec

            try:
                return parse_spec(spec_from_params(dict(context["params"])), source="the run's params")
            except Exception:  # noqa: BLE001 - an invalid spec never started: nothing to tell
                return None
        return TrainingJob.model_validate(spec) if spec else None


def job_end_callbacks(job: TrainingJob | None) -> dict[str, list[BaseNotifier]]:
    """The DAG's `on_success_callback`/`on_failure_callback` (none for a spec file without notifications)."""
    if job is not None and not job.notifications:
        return {}
    spec = job.to_dict() if job is not None else None
    return {"on_success_callback": [JobEndNotifier(spec=spec, succeeded=True)],
            "on_failure_callback": [JobEndNotifier(spec=spec, succeeded=False)]}
