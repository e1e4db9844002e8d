"""What a run's status history says of the nodes an elastic attempt held: numbers on the entry, not words (ADR 0029)."""

from __future__ import annotations

from sat_tasks.core.run_summary import summarize_history
from sat_tasks.core.status import JobStatus, StatusHistory


def _history() -> tuple[StatusHistory, list[dict]]:
    stored: list[dict] = []
    return StatusHistory(load=lambda: list(stored), save=lambda e: stored.__setitem__(slice(None), e),
                         log=lambda _line: None), stored


def test_an_attempt_start_records_the_nodes_it_holds_and_other_entries_stay_as_they_were():
    history, stored = _history()
    history.record(JobStatus.RUNNING, "attempt 1 started on a, b", attempt=1, task="launch", nodes_held=2, nodes=2)
    history.record(JobStatus.FAILOVER_IN_PROGRESS, "hardware fault on a", attempt=1, task="classify")
    assert (stored[0]["nodes_held"], stored[0]["nodes"]) == (2, 2)
    assert set(stored[1]) == {"status", "at", "reason", "attempt", "task"}  # no null node counts on every entry


SHRUNK = [
    {"status": "Running", "at": "2026-12-01T10:00:00+00:00", "attempt": 1, "task": "launch",
     "reason": "attempt 1 started on a, b", "nodes_held": 2, "nodes": 2},
    {"status": "Pending - failoverinprogress", "at": "2026-12-01T10:30:00+00:00", "attempt": 1},
    {"status": "Running", "at": "2026-12-01T10:40:00+00:00", "attempt": 2, "task": "launch",
     "reason": "attempt 2 started on b", "nodes_held": 1, "nodes": 2},
    {"status": "Completed", "at": "2026-12-01T11:10:00+00:00", "attempt": 2},
]


def test_the_shortfall_is_read_from_the_entrys_node_counts():
    summary = summarize_history(SHRUNK)
    assert (summary.running_s, summary.short_node_s) == (3600.0, 1800.0)  # attempt 2 ran 30 min one node short
    assert summarize_history(SHRUNK[:3]).running_short_nodes == 1  # while it runs


def test_the_reasons_words_alone_no_longer_count():
    """The counts are the record: a reason that happens to say "on 1 of 2 nodes" changes nothing."""
    worded = [{k: v for k, v in e.items() if k not in ("nodes_held", "nodes")} for e in SHRUNK]
    worded[2]["reason"] = "attempt 2 started on b; resumed on 1 of 2 nodes (a excluded: HARDWARE)"
    assert summarize_history(worded).short_node_s == 0.0


def test_an_older_history_takes_the_counts_from_the_attempt_records_when_the_caller_has_them():
    older = [{k: v for k, v in e.items() if k not in ("nodes_held", "nodes")} for e in SHRUNK]
    assert summarize_history(older).short_node_s == 0.0  # nothing to go by: every node held
    summary = summarize_history(older, {1: 2, 2: 1}, 2)
    assert summary.short_node_s == 1800.0
    assert summarize_history(older, {1: 2}, 2).short_node_s == 0.0  # attempt 2's record not read: not short
    # the entry's own counts win over a record's
    assert summarize_history(SHRUNK, {2: 2}, 2).short_node_s == 1800.0


def test_wrongly_typed_counts_read_as_absent():
    bad = [dict(e) for e in SHRUNK]
    bad[2].update(nodes_held="1", nodes=True)
    assert summarize_history(bad).short_node_s == 0.0
