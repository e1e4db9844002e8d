"""A person's actions on a run's records (Stop, Tags, Delete), against the session's S3 server."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from sat_tasks.io.object_storage import read_json, write_json
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import actions
from sat_tasks.spec import parse_spec
from tests.sat_tasks.spec.test_spec import BASE

AT = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
RUNS = itertools.count(1)


@pytest.fixture
def run(demo_bucket) -> JobRun:
    spec = copy.deepcopy(BASE)
    spec.update(name="stop-me", results={"destination": "s3://sat-demo/results/"})
    return JobRun(parse_spec(spec), f"manual__actions-{next(RUNS)}")


def _backend(watches: bool):
    return SimpleNamespace(capabilities=SimpleNamespace(watches_stop_request=watches))


@pytest.mark.parametrize(("watches", "launched", "end_run", "reason"), [
    pytest.param(True, True, False, None, id="the-training-stops-itself"),
    pytest.param(True, False, True, "stopped by alice at 2026-12-02T05:00:00+00:00 (the Training Jobs view) "
                                    "before training ran", id="before-training"),
    pytest.param(False, True, True, "stopped by alice at 2026-12-02T05:00:00+00:00 (the Training Jobs view)",
                 id="the-run-is-ended"),
])
def test_stop_asks_the_backend_what_a_stop_request_does(run, monkeypatch, watches, launched, end_run, reason):
    monkeypatch.setattr(actions, "backend_for", lambda job: _backend(watches))
    outcome = actions.stop_job(run, "alice", training_launched=launched, at=AT)
    assert outcome.request == {"by": "alice", "at": AT.isoformat(), "via": "the Training Jobs view"}
    assert read_json(run.hook(), run.stop_uri) == outcome.request  # what the launcher and `decide` read
    assert outcome.end_run is end_run
    history = read_json(run.hook(), run.status_uri) or []
    if reason is None:
        assert history == [] and "SIGTERM" in outcome.how  # the status turns Stopped when the training has
    else:
        assert [(e["status"], e["reason"], e["task"]) for e in history] == [("Stopped", reason, "stop")]


def test_delete_results_removes_every_object_of_the_run_only(run, s3_hook):
    other = JobRun(run.job, run.run_id + "-other")
    for layout in (run, other):
        write_json(s3_hook, layout.status_uri, [])
        write_json(s3_hook, layout.results_uri + "output/metrics.json", {"loss": 0.5})
    actions.save_tags(s3_hook, run, {"team": "ml"})
    assert actions.delete_results(s3_hook, run) == 3
    assert read_json(s3_hook, run.tags_uri) is None and read_json(s3_hook, other.status_uri) == []
