"""`sat run` shows the end of Airflow's logs when a run has no report: read from the end, whatever their size."""

from __future__ import annotations

from sat_tasks.cli import run as cli_run


def test_the_log_tail_comes_from_the_end_of_a_long_log_without_the_line_the_bound_cut(tmp_path, monkeypatch):
    log = tmp_path / "airflow.log"
    log.write_text("".join(f"line {i} " + "x" * 40 + "\n" for i in range(100_000)))  # ~5 MiB of training output
    monkeypatch.setattr(cli_run, "LOG_TAIL_BYTES", 1000)
    tail = cli_run._log_tail(log, lines=5)
    assert [line.split()[1] for line in tail] == ["99995", "99996", "99997", "99998", "99999"]
    assert len(cli_run._log_tail(log, lines=500)) < 1000 // 47 + 1  # only what the bound holds, whole lines
    assert all(line.startswith("line ") and len(line) == len(tail[0]) for line in cli_run._log_tail(log, lines=500))
    assert cli_run._log_tail(None) == [] and cli_run._log_tail(tmp_path / "missing.log") == []
    short = tmp_path / "short.log"
    short.write_text("first\nsecond\n")
    assert cli_run._log_tail(short) == ["first", "second"]  # a log within the bound keeps its first line
