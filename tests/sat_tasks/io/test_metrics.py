"""Reading a run's metrics and `sat report`: a malformed line is named by file and line, the rest still renders."""

from __future__ import annotations

import json

from sat_tasks.cli import main
from sat_tasks.io.metrics import job_summary, monitoring_series, read_local


def write_series(root, attempt, node, series, records):
    path = root / "metrics" / f"attempt-{attempt}" / node / f"{series}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def record(t, attempt, node, series="training", **values):
    return {"time": t, "series": series, "job": "j", "run": "r", "attempt": attempt, "node": node,
            "device": "host", **values}


def a_run_with_a_failover(root):
    write_series(root, 1, "n0", "training", [record(100 + 2 * i, 1, "n0", global_step=10 * i, loss=5 - i,
                                                     steps_per_second=5.0, samples_per_second=40.0)
                                              for i in range(1, 5)])
    write_series(root, 2, "n1", "training", [record(130 + 2 * i, 2, "n1", global_step=30 + 10 * i, loss=2 - 0.1 * i,
                                                     steps_per_second=5.0, samples_per_second=40.0)
                                              for i in range(1, 4)])
    write_series(root, 2, "n1", "checkpoint", [record(140, 2, "n1", "checkpoint", event="save", step=60,
                                                       blocking_s=0.01, persist_s=0.4, bytes=1e6)])
    write_series(root, 1, "n0", "system", [record(100 + i, 1, "n0", "system", cpu_percent=50.0,
                                                   memory_used_bytes=2e9) for i in range(5)])
    (root / "status.json").write_text(json.dumps([
        {"status": "Running", "at": "1970-01-01T00:01:39+00:00", "attempt": 1},
        {"status": "Pending - failoverinprogress", "at": "1970-01-01T00:01:50+00:00", "attempt": 1},
        {"status": "Running", "at": "1970-01-01T00:02:00+00:00", "attempt": 2},
        {"status": "Completed", "at": "1970-01-01T00:02:20+00:00", "attempt": 2}]))


def test_failover_goodput_and_recovery_from_the_series(tmp_path):
    a_run_with_a_failover(tmp_path)
    metrics = read_local(tmp_path)
    assert not metrics.problems
    summary = job_summary(metrics)
    (fault,) = summary["faults"]
    assert fault == {"attempt": 1, "node": "n0", "next_node": "n1", "status": "Pending - failoverinprogress",
                     "verdict": None, "last_step": 40, "resumed_at_step": 40, "ended_at": 108, "resumed_at": 132, "recovery_s": 24}
    assert summary["training_s"] == 6 + 4 and summary["wall_s"] == 140 - 99
    series = monitoring_series(metrics)
    assert [r["attempt"] for r in series["loss"]] == [1] * 4 + [2] * 3 and series["gpus"] == {}
    assert series["checkpoints"][0]["persist_s"] == 0.4 and series["goodput"] == round(10 / 41, 4)


def test_an_attempt_that_died_before_its_first_interval_still_counts_from_sats_own_records(tmp_path):
    """Attempt 1 left no training sample (killed 60 s in, interval 300 s): the sidecar's and SAT's records place it."""
    write_series(tmp_path, 1, "n0", "job", [
        record(100, 1, "n0", "job", status="Starting", running=1),
        record(110, 1, "n0", "job", event="first_step", step=1),
        record(160, 1, "n0", "job", status="Ended", running=1)])
    write_series(tmp_path, 2, "n1", "job", [record(170, 2, "n1", "job", status="Starting", running=1),
                                            record(180, 2, "n1", "job", event="first_step", step=50)])
    write_series(tmp_path, 2, "n1", "training", [record(480, 2, "n1", global_step=200, loss=1.0)])
    (tmp_path / "metrics" / "sat").mkdir()
    (tmp_path / "metrics" / "sat" / "job.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        record(165, 1, "n0", "job", event="attempt_end", verdict="HARDWARE", action="failover",
               status="Pending - failoverinprogress", ended_at=158, last_step=61, failovers_used=1),
        record(500, 2, "n1", "job", event="attempt_end", verdict="SUCCEEDED", action="upload", ended_at=490,
               last_step=200, failovers_used=1),
        record(505, 2, "sat", "job", event="final", status="Completed", attempts=2)]))
    metrics = read_local(tmp_path)
    assert not metrics.problems
    summary = job_summary(metrics)
    (fault,) = summary["faults"]
    assert fault == {"attempt": 1, "node": "n0", "next_node": "n1", "status": "Pending - failoverinprogress",
                     "verdict": "HARDWARE", "last_step": 61, "resumed_at_step": 50, "ended_at": 158,
                     "resumed_at": 180, "recovery_s": 22}
    # training: 110 -> 158 and 180 -> 490; wall: the first record (100) to the final one (505)
    assert summary["training_s"] == 48 + 310 and summary["wall_s"] == 405
    assert summary["goodput"] == round(358 / 405, 4)
    assert [a["node"] for a in monitoring_series(metrics)["attempts"]] == ["n0", "n1"]


def test_a_planned_restart_to_grow_back_is_not_a_fault(tmp_path):
    """An elastic job's attempt stopped to grow back (verdict PLANNED_RESTART, ADR 0029) is not a fault."""
    write_series(tmp_path, 1, "n0", "job", [record(100, 1, "n0", "job", event="first_step", step=1)])
    write_series(tmp_path, 2, "n0", "job", [record(170, 2, "n0", "job", event="first_step", step=50)])
    write_series(tmp_path, 2, "n0", "training", [record(300, 2, "n0", global_step=100, loss=1.0)])
    (tmp_path / "metrics" / "sat").mkdir()
    (tmp_path / "metrics" / "sat" / "job.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        record(160, 1, "n0", "job", event="attempt_end", verdict="PLANNED_RESTART", action="failover",
               status="Running", ended_at=158, last_step=50, failovers_used=0),
        record(310, 2, "n0", "job", event="attempt_end", verdict="SUCCEEDED", action="upload", ended_at=305,
               last_step=100, failovers_used=0)]))
    summary = job_summary(read_local(tmp_path))
    assert summary["faults"] == []
    assert summary["training_s"] == (158 - 100) + (305 - 170)  # the restart's gap is still not training time


def test_malformed_metrics_file_is_named_with_its_line_and_the_rest_renders(tmp_path, capsys):
    a_run_with_a_failover(tmp_path)
    bad = write_series(tmp_path, 3, "n2", "training", [record(150, 3, "n2", global_step=70, loss=1.0)])
    with open(bad, "a") as handle:
        handle.write('{"time": 151, "series": "training", "loss": \n')  # cut off mid-record
        handle.write('[1, 2]\n')
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "metrics/attempt-3/n2/training.jsonl:2: not JSON" in err
    assert "metrics/attempt-3/n2/training.jsonl:3: not a metrics record" in err
    page = (tmp_path / "report.html").read_text()
    assert "training.jsonl:2: not JSON" in page
    for plot in ("Loss", "Throughput", "Checkpoints", "System", "Goodput and recovery"):
        assert f"alt='{plot}'" in page, plot
    assert "alt='GPUs'" not in page and "no GPU was readable" in page
    assert "training again at step 40 on n1 after 24.0s" in page


def test_report_of_a_directory_that_is_not_there(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_a_series_over_the_bound_is_a_named_problem_and_the_rest_still_loads(tmp_path, monkeypatch):
    """The training process writes the series: one over MAX_JSON_BYTES is not read, the run's report still is."""
    from sat_tasks.core import bounded

    a_run_with_a_failover(tmp_path)
    big = write_series(tmp_path, 2, "n1", "system", [record(130 + i, 2, "n1", "system", cpu_percent=50.0,
                                                            padding="p" * 400) for i in range(20)])
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 4096)
    metrics = read_local(tmp_path)
    assert big.stat().st_size > 4096
    assert any(p.startswith("metrics/attempt-2/n1/system.jsonl: ") and "more than the 4.0 KiB" in p
               for p in metrics.problems), metrics.problems
    assert metrics.history and [r["global_step"] for r in metrics.records["training"]][:4] == [10, 20, 30, 40]
    (tmp_path / "status.json").write_bytes(b"[" + b" " * 5000 + b"]")
    assert any(p.startswith("status.json: ") and "more than the 4.0 KiB" in p for p in read_local(tmp_path).problems)
