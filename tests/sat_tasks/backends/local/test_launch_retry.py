"""A local `launch` try that dies before SAT's code runs (worker lost, a DB error at start) comes back soon as a retry (issue 31.3)."""

from __future__ import annotations

from datetime import timedelta

from sat_tasks.backends.local import BACKEND, LAUNCH_RETRY_DELAY
from sat_tasks.backends.local.operator import LAUNCH_RETRIES


def test_the_local_launch_is_retried_once_after_a_short_delay():
    (launch,) = BACKEND.launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=None)
    assert launch.task_id == "launch" and launch.retries == LAUNCH_RETRIES  # a failed attempt raises AirflowFailException: no retry
    assert launch.retry_delay == LAUNCH_RETRY_DELAY <= timedelta(seconds=10)
