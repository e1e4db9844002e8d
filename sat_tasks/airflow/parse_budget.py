"""A job DAG file's time budget under the DAG processor's limits, and the report of the specs it skipped.

The processor kills a file's parse after `[dag_processor] dag_file_processor_timeout` seconds
(import, then serializing every DAG), and the import alone after `[core] dagbag_import_timeout`.
A killed parse leaves nothing: no DAG and no import error. So a job DAG file stops building
when it has used its share of those limits (`BUILD_SHARE_*`: serializing costs about what
building did), logs the specs it skipped, and leaves a report that `sat_job_spec_errors.py`
turns into an import error a person sees in the UI. A later pass that builds everything
removes the report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    """What one SAT DAG file left out of its last pass: the spec files it had no time for (`built`: those done)."""

    dag_file: str
    skipped: tuple[str, ...]
    built: int
    spent_seconds: float
    budget_seconds: float

    def lines(self, named: int = NAMED_SKIPPED) -> list[str]:
        """What the report says: one line of why, then the first `named` skipped files (the rest counted)."""
        head = (f"{self.dag_file}: stopped after {self.spent_seconds:.1f}s of its {self.budget_seconds:.1f}s "
                f"parse budget ({self.built} done); {len(self.skipped)} spec file(s) were left out of this pass "
                f"(more job DAG files, fewer specs, a less busy DAG processor, or a longer "
                f"[core] dagbag_import_timeout / [dag_processor] dag_file_processor_timeout):")
        more = len(self.skipped) - named
        return ([head] + [f"  {path}" for path in self.skipped[:named]]
                + ([f"  ... and {more} more spec file(s)"] if more > 0 else []))


def report_dir(jobs_dir: str | Path) -> Path:
    """Where the job DAG files of `jobs_dir` leave their skip reports (private to this user)."""
    digest = hashlib.sha256(os.fspath(Path(jobs_dir).resolve()).encode()).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"sat-dag-parse-{uid}" / digest


def _report_path(jobs_dir: str | Path, dag_file: str) -> Path:
    return report_dir(jobs_dir) / f"{Path(dag_file).stem}.json"


def _ours(folder: Path) -> bool:
    """Whether the reports' top folder belongs to this user alone (a shared temp dir: trust nothing else)."""
    top = folder.parent
    try:
        st = top.lstat()
    except OSError:
        return False
    owned = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return owned and not (st.st_mode & 0o077) and not top.is_symlink()


def record_pass(jobs_dir: str | Path, report: SkipReport) -> None:
    """Log and keep the report of a pass that skipped specs; a pass that skipped none removes the old one."""
    path = _report_path(jobs_dir, report.dag_file)
    if not report.skipped:
        path.unlink(missing_ok=True)
        return
    whole = [f"  (all {len(report.skipped)} listed in {path})"] if len(report.skipped) > NAMED_SKIPPED else []
    log.warning("%s", "\n".join(report.lines() + whole))
    try:
        _keep_private(path, {"dag_file": report.dag_file, "skipped": list(report.skipped), "built": report.built,
                             "spent_seconds": report.spent_seconds, "budget_seconds": report.budget_seconds})
    except OSError as exc:  # the log line above still says it
        log.warning("could not keep the skip report of %s in %s: %s", report.dag_file, path.parent, exc)


def _keep_private(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` in the private report folder, whole or not at all."""
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


def read_reports(jobs_dir: str | Path, dag_files: set[str] | None = None) -> list[SkipReport]:
    """The recent skip reports of `jobs_dir`'s job DAG files (only those named in `dag_files`, when given)."""
    folder = report_dir(jobs_dir)
    reports = []
    now = time.time()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() and _ours(folder) else []:
        try:
            if now - path.stat().st_mtime > REPORT_MAX_AGE_SECONDS:
                continue
            data = json.loads(path.read_text())
            report = SkipReport(str(data["dag_file"]), tuple(map(str, data["skipped"])), int(data["built"]),
                                float(data["spent_seconds"]), float(data["budget_seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not ours: the next pass writes it again
        if report.skipped and (dag_files is None or Path(report.dag_file).name in dag_files):
            reports.append(report)
    return reports
