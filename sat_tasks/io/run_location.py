"""Where a run's files are: the worker disk that staged them, checked by every later task (issue 48.1).

The local backend keeps a run's staged data, outputs and job log in the worker's work
directory (`JobRun.run_dir`, under `[sat] work_dir`). Its scope is one host, or workers that
share one work directory (the same `[sat] work_dir` on a shared file system): a task that runs
on a worker without the run's files would train on nothing or upload nothing. Spanning hosts
is the Kubernetes backend's business (the run's files are on a claim every pod mounts).

`mark` (stage_data, after staging) writes a marker with a fresh token into the run's directory,
and the same marker to Object Storage (`<results>/run-location.json`). `check` (every later
task) reads the Object Storage copy and the file in this worker's run directory: the same token
means this worker sees the run's files (the host that staged them, or a shared work
directory); another token or none raises `RunFilesElsewhere`, naming where they were staged
and where this task runs. A run with no marker in Object Storage (the backend staged no file
on the worker, as on Kubernetes, or a run staged before this rule) is not checked.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from datetime import UTC, datetime
from typing import Any

from sat_tasks import config
from sat_tasks.core.handoffs import Log
from sat_tasks.errors import SatError
from sat_tasks.io import object_storage as storage
from sat_tasks.io.run_layout import JobRun

MARKER_NAME = ".sat-run-location.json"  # in the run's directory
OBJECT_NAME = "run-location.json"  # under the run's results prefix

SCOPE = ("the local backend runs a job on one host, or on workers that share one work directory "
         "([sat] work_dir on a shared file system); run jobs across hosts on the Kubernetes backend")


class RunFilesElsewhere(SatError):
    """This task's worker does not see the run's files (another host's work directory): retried, then failed."""


def object_uri(run: JobRun) -> str:
    return run.results_uri + OBJECT_NAME


def this_worker() -> dict[str, str]:
    """Where a task runs: the host name and the work directory it sees."""
    return {"host": socket.gethostname(), "work_dir": str(config.work_dir())}


def mark(run: JobRun, log: Log = print) -> dict[str, Any] | None:
    """After staging: the marker in the run's directory and in Object Storage; None when nothing was staged here."""
    if not run.data_dir.is_dir():  # the backend staged the data elsewhere (a pod's claim)
        return None
    marker = {"token": secrets.token_hex(16), **this_worker(), "run_dir": str(run.run_dir),
              "staged_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = run.run_dir / MARKER_NAME
    partial = path.with_name(f"{MARKER_NAME}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(marker))
    partial.replace(path)
    storage.write_json(run.hook(), object_uri(run), marker)
    log(f"the run's files are on {marker['host']} in {marker['run_dir']} (marker {MARKER_NAME}): "
        "every later task checks that it sees them")
    return marker


def problem(run: JobRun) -> str | None:
    """Why this worker does not see the run's files, or None when it does (or the run keeps none on a worker)."""
    expected = storage.read_json(run.hook(), object_uri(run))
    if not isinstance(expected, dict) or not expected.get("token"):
        return None
    try:
        found = json.loads((run.run_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        found = None
    if isinstance(found, dict) and found.get("token") == expected["token"]:
        return None
    here = this_worker()
    what = ("another run's marker" if isinstance(found, dict) else "no marker") + f" in {run.run_dir}"
    return (f"this task runs on {here['host']} (work directory {here['work_dir']}) and finds {what}, but the "
            f"run's files were staged on {expected.get('host')} in {expected.get('run_dir')} "
            f"at {expected.get('staged_at')}: {SCOPE}")


def check(run: JobRun, log: Log = print) -> None:
    """Raise `RunFilesElsewhere` unless this worker sees the run's files (see the module's doc)."""
    why = problem(run)
    if why is not None:
        log(f"[sat] {why}")
        raise RunFilesElsewhere(why)
