"""Read a run's metrics series (`metrics/attempt-<k>/<node>/<series>.jsonl`, written by `ckpt_engine.metrics`).

A source is a local directory (a run's results as downloaded, or the local backend's run
directory: either holds `metrics/`) or an `s3://` results URI (`<results>/<job>/<run_id>/`).
A line that is not a JSON object is a problem named `<file>:<line>: <why>`; the other lines
and files are still read. `monitoring_series` is what the Training Jobs page plots: plain
dicts, no plotting library.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERIES = ("training", "checkpoint", "system", "job")
METRICS_DIR = "metrics"


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
        name = f"{METRICS_DIR}/{path.relative_to(metrics_root).as_posix()}"
        if _is_series_file(name):
            found.add_file(name, path.read_text(encoding="utf-8", errors="replace"))
    for extra, attribute in (("status.json", "history"), ("report.json", "report")):
        path = root / extra
        if path.is_file():
            try:
                setattr(found, attribute, json.loads(path.read_text(encoding="utf-8")))
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
    bucket, prefix = split_s3_uri(base + METRICS_DIR + "/")
    found = RunMetrics(source=base)
    for key in sorted(hook.list_keys(bucket_name=bucket, prefix=prefix) or []):
        name = f"{METRICS_DIR}/{key[len(prefix):]}"
        if _is_series_file(name):
            found.add_file(name, hook.read_key(key=key, bucket_name=bucket))
    for extra, attribute in (("status.json", "history"), ("report.json", "report")):
        try:
            value = storage.read_json(hook, base + extra)
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


# ---- what the plots need -----------------------------------------------------------------------
def attempt_spans(metrics: RunMetrics) -> list[dict[str, Any]]:
    """Per attempt: node, first and last sample time, first and last step, as the training series shows them."""
    spans: dict[int, dict[str, Any]] = {}
    for record in metrics.records["training"]:
        attempt = record.get("attempt") or 0
        span = spans.setdefault(attempt, {"attempt": attempt, "node": record.get("node"), "first_time": record["time"],
                                          "first_step": record.get("global_step")})
        span["last_time"] = record["time"]
        span["last_step"] = record.get("global_step")
    return [spans[k] for k in sorted(spans)]


def job_summary(metrics: RunMetrics) -> dict[str, Any]:
    """Goodput (training time / wall time) and the recovery time of each fault, from the series and the history.

    Training time is the sum over attempts of first-to-last training sample; wall time runs
    from the first `Running` in the status history (else the first sample) to the last
    entry (else the last sample). A fault's recovery is from the failed attempt's last
    training sample to the next attempt's first (the resolution is the metrics interval).
    """
    spans = attempt_spans(metrics)
    if not spans:
        return {"goodput": None, "training_s": 0.0, "wall_s": None, "faults": []}
    from datetime import datetime

    def stamp(entry: dict[str, Any]) -> float | None:
        try:
            return datetime.fromisoformat(entry["at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return None

    times = [t for t in (stamp(e) for e in metrics.history if e.get("status") == "Running") if t is not None]
    start = min([spans[0]["first_time"], *times])
    ends = [t for t in (stamp(e) for e in metrics.history) if t is not None]
    end = max([spans[-1]["last_time"], *ends])
    training = sum(s["last_time"] - s["first_time"] for s in spans)
    faults = []
    for before, after in itertools.pairwise(spans):
        reasons = [e for e in metrics.history if e.get("attempt") == before["attempt"]
                   and e.get("status") not in ("Running", "Pending")]
        faults.append({
            "attempt": before["attempt"], "node": before["node"], "next_node": after["node"],
            "status": reasons[0]["status"] if reasons else None,
            "last_step": before["last_step"], "resumed_at_step": after["first_step"],
            "ended_at": before["last_time"], "resumed_at": after["first_time"],
            "recovery_s": round(after["first_time"] - before["last_time"], 3),
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
                   for r in metrics.records["system"] if r.get("device") == "host"],
        "gpus": gpus,
        "attempts": attempt_spans(metrics),
        "faults": summary["faults"],
        "goodput": summary["goodput"],
        "problems": list(metrics.problems),
    }
