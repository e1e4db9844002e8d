"""The job log: one stream for all attempts of a run; each attempt's section opens and closes with a `[sat]` line."""

from __future__ import annotations

from datetime import datetime

# Every (re)start of training writes this line (the service's users look for it).
START_MARKER = "Starting dataset initialization"


def job_log_header(*, job: str, attempt: int, node: str | None, at: datetime, note: str = START_MARKER) -> str:
    """The line that opens one attempt's section of a run's job.log (both backends write it).

    Local: the attempt starts here, so the line carries `START_MARKER`. Kubernetes: the
    pod's own first log line carries the marker, so `note` names the pod whose log follows.
    """
    return f"{at.isoformat()} [sat] attempt {attempt} of job {job} on node {node or 'no node'}: {note}"


def exit_status(code: int | None) -> int | None:
    """The exit status as the attempt's record and the Attempts tab say it: a process a signal ended (Python's
    negative return code, -9) as a container runtime and a pod report it, 128 + the signal (137)."""
    return 128 - code if code is not None and code < 0 else code


def job_log_footer(*, attempt: int, at: datetime, exit_code: int | None, note: str | None = None) -> str:
    """The line that closes one attempt's section of a run's job.log (both backends write it); its exit status is
    the one the attempt's record holds (`exit_status`: 137, not -9)."""
    status = "unknown" if exit_code is None else exit_status(exit_code)
    return f"{at.isoformat()} [sat] attempt {attempt} ended: exit status {status}" + (f" ({note})" if note else "")
