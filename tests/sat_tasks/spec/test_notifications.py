"""The spec's `notifications`: a webhook (an HTTP connection) or e-mail, for chosen ends; each problem names its field."""

from __future__ import annotations

import copy

import pytest

from sat_tasks.spec import SpecError, parse_spec
from tests.sat_tasks.spec.test_spec import BASE


def _parse(notifications):
    spec = copy.deepcopy(BASE)
    spec["notifications"] = notifications
    return parse_spec(spec)


def test_a_webhook_hears_every_end_unless_told_which():
    (hook,) = _parse([{"webhook": "team_hook"}]).notifications
    assert [on.value for on in hook.on] == ["completed", "failed", "pending", "stopped"]
    assert hook.wants("Pending - maxretriesexceeded") and hook.wants("Completed") and not hook.wants("Running")
    (mail,) = _parse([{"email": ["a@example.com"], "on": ["failed"]}]).notifications
    assert mail.smtp_conn_id == "smtp_default" and mail.wants("Failed") and not mail.wants("Stopped")


@pytest.mark.parametrize(("notifications", "field", "rule"), [
    pytest.param([{}], "notifications.0", "set exactly one of webhook (an HTTP connection id) or email (addresses)",
                 id="no-channel"),
    pytest.param([{"webhook": "h", "email": ["a@example.com"]}], "notifications.0",
                 "set exactly one of webhook (an HTTP connection id) or email (addresses)", id="two-channels"),
    pytest.param([{"webhook": "a hook"}], "notifications.0.webhook",
                 "must be an Airflow connection id: letters, digits, '_', '.', '-'", id="bad-connection-id"),
    pytest.param([{"email": ["not-an-address"]}], "notifications.0.email",
                 "'not-an-address' is not an e-mail address (name@domain)", id="bad-address"),
    pytest.param([{"webhook": "h", "on": ["done"]}], "notifications.0.on.0",
                 "must be one of 'completed', 'failed', 'pending' or 'stopped'", id="unknown-end"),
    pytest.param([{"email": ["a@example.com"], "endpoint": "/x"}], "notifications.0.endpoint", "only with webhook",
                 id="endpoint-without-webhook"),
    pytest.param([{"webhook": "h"}] * 11, "notifications", "at most 10 notifications (got 11)", id="too-many"),
])
def test_each_problem_names_its_field_and_rule(notifications, field, rule):
    with pytest.raises(SpecError) as raised:
        _parse(notifications)
    assert [(p.field, p.rule) for p in raised.value.problems] == [(field, rule)]


def test_more_than_fifty_tags_says_how_many_were_given():
    spec = copy.deepcopy(BASE)
    spec["tags"] = {f"k{i}": "v" for i in range(51)}
    with pytest.raises(SpecError) as raised:
        parse_spec(spec)
    assert [(p.field, p.rule) for p in raised.value.problems] == [("tags", "at most 50 key/value pairs (got 51)")]
