"""The job log's `[sat]` lines (issue 45.6): an attempt's end says the exit status its record and the Attempts tab say."""

from __future__ import annotations

import signal
from datetime import UTC, datetime

import pytest

from sat_tasks.core.joblog import exit_status, job_log_footer

AT = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("returned", "said"), [
    pytest.param(-signal.SIGKILL, 137, id="sigkill-is-137-not-minus-9"),
    pytest.param(-signal.SIGTERM, 143, id="sigterm-is-143"),
    pytest.param(137, 137, id="a-runtimes-137-stays"),
    pytest.param(0, 0, id="success"),
    pytest.param(1, 1, id="an-error"),
])
def test_the_footer_says_the_exit_status_the_record_holds(returned, said):
    assert exit_status(returned) == said
    line = job_log_footer(attempt=1, at=AT, exit_code=returned)
    assert line == f"{AT.isoformat()} [sat] attempt 1 ended: exit status {said}"
    assert "-9" not in line


def test_an_attempt_a_signal_ended_says_137_in_its_job_log_as_in_its_record(tmp_path):
    """A local attempt whose command SIGKILLs itself: the record's exit code and the job log's last line agree."""
    from sat_tasks.backends.local.runner import LocalAttempt

    (tmp_path / "code").mkdir()
    record = LocalAttempt(
        job="joblog-job", attempt=1, node="n1", command="kill -9 $$", env={"SAT_OUTPUT_DIR": str(tmp_path / "out")},
        cwd=tmp_path / "code", output_dir=tmp_path / "out", job_log=tmp_path / "job.log",
        node_dir=tmp_path / "nodes" / "n1", faults=[], heartbeat_timeout=30.0, grace_seconds=5.0,
        poll_seconds=0.05, startup_timeout=1800.0).run(lambda _line: None)
    assert record.exit_code == 137 and record.signal == signal.SIGKILL
    last = (tmp_path / "job.log").read_text().splitlines()[-1]
    assert last.endswith("[sat] attempt 1 ended: exit status 137"), last
