"""A person's Stop is STOPPED (by whom, through which route), never HARDWARE, from the classify task to the status."""

from __future__ import annotations

import copy
import itertools
import signal
import time
from datetime import UTC, datetime

import pytest

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Plan, VerdictKind
from sat_tasks.core.policy import decide_next
from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import actions, steps
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

AT = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
RUNS = itertools.count(1)


@pytest.fixture
def run(demo_bucket) -> JobRun:
    spec = copy.deepcopy(BASE)
    spec.update(name="stop-verdict", results={"destination": "s3://sat-demo/results/"})
    run = JobRun(parse_spec(spec), f"manual__stop-verdict-{next(RUNS)}")
    # The local runner's record of an attempt it ended with SIGTERM (what a stop and a node-side kill both look like).
    run.store_record(AttemptRecord(job=run.job.name, attempt=1, backend="local", node="local-0", exit_code=None,
                                   signal=signal.SIGTERM, log_tail=["step 12 loss 3.1"], stopped_by="alice"))
    return run


@pytest.mark.parametrize(("via", "route"), [
    pytest.param(actions.VIA, "the Training Jobs view", id="from-the-page"),
    pytest.param(actions.VIA_API, "the REST API", id="from-the-rest-api"),
])
def test_a_stopped_attempt_is_stopped_by_whom_and_through_which_route(run, via, route):
    actions.request_stop(run.hook(), run, "alice", via=via, at=AT)
    verdict = steps.classify_attempt(run.job, run.run_id, 1, log=lambda _line: None)
    assert verdict["kind"] == "STOPPED", verdict
    assert "node-side kill" not in verdict["reason"] and "not a node fault" in verdict["reason"]
    assert verdict["evidence"][0] == f"stop requested by alice at {AT.isoformat()} through {route}"
    assert run.load_verdict(1).kind is VerdictKind.STOPPED  # what the Attempts tab shows
    decision = decide_next(run.job, Plan(attempt=1), run.load_verdict(1), now=time.time(),
                           stop_request=run.stop_request())
    assert decision.status is JobStatus.STOPPED and f"({route})" in decision.why


def test_without_a_stop_request_a_sigterm_from_outside_is_an_interruption_without_blame(run):
    # Issue 43: an outside SIGTERM with no fault evidence is resumed without blame (no failover, no ledger entry).
    verdict = steps.classify_attempt(run.job, run.run_id, 1, log=lambda _line: None)
    assert verdict["kind"] == "PREEMPTED" and verdict["reason"].startswith("interrupted:"), verdict
