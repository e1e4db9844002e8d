"""The job report (`report.json`): status, history, attempts, losses and checkpoints, read from Object Storage only.

Everything comes from `<results>/<job>/<run_id>/` (see `io.run_layout`), so any worker
can write it, on any backend: the attempts' records and verdicts, the Trainer's
`trainer_state.json` (from the uploaded outputs, else from the newest mirrored
checkpoint), and the committed checkpoints (uploaded, else mirrored).
"""

from __future__ import annotations

import json
from typing import Any

from ckpt_engine.contract import (
    CONCURRENT_DIR,
    MANIFEST_NAME,
    TRAINER_STATE_NAME,
    ProgressRecord,
    checkpoint_dir,
    parse_step,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import split_s3_uri


def committed_checkpoints(hook: Any, prefix_uri: str) -> list[int]:
    """Steps of the `checkpoint-<step>/` directories under `prefix_uri` that have their manifest."""
    bucket, prefix = split_s3_uri(prefix_uri)
    keys = hook.list_keys(bucket_name=bucket, prefix=prefix) or []
    return sorted({step for key in keys if (step := _manifest_step(key[len(prefix):])) is not None})


def _manifest_step(key: str) -> int | None:
    """The step of a `[.../]checkpoint-<step>/manifest.json` key, else None."""
    parts = key.split("/")
    return parse_step(parts[-2]) if len(parts) >= 2 and parts[-1] == MANIFEST_NAME else None


def _trainer_state(run: JobRun, hook: Any, mirrored: list[int]) -> dict[str, Any]:
    from sat_tasks.io.object_storage import read_json

    candidates = [run.output_uri + TRAINER_STATE_NAME]
    candidates += [f"{run.mirror_uri}{checkpoint_dir(step)}/{TRAINER_STATE_NAME}" for step in reversed(mirrored)]
    for uri in candidates:
        try:
            state = read_json(hook, uri)
        except (ValueError, json.JSONDecodeError):
            continue
        if state:
            return state
    return {}


def build_report(run: JobRun, entries: list[dict]) -> dict:
    """The job report: status, history, attempts, losses and checkpoints."""
    hook = run.hook()
    attempts = []
    for n in range(1, run.job.max_attempts() + 1):
        record = run.load_record(n)
        if record is None:
            continue
        verdict = run.load_verdict(n)
        progress = ProgressRecord.from_dict(record.progress)
        attempts.append({
            "attempt": n,
            "node": record.node,
            "exit_code": record.exit_code,
            "verdict": verdict.kind.value if verdict else None,
            "evidence": verdict.evidence[:3] if verdict else [],
            "resumed_from": progress.resumed_from_step,
            "last_committed_step": progress.last_committed_step,
            "step_at_end": progress.step,
            "started_at": record.started_at.isoformat() if record.started_at else None,
            "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        })
    uploaded = committed_checkpoints(hook, f"{run.output_uri}{CONCURRENT_DIR}/")
    mirrored = committed_checkpoints(hook, run.mirror_uri)
    state = _trainer_state(run, hook, mirrored)
    losses = [(e["step"], e["loss"]) for e in state.get("log_history", []) if "loss" in e]
    return {
        "job": run.job.name,
        "run_id": run.run_id,
        "status": entries[-1]["status"] if entries else None,
        "history": entries,
        "attempts": attempts,
        "global_step": state.get("global_step"),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "checkpoints": [checkpoint_dir(step) for step in (uploaded or mirrored)],
        "results": run.results_uri,
        **_warm_section(run, hook),
    }


def _warm_section(run: JobRun, hook: Any) -> dict[str, Any]:
    """`warm`: what the run reused from the job's warm pool and the lines that say so (ADR 0015)."""
    if run.job.warm_pool is None and getattr(run.job, "workspace", None) is None:
        return {}  # a workspace's warm pool may apply to a job without one of its own
    from sat_tasks.io.warm_pool import read_run_record

    record = read_run_record(hook, run.results_uri)
    if not record:
        return {}
    return {"warm": {"from_run": record.get("from_run"), "reused": record.get("reused") or {},
                     "lines": record.get("lines") or []}}


def format_report(report: dict) -> list[str]:
    """Human lines for the job report (task log and CLI)."""
    lines = [f"job {report['job']} run {report['run_id']}: {report['status']}"]
    for entry in report["history"]:
        lines.append(f"  {entry['at']}  {entry['status']:<30} {entry['reason']}")
    for a in report["attempts"]:
        lines.append(
            f"  attempt {a['attempt']} on {a['node']}: exit {a['exit_code']}, verdict {a['verdict']}"
            + (f", resumed from step {a['resumed_from']}" if a.get("resumed_from") is not None else "")
        )
    if report.get("global_step") is not None:
        lines.append(f"  steps: {report['global_step']}")
    if report.get("first_loss"):
        lines.append(f"  loss: {report['first_loss'][1]:.4f} (step {report['first_loss'][0]}) -> "
                     f"{report['last_loss'][1]:.4f} (step {report['last_loss'][0]})")
    if report.get("checkpoints"):
        lines.append(f"  checkpoints: {', '.join(report['checkpoints'])}")
    for line in (report.get("warm") or {}).get("lines", []):
        lines.append(f"  {line}")
    lines.append(f"  results: {report['results']}")
    return lines
