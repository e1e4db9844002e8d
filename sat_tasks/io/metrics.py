"""Read a run's metrics series (`metrics/attempt-<k>/<node>/<series>.jsonl`, written by `ckpt_engine.metrics`).

A source is a local directory (a run's results as downloaded, or the local backend's run
directory: either holds `metrics/`) or an `s3://` results URI (`<results>/<job>/<run_id>/`).
A line that is not a JSON object is a problem named `<file>:<line>: <why>`; the other lines
and files are still read. `monitoring_series` is what the Training Jobs page plots: plain
dicts, no plotting library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_engine.contract import (
    HOST_DEVICE,
    METRICS_DIR,
    REPORT_NAME,
    SERIES,
    STATUS_NAME,
)
from sat_tasks.core.bounded import ObjectTooLargeError, json_objects, read_file
from sat_tasks.core.handoffs import VerdictKind


@dataclass
class RunMetrics:
    """Every record of a run by series (sorted by time), the status history, and what could not be read."""

    source: str
    records: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {s: [] for s in SERIES})
    history: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def add_file(self, name: str, text: str) -> None:
        """Parse one JSON-lines file; bad lines become problems naming the file and the line."""
        self.files.append(name)
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                self.problems.append(f"{name}:{number}: not JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("time"), (int, float)):
                self.problems.append(f"{name}:{number}: not a metrics record (an object with a numeric 'time')")
                continue
            series = record.get("series") or Path(name).stem
            if series not in self.records:
                self.problems.append(f"{name}:{number}: unknown series {series!r}")
                continue
            self.records[series].append(record)

    def finish(self) -> RunMetrics:
        for records in self.records.values():
            records.sort(key=lambda r: r["time"])
        return self


def _is_series_file(name: str) -> bool:
    return name.endswith(".jsonl") and Path(name).stem in SERIES


def read_local(directory: str | Path) -> RunMetrics:
    """The metrics under a local run directory (`<dir>/metrics/` or the metrics directory itself)."""
    root = Path(directory)
    metrics_root = root / METRICS_DIR if (root / METRICS_DIR).is_dir() else root
    found = RunMetrics(source=str(root))
    for path in sorted(metrics_root.rglob("*.jsonl")):
        name = f"{METRICS_DIR}{path.relative_to(metrics_root).as_posix()}"
        if _is_series_file(name):  # the training process writes these: each read is bounded
            try:
                found.add_file(name, read_file(path).decode("utf-8", errors="replace"))
            except (ObjectTooLargeError, OSError) as exc:
                found.problems.append(f"{name}: {exc}")
    for extra, attribute in ((STATUS_NAME, "history"), (REPORT_NAME, "report")):
        path = root / extra
        if path.is_file():
            try:
                setattr(found, attribute, json.loads(read_file(path)))
            except ObjectTooLargeError as exc:
                found.problems.append(f"{extra}: {exc}")
            except ValueError as exc:
                found.problems.append(f"{extra}: not JSON ({exc})")
    return found.finish()


def read_object_storage(results_uri: str, hook: Any = None) -> RunMetrics:
    """The metrics of a run in Object Storage (`results_uri` = `<results>/<job>/<run_id>/`)."""
    from sat_tasks.io import object_storage as storage
    from sat_tasks.spec import split_s3_uri

    if hook is None:
        from sat_tasks.config import sat_setting

        hook = storage.object_storage_hook(sat_setting("object_storage_conn_id"))
    base = results_uri if results_uri.endswith("/") else results_uri + "/"
    bucket, prefix = split_s3_uri(base + METRICS_DIR)
    found = RunMetrics(source=base)
    for key in sorted(hook.list_keys(bucket_name=bucket, prefix=prefix) or []):
        name = f"{METRICS_DIR}{key[len(prefix):]}"
        if _is_series_file(name):  # the training process writes these: each read is bounded
            try:
                data = storage.read_bounded(hook, base + name)
            except ObjectTooLargeError as exc:
                found.problems.append(f"{name}: {exc}")
                continue
            if data is not None:
                found.add_file(name, data.decode("utf-8", errors="replace"))
    for extra, attribute in ((STATUS_NAME, "history"), (REPORT_NAME, "report")):
        try:
            value = storage.read_json(hook, base + extra)
        except ObjectTooLargeError as exc:
            found.problems.append(f"{extra}: {exc}")
            continue
        except ValueError as exc:
            found.problems.append(f"{extra}: not JSON ({exc})")
            continue
        if value is not None:
            setattr(found, attribute, value)
    return found.finish()


def read_metrics(source: str | Path, hook: Any = None) -> RunMetrics:
    """`read_object_storage` for an `s3://` URI, else `read_local`."""
    if str(source).startswith("s3://"):
        return read_object_storage(str(source), hook)
    return read_local(source)


# ---- the orchestrator's job records --------------------------------------------------------------
# SAT itself (decide, finalize) appends to this file: one `attempt_end` record per attempt
# and a `final` one, so a job's series say how each attempt ended even when the attempt's
# own processes died before their first interval (ADR 0015).
ORCHESTRATOR_SERIES = f"{METRICS_DIR}sat/job.jsonl"


def append_job_record(hook: Any, results_uri: str, record: dict[str, Any]) -> dict[str, Any]:
    """Append one record to `<results>/metrics/sat/job.jsonl` (one writer at a time: decide, then finalize).

    Returns the record as written (with its `series` and `device`).
    """
    from sat_tasks.spec import split_s3_uri

    base = results_uri if results_uri.endswith("/") else results_uri + "/"
    bucket, key = split_s3_uri(base + ORCHESTRATOR_SERIES)
    text = _job_series_text(hook, base)
    written = {"series": "job", "device": HOST_DEVICE, **record}
    hook.load_string(text + json.dumps(written, separators=(",", ":"), default=str) + "\n", key=key,
                     bucket_name=bucket, replace=True)
    return written


def read_job_records(hook: Any, results_uri: str) -> list[dict[str, Any]]:
    """The records of `<results>/metrics/sat/job.jsonl` (lines that are not JSON objects left out)."""
    base = results_uri if results_uri.endswith("/") else results_uri + "/"
    return json_objects(_job_series_text(hook, base))


def _job_series_text(hook: Any, base: str) -> str:
    """job.jsonl's text ('' before its first record).

    It lies under the run's results, where the run's training may write too: read within the bound
    (ObjectTooLargeError names it).
    """
    from sat_tasks.io.object_storage import read_bounded

    return (read_bounded(hook, base + ORCHESTRATOR_SERIES) or b"").decode("utf-8", errors="replace")


# ---- what the plots need -----------------------------------------------------------------------
def attempt_spans(metrics: RunMetrics) -> list[dict[str, Any]]:
    """Per attempt: node, start, first-step and end times, first and last step, from every series SAT keeps.

    The attempt's own series (training samples, the sidecar's `Starting` sample and its
    `first_step` record) give the start and the first training step; SAT's `attempt_end`
    record gives how and when it ended and its last step, also for an attempt that died
    before its first interval. Without that record the end is the attempt's last sample.
    """
    spans: dict[int, dict[str, Any]] = {}

    def span(record: dict[str, Any]) -> dict[str, Any] | None:
        attempt = record.get("attempt")
        if not isinstance(attempt, int):
            return None
        found = spans.setdefault(attempt, {"attempt": attempt, "node": None, "start_time": None,
                                           "first_step_time": None, "first_time": None, "last_time": None,
                                           "first_step": None, "last_step": None, "end": None})
        if record.get("node") and record.get("node") != "sat" and not found["node"]:
            found["node"] = record["node"]
        return found

    for record in metrics.records["job"]:
        found = span(record)
        if found is None:
            continue
        event = record.get("event")
        if event == "attempt_end":
            found["end"] = record
            found["node"] = record.get("node") or found["node"]
        elif event == "first_step":
            found["first_step_time"] = found["first_step_time"] or record["time"]
            if found["first_step"] is None:
                found["first_step"] = record.get("step")
        elif event is None and found["start_time"] is None:
            found["start_time"] = record["time"]
    for record in metrics.records["training"]:
        found = span(record)
        if found is None:
            continue
        found["first_time"] = found["first_time"] or record["time"]
        found["last_time"] = record["time"]
        if found["first_step"] is None:
            found["first_step"] = record.get("global_step")
        found["last_step"] = record.get("global_step")
    for found in spans.values():
        end = found.pop("end")
        found["first_step_time"] = found["first_step_time"] or found["first_time"]
        found["start_time"] = found["start_time"] or found["first_step_time"]
        found["ended_at"] = found["last_time"]
        found["verdict"] = found["decision"] = found["status"] = None
        if end:
            ended_at = end.get("ended_at")  # the training may write this series too: a number, else the record's time
            numeric = isinstance(ended_at, (int, float)) and not isinstance(ended_at, bool)
            found["ended_at"] = ended_at if numeric and ended_at else end["time"]
            found["last_step"] = end.get("last_step", found["last_step"])
            found["verdict"], found["decision"], found["status"] = end.get("verdict"), end.get("action"), end.get("status")
            if found["first_step"] is None and end.get("resumed_from_step") is not None:
                found["first_step"] = end["resumed_from_step"]
    return [spans[k] for k in sorted(spans) if k > 0]


def _history_times(metrics: RunMetrics) -> tuple[list[float], list[float]]:
    from datetime import datetime

    def stamp(entry: dict[str, Any]) -> float | None:
        try:
            return datetime.fromisoformat(entry["at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return None

    running = [t for t in (stamp(e) for e in metrics.history if e.get("status") == "Running") if t is not None]
    every = [t for t in (stamp(e) for e in metrics.history) if t is not None]
    return running, every


def job_summary(metrics: RunMetrics) -> dict[str, Any]:
    """Goodput (training time / wall time) and the recovery time of each fault.

    Training time is the sum over attempts of first training step to end; wall time runs
    from the first `Running` in the status history (else the first record) to the last
    entry (else the last record). A fault is an attempt that ended other than in success
    (SAT's `attempt_end` record; without one, any attempt followed by another); its
    recovery runs from its end to the next attempt's first training step.
    """
    spans = attempt_spans(metrics)
    if not spans:
        return {"goodput": None, "training_s": 0.0, "wall_s": None, "faults": []}
    running, every = _history_times(metrics)
    times = [t for s in spans for t in (s["start_time"], s["first_step_time"], s["ended_at"]) if t is not None]
    times += [r["time"] for r in metrics.records["job"] if r.get("event") == "final"]
    if not times:
        return {"goodput": None, "training_s": 0.0, "wall_s": None, "faults": []}
    start, end = min([*times, *running]), max([*times, *every])
    training = sum(s["ended_at"] - s["first_step_time"] for s in spans
                   if s["ended_at"] is not None and s["first_step_time"] is not None)
    faults = []
    for index, before in enumerate(spans):
        after = spans[index + 1] if index + 1 < len(spans) else None
        if before["verdict"] is not None:
            if before["verdict"] == VerdictKind.SUCCEEDED.value or before["decision"] == "upload":
                continue
        elif after is None:
            continue
        if before["verdict"] == VerdictKind.PLANNED_RESTART.value:  # an elastic job growing back (ADR 0029): no fault
            continue
        resumed_at = (after["first_step_time"] or after["start_time"]) if after else None
        status = before["status"] or next((e["status"] for e in metrics.history if e.get("attempt") == before["attempt"]
                                           and e.get("status") not in ("Running", "Pending")), None)
        faults.append({
            "attempt": before["attempt"], "node": before["node"], "next_node": after["node"] if after else None,
            "status": status, "verdict": before["verdict"],
            "last_step": before["last_step"], "resumed_at_step": after["first_step"] if after else None,
            "ended_at": before["ended_at"], "resumed_at": resumed_at,
            "recovery_s": round(resumed_at - before["ended_at"], 3)
            if resumed_at is not None and before["ended_at"] is not None else None,
        })
    wall = end - start
    return {"goodput": round(training / wall, 4) if wall > 0 else None, "training_s": round(training, 3),
            "wall_s": round(wall, 3), "faults": faults}


def monitoring_series(metrics: RunMetrics) -> dict[str, Any]:
    """What the Training Jobs page's Monitoring tab plots, as plain dicts (times in Unix seconds).

    `loss` and `throughput` from the training series, `checkpoints` (one per save), `system`
    (the host's CPU and memory) and `gpus` (by device; empty without a GPU), `attempts` (spans
    with node and steps) and `faults` / `goodput` (`job_summary`), `problems` (unreadable lines).
    """
    keep = ("time", "attempt", "node")
    training = metrics.records["training"]
    gpus: dict[str, list[dict[str, Any]]] = {}
    for record in metrics.records["system"]:
        if str(record.get("device", "")).startswith("gpu"):
            gpus.setdefault(f"{record.get('node')}/{record['device']}", []).append(record)
    summary = job_summary(metrics)
    return {
        "loss": [{k: r.get(k) for k in (*keep, "global_step", "loss")} for r in training if "loss" in r],
        "throughput": [{k: r.get(k) for k in (*keep, "global_step", "steps_per_second", "samples_per_second",
                                              "tokens_per_second")} for r in training if "steps_per_second" in r],
        "checkpoints": [{k: r.get(k) for k in (*keep, "step", "blocking_s", "persist_s", "bytes")}
                        for r in metrics.records["checkpoint"] if r.get("event") == "save"],
        "system": [{k: r.get(k) for k in (*keep, "cpu_percent", "memory_used_bytes", "memory_total_bytes")}
                   for r in metrics.records["system"] if r.get("device") == HOST_DEVICE],
        "gpus": gpus,
        "attempts": attempt_spans(metrics),
        "faults": summary["faults"],
        "goodput": summary["goodput"],
        "problems": list(metrics.problems),
    }
