"""A job DAG file's time budget under the DAG processor's limits, and the report of the specs it skipped.

The processor kills a file's parse after `[dag_processor] dag_file_processor_timeout` seconds
(import, then serializing every DAG), and the import alone after `[core] dagbag_import_timeout`.
A killed parse leaves nothing: no DAG and no import error. So a job DAG file stops building
when it has used its share of those limits (`BUILD_SHARE_*`: serializing costs about what
building did), logs the specs it skipped, and leaves a report that `sat_job_spec_errors.py`
turns into an import error a person sees in the UI. A later pass that builds everything
removes the report.

In the DAG processor the reports are kept in the metadata DB, as Airflow Variables
`sat_parse_skips.<DAG file>` written through the processor's manager (`report_store`): every
replica, and a restarted processor, reports every kept skip. Each pass writes its file's key
once (a report, or its removal), a few KB at most. The spec verdicts the errors file reuses
are a per-machine cache in a private temp folder (`report_dir`): a processor without them
validates the specs itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

log = logging.getLogger("sat.dag_parse")

# Building may use this share of the import timeout (the import must end before it)...
BUILD_SHARE_OF_IMPORT = 0.8
# ...and of the processor's timeout: serializing the DAGs built takes up to about as long again, and
# more when the load rises meanwhile. Measured at 5,000 specs on 2 cores at load 16-30 with 0.4 (20 s
# of 50): files took 23-38 s, and one was killed (117 DAGs built in 20 s, then serialized past 50 s),
# which marks all its DAGs stale with no import error. 0.3 leaves that margin; a quiet machine
# builds a 5,000-spec shard in 6-8 s, well within it.
BUILD_SHARE_OF_PROCESSOR = 0.3
# A report older than this is from a pass long gone (a file removed, a jobs_dir changed): ignored.
REPORT_MAX_AGE_SECONDS = 3600.0
# Skipped spec files a report names in a log line or an import error; the others are counted. Both
# travel from the parsing child to the DAG processor's manager, which reads 4 KiB of a child's
# socket per turn of its loop: measured at 5,000 specs on a loaded machine, an import error that
# named all 4,835 skipped files (414 KB, sent three times) kept `sat_job_spec_errors.py` past the
# processor's timeout, so it was killed and no job DAG file's skips were shown (ADR 0023).
NAMED_SKIPPED = 10


@dataclass(frozen=True)
class ParseBudget:
    """How long a job DAG file may build DAGs, counted from `started` (time.monotonic())."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def spent(self) -> float:
        return time.monotonic() - self.started

    def exhausted(self) -> bool:
        return self.spent() >= self.seconds


def build_seconds(import_timeout: float, processor_timeout: float) -> float:
    """The seconds a file may spend building its DAGs under these two limits (<= 0: no limit)."""
    limits = [share * limit for share, limit in ((BUILD_SHARE_OF_IMPORT, import_timeout),
                                                (BUILD_SHARE_OF_PROCESSOR, processor_timeout)) if limit > 0]
    return min(limits, default=float("inf"))


def parse_budget(fileloc: str, started: float | None = None) -> ParseBudget:
    """The budget of the DAG file `fileloc` from Airflow's configuration (and its import-timeout policy)."""
    from airflow.configuration import conf

    import_timeout = conf.getfloat("core", "dagbag_import_timeout", fallback=30.0)
    try:
        from airflow import settings

        import_timeout = float(settings.get_dagbag_import_timeout(fileloc))
    except Exception as exc:  # noqa: BLE001 - no policy hook here (a task runner, an older Airflow)
        log.debug("no dagbag_import_timeout policy for %s (%s): the configured %gs", fileloc, exc, import_timeout)
    processor_timeout = conf.getfloat("dag_processor", "dag_file_processor_timeout", fallback=50.0)
    seconds = build_seconds(import_timeout, processor_timeout)
    return ParseBudget(seconds) if started is None else ParseBudget(seconds, started)


@dataclass(frozen=True)
class SkipReport:
    """What one SAT DAG file left out of its last pass: the spec files it had no time for (`built`: those done).

    `skipped` may name only the first few of them (a report read back from the metadata DB
    keeps `NAMED_SKIPPED`); `left_out` counts them all.
    """

    dag_file: str
    skipped: tuple[str, ...]
    built: int
    spent_seconds: float
    budget_seconds: float
    total_skipped: int = 0  # when more than `skipped` names (a stored report names a few)
    host: str = ""  # the DAG processor that made the pass ("" when not said)
    at: float = 0.0  # when (time.time()), 0: not said

    @property
    def left_out(self) -> int:
        return max(self.total_skipped, len(self.skipped))

    def lines(self, named: int = NAMED_SKIPPED) -> list[str]:
        """What the report says: one line of why, then the first `named` skipped files (the rest counted)."""
        said = [f"at {time.strftime('%H:%M:%SZ', time.gmtime(self.at))}"] if self.at else []
        said += [f"on {self.host}"] if self.host else []
        where = f", in its pass {' '.join(said)}" if said else ""
        head = (f"{self.dag_file}: stopped after {self.spent_seconds:.1f}s of its {self.budget_seconds:.1f}s "
                f"parse budget ({self.built} done{where}); {self.left_out} spec file(s) were left out of this pass "
                f"(more job DAG files, fewer specs, a less busy DAG processor, or a longer "
                f"[core] dagbag_import_timeout / [dag_processor] dag_file_processor_timeout: \"Sizing the DAG "
                f"processor\" in docs/operator-guide.md):")
        more = self.left_out - min(named, len(self.skipped))
        return ([head] + [f"  {path}" for path in self.skipped[:named]]
                + ([f"  ... and {more} more spec file(s)"] if more > 0 else []))

    def to_json(self, jobs_dir: str | Path) -> str:
        """The report as kept in the metadata DB: bounded whatever the numbers (`NAMED_SKIPPED` names)."""
        return json.dumps({"dag_file": self.dag_file, "jobs_dir": _jobs_key(jobs_dir),
                           "skipped": [path[:MAX_PATH_CHARS] for path in self.skipped[:NAMED_SKIPPED]],
                           "left_out": self.left_out, "built": self.built, "spent_seconds": self.spent_seconds,
                           "budget_seconds": self.budget_seconds, "host": self.host[:MAX_PATH_CHARS],
                           "at": self.at})

    @classmethod
    def from_json(cls, text: str) -> tuple[str, SkipReport]:
        """`(jobs_dir, report)` of a kept report; ValueError/KeyError/TypeError when it is not one.

        Bounded as written, whatever the text says (anyone who may edit Variables could write one).
        """
        data = json.loads(text)
        cut = MAX_PATH_CHARS
        report = cls(str(data["dag_file"])[:cut], tuple(str(path)[:cut] for path in data["skipped"][:NAMED_SKIPPED]),
                     int(data["built"]), float(data["spent_seconds"]), float(data["budget_seconds"]),
                     int(data["left_out"]), str(data.get("host", ""))[:cut], float(data.get("at", 0.0)))
        return str(data["jobs_dir"]), report


# ---- where the reports are kept --------------------------------------------------------------------------
# In the DAG processor, as Airflow Variables `sat_parse_skips.<DAG file>` in the metadata DB, written and
# read through the processor's own channel to its manager (Airflow 3 blocks the ORM in a parsing child):
# every replica and a restarted processor read what any of them wrote. Elsewhere (a DagBag in one
# process, a task runner parsing its DAG's file): in this process only, so nothing else is touched.
VARIABLE_PREFIX = "sat_parse_skips."
VARIABLE_DESCRIPTION = ("SAT: the spec files this DAG file left out of its last pass (parse budget, ADR 0023); "
                        "sat_job_spec_errors.py shows it as an import error, a pass that builds every spec removes it")
MAX_PATH_CHARS = 300  # a spec file's path (or a host name) in a kept report, at most


class ReportStore(Protocol):
    """Where skip reports are kept: a key per DAG file (`VARIABLE_PREFIX` + its name), a JSON text each."""

    def put(self, key: str, value: str) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def get(self, key: str) -> str | None: ...


class AirflowVariables:
    """The reports as Airflow Variables in the metadata DB, through the Task SDK (the DAG processor's manager)."""

    def put(self, key: str, value: str) -> None:
        from airflow.sdk import Variable

        Variable.set(key, value, description=VARIABLE_DESCRIPTION)

    def delete(self, key: str) -> None:
        from airflow.sdk import Variable

        Variable.delete(key)

    def keys(self, prefix: str) -> list[str]:
        from airflow.sdk import Variable

        return list(Variable.keys(prefix=prefix))

    def get(self, key: str) -> str | None:
        from airflow.sdk import Variable

        return Variable.get(key, default=None)


class InProcess:
    """The reports in this process only (no DAG processor here: a DagBag, a test, a task runner)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self.values if key.startswith(prefix))

    def get(self, key: str) -> str | None:
        return self.values.get(key)


IN_PROCESS = InProcess()
# The function of Airflow's DAG processor that parses a DAG file in the processor's child (Airflow 3.x):
# a DAG file imported under it is a pass of the processor (tests/sat_tasks/airflow/test_parse_budget.py
# checks that Airflow still has it).
PROCESSOR_PARSE = ("airflow.dag_processing.processor", "_parse_file")


def in_dag_processor() -> bool:
    """Whether this code runs in a DAG processor's parse of a DAG file (not a task runner's, not a DagBag's)."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    if getattr(runner, "SUPERVISOR_COMMS", None) is None:
        return False
    module, function = PROCESSOR_PARSE
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False


def report_store() -> ReportStore:
    """The metadata DB's Variables in a DAG processor's pass; this process's memory anywhere else."""
    return AirflowVariables() if in_dag_processor() else IN_PROCESS


def _jobs_key(jobs_dir: str | Path) -> str:
    return os.fspath(Path(jobs_dir).resolve())[:MAX_PATH_CHARS]


def variable_key(dag_file: str) -> str:
    return f"{VARIABLE_PREFIX}{Path(dag_file).name}"


def record_pass(jobs_dir: str | Path, report: SkipReport, store: ReportStore | None = None) -> None:
    """Log and keep the report of a pass that skipped specs; a pass that skipped none removes the kept one.

    One small write per pass (a report names `NAMED_SKIPPED` files and counts the rest). A store
    that fails is logged: the pass's DAGs matter more than its report.
    """
    store = report_store() if store is None else store
    key = variable_key(report.dag_file)
    try:
        if not report.skipped:
            store.delete(key)
            return
        report = replace(report, host=report.host or socket.gethostname(), at=report.at or time.time())
        log.warning("%s", "\n".join(report.lines()))
        store.put(key, report.to_json(jobs_dir))
    except Exception as exc:  # noqa: BLE001 - the manager's channel or the DB: the log line above still says it
        log.warning("could not keep the skip report of %s (%s): %s", report.dag_file, key, exc)


def read_reports(jobs_dir: str | Path, dag_files: set[str] | None = None,
                 store: ReportStore | None = None) -> list[SkipReport]:
    """The kept skip reports of `jobs_dir`'s DAG files (only those named in `dag_files`, when given).

    A report stays until a pass of its file builds everything; one older than
    `REPORT_MAX_AGE_SECONDS` is from a pass long gone (a file removed, a processor stopped): ignored.
    """
    store = report_store() if store is None else store
    wanted = _jobs_key(jobs_dir)
    reports = []
    try:
        keys = sorted(store.keys(VARIABLE_PREFIX))
    except Exception as exc:  # noqa: BLE001 - no channel to the metadata DB: nothing to show, and say so
        log.warning("could not read the skip reports (%s*): %s", VARIABLE_PREFIX, exc)
        return []
    for key in keys:
        name = key[len(VARIABLE_PREFIX):]
        if dag_files is not None and name not in dag_files:
            continue
        try:
            text = store.get(key)
            if text is None:
                continue  # removed meanwhile
            jobs, report = SkipReport.from_json(text)
        except Exception as exc:  # noqa: BLE001 - damaged, or not SAT's: the next pass writes it again
            log.debug("skip report %s not read: %s", key, exc)
            continue
        if jobs == wanted and report.skipped and time.time() - report.at <= REPORT_MAX_AGE_SECONDS:
            reports.append(report)
    return reports


def report_dir(jobs_dir: str | Path) -> Path:
    """Where the job DAG files of `jobs_dir` leave their spec verdicts (private to this user, this machine)."""
    digest = hashlib.sha256(os.fspath(Path(jobs_dir).resolve()).encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"sat-dag-parse-{uid}" / digest


def _ours(folder: Path) -> bool:
    """Whether the verdicts' top folder belongs to this user alone (a shared temp dir: trust nothing else)."""
    top = folder.parent
    try:
        st = top.lstat()
    except OSError:
        return False
    owned = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return owned and not (st.st_mode & 0o077) and not top.is_symlink()


def _keep_private(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` in the private folder, whole or not at all."""
    path.parent.parent.mkdir(mode=0o700, exist_ok=True)
    if not _ours(path.parent):
        raise OSError(f"{path.parent.parent} is not this user's alone")
    path.parent.mkdir(mode=0o700, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(json.dumps(data))
    os.replace(part, path)


def record_verdicts(jobs_dir: str | Path, dag_file: str, verdicts: dict) -> None:
    """Keep what a DAG file's pass found of the specs it validated (`spec.loading.spec_verdicts`).

    `sat_job_spec_errors.py` must check every spec, in a process of its own: it reuses these
    verdicts for the spec files still at the version they were found at, instead of reading
    and validating each spec a second time per pass (5,000 specs: ~6 s of CPU, most of it YAML).
    """
    try:
        _keep_private(report_dir(jobs_dir) / f"{Path(dag_file).stem}.verdicts", verdicts)
    except OSError as exc:  # the errors file validates the specs itself
        log.debug("could not keep the spec verdicts of %s: %s", dag_file, exc)


def read_verdicts(jobs_dir: str | Path) -> dict:
    """The recent verdicts of `jobs_dir`'s DAG files merged (`spec.loading.spec_dag_id` reads them); {}: none."""
    folder = report_dir(jobs_dir)
    merged: dict = {}
    now = time.time()
    for path in sorted(folder.glob("*.verdicts")) if folder.is_dir() and _ours(folder) else []:
        try:
            if now - path.stat().st_mtime > REPORT_MAX_AGE_SECONDS:
                continue
            data = json.loads(path.read_text())
            if merged and data["rules"] != merged["rules"]:
                continue  # written under other spec rules (an upgrade between passes)
            merged = {"rules": data["rules"], "specs": {**merged.get("specs", {}), **dict(data["specs"])}}
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced: those specs are validated again
    return merged
