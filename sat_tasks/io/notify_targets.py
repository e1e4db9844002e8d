"""Where a job's notifications may go: the connections and endpoints a spec may name (issue 44.2, ADR 0027).

A notification names an Airflow connection, and Airflow's notifier sends through it with the
connection's credentials: a spec that could name any connection (the Object Storage one, say)
with any endpoint would have Airflow hand those credentials to any host. So:

- a webhook's connection is one the operator lists (`[sat] notification_connections`) or an
  http connection the person who starts the job may read; it is an http or https connection
  with a host;
- its endpoint is a path only (no scheme, `@`, `//` or `\\`), and the URL the http provider
  builds from the connection and the endpoint has the connection's host and port;
- an e-mail notification's SMTP connection is one the operator lists, with a host.

Create checks a job before it starts (the person: whoever creates it), `validate_spec` checks
again for the person who triggered the run, and the end-of-run notifier checks each
notification before it sends it. `person_may_read` None: no person to ask (a spec file's run,
whose author is the deployment): a webhook may then name any http connection with a host.
The connection is looked up only once the person may use it, so a refusal tells nothing of
a connection the person may not read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from sat_tasks.config import sat_setting

WEBHOOK_TYPES = ("http", "https")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def notification_connections() -> frozenset[str]:
    """The connection ids every job may name in a notification, from `[sat] notification_connections`."""
    return frozenset(c.strip() for c in sat_setting("notification_connections").split(",") if c.strip())


def endpoint_problem(endpoint: str | None) -> str | None:
    """Why `endpoint` is not a path on the webhook connection's URL (None: it is one)."""
    if not endpoint:
        return None
    if _SCHEME.match(endpoint) or "://" in endpoint:
        return "must be a path on the webhook connection's URL, without a scheme (http:, https:, ...)"
    for sign, name in (("@", "'@'"), ("//", "'//'"), ("\\", "'\\'")):
        if sign in endpoint:
            return f"must be a path on the webhook connection's URL, without {name}"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in endpoint):
        return "must be a path on the webhook connection's URL, without control characters"
    return None


def _default_get_connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def _host_port(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    try:
        return (parts.hostname or "").lower() or None, parts.port
    except ValueError:  # a port that is not a number
        return None, None


def webhook_urls(conn: Any, endpoint: str | None) -> tuple[str, str]:
    """The connection's base URL, and the URL the http provider's hook POSTs to for `endpoint` (its own joining)."""
    from airflow.providers.http.hooks.http import HttpHook

    hook = HttpHook(method="POST", http_conn_id=conn.conn_id)
    hook._set_base_url(conn)
    return hook.base_url, hook.url_from_endpoint(endpoint)


def webhook_problem(conn: Any, endpoint: str | None) -> str | None:
    """Why the webhook connection `conn` with `endpoint` may not be POSTed to (None: it may)."""
    conn_type = (getattr(conn, "conn_type", None) or "").lower()
    if conn_type not in WEBHOOK_TYPES:
        return f"the connection {conn.conn_id} is not an http or https connection (its type: {conn_type or 'none'})"
    if not (getattr(conn, "host", None) or "").strip():
        return f"the connection {conn.conn_id} has no host"
    extra = getattr(conn, "extra_dejson", None) or {}
    if str(extra.get("srv_lookup", "")).lower() in ("true", "1", "yes", "on"):
        return f"the connection {conn.conn_id} looks its host up by DNS SRV: a notification needs a fixed host"
    try:
        base, url = webhook_urls(conn, endpoint)
    except Exception as exc:  # noqa: BLE001 - a connection the provider cannot make a URL of
        return f"the connection {conn.conn_id} has no usable URL ({type(exc).__name__})"
    if urlsplit(base).scheme.lower() not in WEBHOOK_TYPES or urlsplit(url).scheme.lower() not in WEBHOOK_TYPES:
        return f"the connection {conn.conn_id} is not an http or https URL"
    from urllib3.util import parse_url

    try:
        requests_host = (parse_url(url).host or "").lower(), parse_url(url).port
    except Exception:  # noqa: BLE001 - urllib3 cannot read it: requests could not send it either
        requests_host = (None, None)
    if _host_port(url)[0] is None or _host_port(url) != _host_port(base) or requests_host != _host_port(base):
        return f"the URL of the connection {conn.conn_id} and this endpoint is not on the connection's host"
    return None


def notification_problems(notifications: list[Any], person_may_read: Callable[[str], bool] | None, *,
                          get_connection: Callable[[str], Any] | None = None,
                          person: str = "the person") -> list[str]:
    """`notifications.<i>.<field>: <rule>` for each of the job's notifications that may not be sent."""
    get_connection = get_connection or _default_get_connection
    listed = notification_connections()
    problems = []
    for i, notification in enumerate(notifications):
        if notification.webhook is not None:
            field, conn_id = f"notifications.{i}.webhook", notification.webhook
            bad_endpoint = endpoint_problem(notification.endpoint)
            if bad_endpoint is not None:
                problems.append(f"notifications.{i}.endpoint: {bad_endpoint}")
            if conn_id not in listed and person_may_read is not None and not person_may_read(conn_id):
                problems.append(f"{field}: {person} may not use the connection {conn_id} (a webhook's connection is "
                                "listed in [sat] notification_connections, or an http connection the person may read)")
                continue
        else:
            field, conn_id = f"notifications.{i}.smtp_conn_id", notification.smtp_conn_id
            if conn_id not in listed:
                problems.append(f"{field}: the connection {conn_id} is not listed in [sat] notification_connections "
                                "(an e-mail notification's SMTP connection is one the operator lists)")
                continue
        try:
            conn = get_connection(conn_id)
        except Exception:  # noqa: BLE001 - AirflowNotFoundException, or no connection reachable
            problems.append(f"{field}: there is no connection {conn_id}")
            continue
        if notification.webhook is not None:
            rule = webhook_problem(conn, None if bad_endpoint else notification.endpoint)
        elif not (getattr(conn, "host", None) or "").strip():
            rule = f"the connection {conn_id} has no host"
        else:
            rule = None
        if rule is not None:
            problems.append(f"{field}: {rule}")
    return problems
