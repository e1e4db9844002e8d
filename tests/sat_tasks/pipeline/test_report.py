"""The job report's recovery per fault: each fault's recovery split into detect / schedule / start / restore / first step."""

from __future__ import annotations

import json

import pytest

from sat_tasks.io.metrics import RunMetrics, read_local
from sat_tasks.pipeline.report import RECOVERY_PHASES, format_recovery, recovery_per_fault
from sat_tasks.pipeline.report_html import render_report_html

PHASES = [name for name, _, _ in RECOVERY_PHASES]


def write_series(root, attempt, node, series, records):
    path = root / "metrics" / f"attempt-{attempt}" / node / f"{series}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def record(t, attempt, node, series, **values):
    return {"time": t, "series": series, "job": "j", "run": "r", "attempt": attempt, "node": node,
            "device": "host", **values}


def attempt_end(t, attempt, node, *, started, ended, verdict, action):
    return record(t, attempt, node, "job", event="attempt_end", verdict=verdict, action=action,
                  started_at=started, ended_at=ended)


def restore(attempt, node, *, step, started, restored, first_step_at):
    return record(first_step_at, attempt, node, "checkpoint", event="restore", step=step, started_at=started,
                  restored_at=restored, first_step=(step or 0) + 1, first_step_at=first_step_at)


def a_failover(root, *, with_restore=True, restored=1010.5):
    """Attempt 1 on n0 dies at 1000.0 (HARDWARE); decide at 1000.4; attempt 2 on n1 starts at 1001.9."""
    write_series(root, 0, "sat", "job", [
        attempt_end(1000.4, 1, "n0", started=900.0, ended=1000.0, verdict="HARDWARE", action="failover"),
        attempt_end(1100.0, 2, "n1", started=1001.9, ended=1099.0, verdict="SUCCEEDED", action="upload")])
    write_series(root, 1, "n0", "checkpoint", [restore(1, "n0", step=None, started=905.0, restored=905.2,
                                                       first_step_at=905.9)])
    if with_restore:
        write_series(root, 2, "n1", "checkpoint", [
            restore(2, "n1", step=60, started=1008.25, restored=restored, first_step_at=1011.0),
            record(1040.0, 2, "n1", "checkpoint", event="save", step=80, blocking_s=0.01, persist_s=0.3, bytes=1e6)])


def test_a_failovers_recovery_is_split_into_five_phases_that_add_up_to_it(tmp_path):
    a_failover(tmp_path)
    (fault,) = recovery_per_fault(read_local(tmp_path))
    assert fault["phases"] == {"detect": 0.4, "schedule": 1.5, "start": 6.35, "restore": 2.25, "first_step": 0.5}
    assert fault["recovery_s"] == 11.0 == sum(fault["phases"].values())  # whole milliseconds: exact
    assert (fault["attempt"], fault["next_attempt"], fault["node"], fault["next_node"]) == (1, 2, "n0", "n1")
    assert fault["verdict"] == "HARDWARE" and fault["resumed_from_step"] == 60 and "unknown" not in fault
    assert format_recovery(fault) == ("recovery after attempt 1 (n0, HARDWARE) -> attempt 2 (n1): 11.0s = detect "
                                      "0.4s + schedule 1.5s + start 6.3s + restore 2.2s + first step 0.5s")


@pytest.mark.parametrize("case, unknown", [
    pytest.param("no restore record", {"start", "restore", "first_step"}, id="next-attempt-wrote-no-restore-record"),
    pytest.param("load end not reported", {"restore", "first_step"}, id="checkpoint-load-end-missing"),
    pytest.param("clocks disagree", {"restore", "first_step"}, id="restored-before-ready"),
])
def test_a_phase_that_cannot_be_measured_is_unknown_never_zero(tmp_path, case, unknown):
    if case == "no restore record":
        a_failover(tmp_path, with_restore=False)
    else:
        a_failover(tmp_path, restored=None if case == "load end not reported" else 1007.0)
    (fault,) = recovery_per_fault(read_local(tmp_path))
    assert {p for p in PHASES if fault["phases"][p] is None} == unknown
    assert set(fault["unknown"]) == unknown and all(fault["unknown"][p] for p in unknown)
    assert fault["phases"]["detect"] == 0.4 and fault["phases"]["schedule"] == 1.5
    if case == "no restore record":
        assert fault["recovery_s"] is None and "wrote no restore record" in fault["unknown"]["start"]
    else:
        assert fault["recovery_s"] == 11.0 and fault["phases"]["start"] == 6.35
    if case == "clocks disagree":
        assert "the clocks disagree" in fault["unknown"]["restore"] == fault["unknown"]["first_step"]
    assert "unknown" in format_recovery(fault) and " 0.0s" not in format_recovery(fault)
    page = render_report_html(read_local(tmp_path), title="t")
    table = page[page.index("<h2>Recovery per fault</h2>"):]
    assert table.count("<i>unknown</i>") == len(unknown) + (case == "no restore record")  # + the total
    assert "alt='Recovery phases'" in page


def test_without_a_job_record_the_status_history_places_the_decision_and_the_launch():
    """SAT's attempt_end records are lost (the metrics write failed): the history's entries stand in."""
    metrics = RunMetrics(source="mem")
    metrics.records["job"] = [record(1000.4, 1, "n0", "job", event="attempt_end", verdict="HARDWARE",
                                     action="failover", ended_at=1000.0)]
    metrics.records["checkpoint"] = [restore(2, "n1", step=60, started=1008.25, restored=1010.5, first_step_at=1011.0)]
    metrics.history = [
        {"status": "Running", "at": "1970-01-01T00:15:00+00:00", "attempt": 1, "task": "launch"},
        {"status": "Pending - failoverinprogress", "at": "1970-01-01T00:16:40.400000+00:00", "attempt": 1,
         "task": "decide"},
        {"status": "Running", "at": "1970-01-01T00:16:42+00:00", "attempt": 2, "task": "launch"}]
    (fault,) = recovery_per_fault(metrics)
    assert fault["phases"]["schedule"] == 1.6 and fault["phases"]["start"] == 6.25 and "unknown" not in fault


def test_a_success_a_stop_and_an_unrecovered_fault_have_no_recovery(tmp_path):
    write_series(tmp_path, 0, "sat", "job", [
        attempt_end(1000.4, 1, "n0", started=900.0, ended=1000.0, verdict="SUCCEEDED", action="upload")])
    assert recovery_per_fault(read_local(tmp_path)) == []
    write_series(tmp_path, 0, "sat", "job", [
        attempt_end(1000.4, 1, "n0", started=900.0, ended=1000.0, verdict="HARDWARE", action="failover")])
    assert recovery_per_fault(read_local(tmp_path)) == []  # the job ended before another attempt started
    page = render_report_html(read_local(tmp_path), title="t")
    assert "Recovery per fault" not in page


def test_a_planned_restart_to_grow_back_is_no_fault_and_the_report_says_so_in_words(tmp_path):
    """ADR 0029: attempt 2 on one node is stopped to grow back; attempt 3 runs on two from its final checkpoint."""
    from sat_tasks.pipeline.report import format_report, planned_restarts

    write_series(tmp_path, 0, "sat", "job", [
        attempt_end(1000.4, 2, "n1", started=900.0, ended=1000.0, verdict="PLANNED_RESTART", action="failover"),
        attempt_end(1100.0, 3, "n0", started=1001.9, ended=1099.0, verdict="SUCCEEDED", action="upload")])
    write_series(tmp_path, 3, "n0", "checkpoint", [
        restore(3, "n0", step=12, started=1008.25, restored=1010.5, first_step_at=1011.0)])
    metrics = read_local(tmp_path)
    assert recovery_per_fault(metrics) == []
    (restart,) = planned_restarts(metrics)
    assert (restart["attempt"], restart["next_attempt"], restart["recovery_s"]) == (2, 3, 11.0)
    line = format_recovery(restart)
    assert line.startswith("planned restart to grow back after attempt 2 (n1) -> attempt 3 (n0): 11.0s = detect")
    page = render_report_html(metrics, title="t")
    assert "Recovery per fault" not in page and "planned restart to grow back after attempt 2" in page
    report = {"job": "j", "run_id": "r", "status": "Completed", "history": [], "results": "s3://b/r/",
              "attempts": [{"attempt": 2, "node": "n1", "exit_code": 143, "verdict": "PLANNED_RESTART",
                            "reason": "planned restart to grow back from 1 to 2 of 2 nodes", "resumed_from": 5}],
              "recovery": [], "planned_restarts": [restart]}
    lines = format_report(report)
    assert ("  attempt 2 on n1: exit 143, verdict PLANNED_RESTART (planned restart to grow back from 1 to 2 of 2 "
            "nodes: not a fault), resumed from step 5") in lines
    assert f"  {line}" in lines


def test_the_human_report_shows_a_long_checkpoint_list_by_its_ends():
    """A run that saved 210 checkpoints names the first and last three and the count, not every one."""
    from sat_tasks.pipeline.report import format_report

    base = {"job": "j", "run_id": "r", "status": "Completed", "history": [], "attempts": [], "results": "s3://b/r/"}
    many = [f"checkpoint-{20 * n}" for n in range(1, 211)]
    (line,) = [x for x in format_report({**base, "checkpoints": many}) if "checkpoints:" in x]
    assert line == ("  checkpoints: checkpoint-20, checkpoint-40, checkpoint-60, ... (204 more), "
                    "checkpoint-4160, checkpoint-4180, checkpoint-4200 (210 in all)")
    few = [f"checkpoint-{n}" for n in range(1, 8)]  # seven: every name, as before
    assert f"  checkpoints: {', '.join(few)}" in format_report({**base, "checkpoints": few})
