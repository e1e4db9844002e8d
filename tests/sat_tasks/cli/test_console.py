"""What a run prints: a person's lines on the console, a throttled or in-place progress line, the rest in a file."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

from sat_tasks.cli.console import CLEAR_LINE, Console, output_to_file


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("quiet, expected", [
    pytest.param(False, "a step\nthe summary\n", id="default"),
    pytest.param(True, "the summary\n", id="quiet-prints-only-the-summary"),
])
def test_quiet_keeps_only_the_summary(quiet, expected):
    stream = io.StringIO()
    console = Console(stream, quiet=quiet, live=False)
    console.line("a step")
    console.progress("training: attempt 1, step 3")
    stream.seek(0)
    stream.truncate()
    console.line("a step")
    console.summary("the summary")
    assert stream.getvalue() == expected


def test_off_a_terminal_progress_is_a_line_every_few_seconds():
    stream, clock = io.StringIO(), FakeClock()
    console = Console(stream, live=False, progress_every=10.0, clock=clock)
    for now, step in ((0.0, 1), (4.0, 2), (9.9, 3), (10.0, 4), (15.0, 5), (20.5, 6)):
        clock.now = now
        console.progress(f"step {step}")
    assert stream.getvalue().splitlines() == ["step 1", "step 4", "step 6"]


def test_on_a_terminal_progress_is_one_line_rewritten_in_place_and_cleared_before_the_next_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "12")  # a StringIO has no terminal: the width comes from COLUMNS
    stream = io.StringIO()
    console = Console(stream, live=True)
    console.progress("step 1")
    console.progress("step 2, loss 0.7742")  # cut to the width: a wrapped line would not be rewritten
    console.line("attempt_1.launch done")
    console.line("attempt_1.classify done")
    assert stream.getvalue() == (f"{CLEAR_LINE}step 1{CLEAR_LINE}step 2, los{CLEAR_LINE}attempt_1.launch done\n"
                                 "attempt_1.classify done\n")


def test_everything_written_meanwhile_goes_to_the_file_and_the_console_gets_only_its_own_lines(tmp_path, capfd):
    handler = logging.StreamHandler(sys.stdout)  # as Airflow's console handler: the stream it was given
    logger = logging.getLogger("sat.test.console")
    logger.addHandler(handler)
    logger.propagate = False
    log = tmp_path / "logs" / "job.log"
    try:
        with output_to_file(log) as stream:
            console = Console(stream, live=False)
            console.line("[0:01] validate_spec done")
            print("print() to sys.stdout")
            print("a warning on sys.stderr", file=sys.stderr)
            os.write(1, b"straight to file descriptor 1\n")
            subprocess.run([sys.executable, "-c", "import sys; print('a child process'); "
                            "print('its stderr', file=sys.stderr)"], check=True)
            logger.warning("Pushing xcom")
            try:
                raise RuntimeError("attempt 1 ended with exit status 137")
            except RuntimeError:
                logger.exception("Task failed with exception")
            console.summary("the summary")
        print("after: the console again")
    finally:
        logger.removeHandler(handler)
    out = capfd.readouterr().out
    assert out.splitlines() == ["[0:01] validate_spec done", "the summary", "after: the console again"]
    text = log.read_text()
    for written in ("print() to sys.stdout", "a warning on sys.stderr", "straight to file descriptor 1",
                    "a child process", "its stderr", "Pushing xcom", "Traceback (most recent call last)",
                    "RuntimeError: attempt 1 ended with exit status 137"):
        assert written in text, written
    assert handler.stream is sys.stdout  # put back


def test_a_stdout_without_a_file_descriptor_is_written_to_directly(tmp_path, monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stdout", captured)
    with output_to_file(tmp_path / "job.log") as stream:
        stream.write("a line for a person\n")
        print("for the file")
    assert captured.getvalue() == "a line for a person\n"
    assert (tmp_path / "job.log").read_text() == "for the file\n"
