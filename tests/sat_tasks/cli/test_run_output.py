"""`sat run`/`sat demo` output: steps and summary by default, the summary only with -q, Airflow's logs with -v."""

from __future__ import annotations

import sys

import pytest

from sat_tasks.cli import build_parser, run
from sat_tasks.cli.console import Console
from sat_tasks.spec import parse_spec

REPORT = {"job": "tiny-llama-demo", "run_id": "manual__1", "status": "Completed", "results": "s3://sat-demo/r/",
          "history": [{"status": "Completed", "at": "t1", "reason": "training completed; results uploaded"}],
          "attempts": [{"attempt": 1, "node": "local-node-0", "exit_code": 137, "verdict": "HARDWARE"}]}
JOB = parse_spec({"name": "tiny-llama-demo", "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                  "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
                  "storage": {"script_url": "s3://sat-demo/scripts/train.py"},
                  "results": {"destination": "s3://sat-demo/results/"}, "command": "python train.py"})


def fake_run(job, spec_path, console, log_path):
    """What a run writes, without Airflow: Airflow's lines, a failed attempt's traceback, a step line, the summary."""
    print("[info     ] Pushing xcom                   [task] loc=task_runner.py:2280")
    print("Traceback (most recent call last):\nAirflowFailException: attempt 1 ended with exit status 137",
          file=sys.stderr)
    console.line("[0:09] validate_spec        done (8.1s)")
    run._print_summary(console, REPORT, "manual__1", 105.0, log_path)
    return REPORT


@pytest.fixture
def log_path(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "_run_job", fake_run)
    return tmp_path / "logs" / "tiny-llama-demo.log"


def test_by_default_steps_and_summary_are_printed_and_airflows_lines_go_to_the_file_it_names(log_path, capfd):
    assert run.run_job(JOB, None, airflow_log=log_path) == REPORT
    out = capfd.readouterr().out
    assert "[0:09] validate_spec        done (8.1s)" in out and "wall time: 105s" in out
    assert f"  Airflow's logs: {log_path}" in out
    assert "Pushing xcom" not in out and "Traceback" not in out
    assert "Pushing xcom" in log_path.read_text() and "exit status 137" in log_path.read_text()


def test_quiet_prints_only_the_summary_without_the_failed_attempts_traceback(log_path, capfd):
    run.run_job(JOB, None, quiet=True, airflow_log=log_path)
    captured = capfd.readouterr()
    assert captured.out.splitlines() == [
        "", "=" * 78, "job tiny-llama-demo run manual__1: Completed",
        "  t1  Completed                      training completed; results uploaded",
        "  attempt 1 on local-node-0: exit 137, verdict HARDWARE", "  results: s3://sat-demo/r/",
        "  wall time: 105s", f"  Airflow's logs: {log_path}", "=" * 78]
    assert captured.err == ""


def test_verbose_shows_airflows_lines_and_writes_no_file(log_path, capfd):
    run.run_job(JOB, None, verbose=True, airflow_log=log_path)
    captured = capfd.readouterr()
    assert "Pushing xcom" in captured.out and "exit status 137" in captured.err
    assert "[0:09] validate_spec" in captured.out and "Airflow's logs:" not in captured.out
    assert not log_path.exists()


def test_a_run_without_a_report_shows_the_end_of_airflows_logs(tmp_path, capfd):
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    run._print_summary(Console(sys.stdout, quiet=True), None, "manual__1", 3.0, log)
    out = capfd.readouterr().out
    assert "run manual__1: no job report was written" in out and "the last 30 lines of Airflow's logs:" in out
    assert "    | line 99" in out and "    | line 70" in out and "line 69" not in out


@pytest.mark.parametrize("argv, quiet, verbose", [
    pytest.param(["demo"], False, False, id="demo"),
    pytest.param(["demo", "-q"], True, False, id="demo-quiet"),
    pytest.param(["run", "job.yaml", "--verbose"], False, True, id="run-verbose"),
])
def test_quiet_and_verbose_options(argv, quiet, verbose):
    args = build_parser().parse_args(argv)
    assert (args.quiet, args.verbose) == (quiet, verbose)


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "job.yaml", "-q", "-v"])
    assert "not allowed with argument" in capsys.readouterr().err
