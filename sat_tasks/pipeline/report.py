"""The job report (`report.json`): status, history, attempts, losses, checkpoints, recovery; from Object Storage only.

Everything comes from `<results>/<job>/<run_id>/` (see `io.run_layout`), so any worker
can write it, on any backend: the attempts' records and verdicts, the Trainer's
`trainer_state.json` (from the uploaded outputs, else from the newest mirrored
checkpoint), the committed checkpoints (uploaded, else mirrored), and the run's metrics
series, from which each fault's recovery is split into phases (`recovery_per_fault`), and
so is each planned restart's (an elastic job growing back: not a fault, `planned_restarts`).
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
from sat_tasks.core.handoffs import VerdictKind
from sat_tasks.core.where_ran import runtime_of
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import split_s3_uri

PLANNED_RESTART = VerdictKind.PLANNED_RESTART.value


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


def build_report(run: JobRun, entries: list[dict], metrics: Any = None) -> dict:
    """The job report: status, history, attempts, losses, checkpoints and the recovery of each fault.

    `metrics` is the run's series as read (`sat_tasks.io.metrics.RunMetrics`); read here when None.
    """
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
            "nodes": record.nodes or ([record.node] if record.node else []),
            "exit_code": record.exit_code,
            "verdict": verdict.kind.value if verdict else None,
            "reason": verdict.reason if verdict else None,
            "evidence": verdict.evidence[:3] if verdict else [],
            "resumed_from": progress.resumed_from_step,
            "last_committed_step": progress.last_committed_step,
            "step_at_end": progress.step,
            "started_at": record.started_at.isoformat() if record.started_at else None,
            "finished_at": record.finished_at.isoformat() if record.finished_at else None,
            **runtime_of(record),
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
        **_recovery_section(run, hook, metrics),
        **_warm_section(run, hook),
    }


# ---- recovery per fault, by phase ------------------------------------------------------------
#: The phases of a fault's recovery, in order, and the moments that bound each (the names of `_moments`).
RECOVERY_PHASES: tuple[tuple[str, str, str], ...] = (
    ("detect", "fault", "classified"),         # the attempt's processes end -> SAT's decision on its verdict
    ("schedule", "classified", "launched"),    # -> the next attempt's command starts on its node
    ("start", "launched", "ready"),            # -> the script hands over to the trainer (imports, model, data)
    ("restore", "ready", "restored"),          # -> the checkpoint is found, verified and loaded
    ("first_step", "restored", "first_step"),  # -> its first optimizer step is done
)


def _ms(value: Any) -> int | None:
    """A Unix time in whole milliseconds (the phases then add up exactly), None when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return round(value * 1000)


def _history_ms(entry: dict[str, Any]) -> int | None:
    from datetime import datetime

    try:
        return _ms(datetime.fromisoformat(entry["at"]).timestamp())
    except (KeyError, TypeError, ValueError):
        return None


def split_restarts(metrics: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(each fault's recovery, each planned restart's) from one pass over the attempts (`restarts`)."""
    every = restarts(metrics)
    return ([r for r in every if r["verdict"] != PLANNED_RESTART], [r for r in every if r["verdict"] == PLANNED_RESTART])


def recovery_per_fault(metrics: Any) -> list[dict[str, Any]]:
    """Each fault that another attempt recovered from: its recovery time, split into phases (`restarts`)."""
    return split_restarts(metrics)[0]


def planned_restarts(metrics: Any) -> list[dict[str, Any]]:
    """Each planned restart (an elastic job growing back, ADR 0029): not a fault, but its restart time counts too."""
    return split_restarts(metrics)[1]


def restarts(metrics: Any) -> list[dict[str, Any]]:
    """Each attempt end that another attempt recovered from: its recovery time, split into phases.

    From the run's series (`RunMetrics`): SAT's `attempt_end` job records (when the attempt's
    processes ended, when `decide` acted on its verdict, when the attempt started) and the
    engine's `restore` checkpoint record of the next attempt (`MetricsRecorder.note_restore`:
    training handed over, checkpoint loaded, first step done); the status history's entries
    stand in for a missing job record. recovery = the fault (the attempt's end) -> the next
    attempt's first step; the phases (`RECOVERY_PHASES`) partition it. A phase whose two
    moments are not both recorded, or one of them recorded before an earlier moment (the
    clocks of two machines), is None, never 0, and `unknown` says why.
    """
    ends: dict[int, dict[str, Any]] = {}
    for record in metrics.records.get("job", []):
        if record.get("event") == "attempt_end" and isinstance(record.get("attempt"), int):
            ends[record["attempt"]] = record  # the last one (an attempt run again after an interruption)
    restores: dict[int, dict[str, Any]] = {}
    for record in metrics.records.get("checkpoint", []):  # sorted by time: the first is the attempt's start
        if record.get("event") == "restore" and isinstance(record.get("attempt"), int):
            restores.setdefault(record["attempt"], record)
    history = metrics.history or []
    faults = []
    for attempt in sorted(ends):
        end = ends[attempt]
        following = attempt + 1
        if end.get("verdict") == "SUCCEEDED" or end.get("action") in ("upload", "stop"):
            continue
        if following not in ends and following not in restores:
            continue  # not recovered (the job stopped there)
        after = ends.get(following, {})
        restore = restores.get(following, {})
        decided = [e for e in history if e.get("attempt") == attempt and e.get("task") == "decide"]
        running = [e for e in history if e.get("attempt") == following and e.get("status") == "Running"]
        moments = {
            "fault": _ms(end.get("ended_at")),
            "classified": _ms(end.get("time")) or (_history_ms(decided[0]) if decided else None),
            "launched": _ms(after.get("started_at")) or (_history_ms(running[0]) if running else None),
            "ready": _ms(restore.get("started_at")),
            "restored": _ms(restore.get("restored_at")),
            "first_step": _ms(restore.get("first_step_at")),
        }
        missing = {
            "fault": f"attempt {attempt}'s end time is not recorded",
            "classified": f"no record of SAT's decision on attempt {attempt}'s verdict",
            "launched": f"attempt {following}'s start time is not recorded",
            "ready": f"attempt {following} wrote no restore record (no checkpoint engine metrics from its trainer)",
            "restored": f"attempt {following}'s trainer did not report the end of its checkpoint load",
            "first_step": f"attempt {following} wrote no restore record (no checkpoint engine metrics from its trainer)",
        }
        _drop_out_of_order(moments, missing)
        phases: dict[str, float | None] = {}
        unknown: dict[str, str] = {}
        for name, begin, finish in RECOVERY_PHASES:
            phases[name], why = _span(moments, begin, finish, missing)
            if why:
                unknown[name] = why
        total, why = _span(moments, "fault", "first_step", missing)
        faults.append({
            "attempt": attempt, "next_attempt": following, "node": end.get("node"), "next_node": after.get("node"),
            "verdict": end.get("verdict"), "resumed_from_step": restore.get("step"),
            "recovery_s": total, "phases": phases, **({"unknown": unknown} if unknown else {}),
        })
    return faults


def _drop_out_of_order(moments: dict[str, int | None], missing: dict[str, str]) -> None:
    """A moment recorded before an earlier one (the clocks of two machines disagree) is not used, nor its phases.

    So the phases that are known never overlap and never add up to more than the recovery.
    """
    last: tuple[str, int] | None = None
    for name, value in moments.items():
        if value is None:
            continue
        if last is not None and value < last[1]:
            moments[name] = None
            missing[name] = (f"{name.replace('_', ' ')} ({value / 1000:.3f}) is recorded before {last[0]} "
                             f"({last[1] / 1000:.3f}): the clocks disagree")
            continue
        last = (name, value)


def _span(moments: dict[str, int | None], begin: str, finish: str,
          missing: dict[str, str]) -> tuple[float | None, str | None]:
    """Seconds from one moment to a later one, or None and why."""
    start, end = moments[begin], moments[finish]
    if start is None or end is None:
        return None, missing[begin if start is None else finish]
    return (end - start) / 1000, None


def _recovery_section(run: JobRun, hook: Any, metrics: Any) -> dict[str, list[dict[str, Any]]]:
    """`recovery` (per fault) and, when there were any, `planned_restarts`."""
    if metrics is None:
        from sat_tasks.io.metrics import read_object_storage

        try:
            metrics = read_object_storage(run.results_uri, hook)
        except Exception:  # noqa: BLE001 - the report is written without the recovery phases
            return {"recovery": []}
    recovery, planned = split_restarts(metrics)
    return {"recovery": recovery, **({"planned_restarts": planned} if planned else {})}


def format_recovery(fault: dict[str, Any]) -> str:
    """One line: `attempt 1 (node-a) -> 2 (node-b): 8.2s = detect 0.4s + ... + first step 0.3s`; a planned
    restart says so (`planned restart to grow back after attempt 2 (node-b) -> ...`)."""
    def seconds(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.1f}s"

    parts = " + ".join(f"{name.replace('_', ' ')} {seconds(fault['phases'][name])}" for name, _, _ in RECOVERY_PHASES)
    what = (f"planned restart to grow back after attempt {fault['attempt']} ({fault['node']})"
            if fault["verdict"] == PLANNED_RESTART
            else f"recovery after attempt {fault['attempt']} ({fault['node']}, {fault['verdict']})")
    return (f"{what} -> attempt {fault['next_attempt']} ({fault['next_node']}): {seconds(fault['recovery_s'])} "
            f"= {parts}")


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


#: How many names a list in the human report shows at each end (a long run saves hundreds of checkpoints).
_SHOWN_AT_EACH_END = 3


def _some(names: list[str]) -> str:
    """The names, joined; a long list as its first and last few with how many are left out between."""
    if len(names) <= 2 * _SHOWN_AT_EACH_END + 1:
        return ", ".join(names)
    left_out = len(names) - 2 * _SHOWN_AT_EACH_END
    return (f"{', '.join(names[:_SHOWN_AT_EACH_END])}, ... ({left_out} more), "
            f"{', '.join(names[-_SHOWN_AT_EACH_END:])} ({len(names)} in all)")


def format_report(report: dict) -> list[str]:
    """Human lines for the job report (task log and CLI)."""
    lines = [f"job {report['job']} run {report['run_id']}: {report['status']}"]
    for entry in report["history"]:
        lines.append(f"  {entry['at']}  {entry['status']:<30} {entry['reason']}")
    for a in report["attempts"]:
        lines.append(
            f"  attempt {a['attempt']} on {a['node']}: exit {a['exit_code']}, verdict {a['verdict']}"
            + (f" ({a.get('reason')}: not a fault)" if a["verdict"] == PLANNED_RESTART else "")
            + (f", resumed from step {a['resumed_from']}" if a.get("resumed_from") is not None else "")
        )
    if report.get("global_step") is not None:
        lines.append(f"  steps: {report['global_step']}")
    if report.get("first_loss"):
        lines.append(f"  loss: {report['first_loss'][1]:.4f} (step {report['first_loss'][0]}) -> "
                     f"{report['last_loss'][1]:.4f} (step {report['last_loss'][0]})")
    if report.get("checkpoints"):
        lines.append(f"  checkpoints: {_some(report['checkpoints'])}")
    for fault in (report.get("recovery") or []) + (report.get("planned_restarts") or []):
        lines.append(f"  {format_recovery(fault)}")
    for line in (report.get("warm") or {}).get("lines", []):
        lines.append(f"  {line}")
    lines.append(f"  results: {report['results']}")
    return lines
