"""The job report as a page (`report.html`): plots of the run's metrics series, drawn with matplotlib.

Loss across attempts with each failover and resume marked, throughput, checkpoint stalls
and persist time, CPU and memory, GPU utilization and memory per device, goodput and the
recovery time of each fault, split into phases (`report.recovery_per_fault`); an elastic job's
planned restarts to grow back are listed apart (not faults, `report.planned_restarts`). The plots
are PNGs inside the page, so it is one file that opens anywhere. Lines of the series that
cannot be read are listed at the top by file and line; the rest still renders.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import UTC, datetime
from typing import Any

from sat_tasks.io.metrics import RunMetrics, job_summary, monitoring_series
from sat_tasks.pipeline.report import RECOVERY_PHASES, format_recovery, split_restarts

STYLE = ("<style>body{font-family:sans-serif;margin:24px;max-width:1150px}table{border-collapse:collapse}"
         "td,th{padding:3px 10px;border-bottom:1px solid #ddd;vertical-align:top;text-align:left}"
         ".problems{background:#fde8e8;border:1px solid #d62728;padding:8px 14px}img{max-width:100%}</style>")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _by_attempt(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row.get("attempt") or 0, []).append(row)
    return dict(sorted(grouped.items()))


def _mark_faults(axis: Any, series: dict[str, Any], t0: float) -> None:
    for fault in series["faults"]:
        if fault["ended_at"] is not None:
            axis.axvline(fault["ended_at"] - t0, color="#d62728", linestyle="--", linewidth=1)
            axis.annotate(f"attempt {fault['attempt']} ends ({fault['verdict'] or fault['status'] or 'fault'})",
                          (fault["ended_at"] - t0, 1), xycoords=("data", "axes fraction"), rotation=90,
                          fontsize=7, va="top", ha="right", color="#d62728")
        if fault["resumed_at"] is not None:
            axis.axvline(fault["resumed_at"] - t0, color="#2ca02c", linestyle=":", linewidth=1)
            axis.annotate(f"training again at step {fault['resumed_at_step']}", (fault["resumed_at"] - t0, 1),
                          xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top", ha="left",
                          color="#2ca02c")


def _plots(series: dict[str, Any], t0: float) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: list[tuple[str, str]] = []
    if series["loss"]:
        figure, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 3.6))
        for i, (attempt, rows) in enumerate(_by_attempt(series["loss"]).items()):
            color = COLORS[i % len(COLORS)]
            label = f"attempt {attempt} ({rows[0].get('node')})"
            by_time.plot([r["time"] - t0 for r in rows], [r["loss"] for r in rows], ".-", color=color, label=label)
            by_step.plot([r["global_step"] for r in rows], [r["loss"] for r in rows], ".-", color=color, label=label)
        _mark_faults(by_time, series, t0)
        for fault in series["faults"]:
            if fault["resumed_at_step"] is not None:
                by_step.axvline(fault["resumed_at_step"], color="#2ca02c", linestyle=":", linewidth=1)
        by_time.set(xlabel="seconds since the job started", ylabel="loss", title="Loss across attempts")
        by_step.set(xlabel="global step", ylabel="loss", title="Loss by step (resume marked)")
        by_time.legend(fontsize=8)
        plots.append(("Loss", _png(figure)))
    if series["throughput"]:
        figure, axis = plt.subplots(figsize=(12, 3.2))
        rows = series["throughput"]
        for color, (key, label) in zip(COLORS, (("samples_per_second", "samples/s"),
                                                ("tokens_per_second", "tokens/s"), ("steps_per_second", "steps/s"))):
            for n, part in enumerate(_by_attempt(rows).values()):  # no line across the gap between attempts
                points = [(r["time"] - t0, r[key]) for r in part if r.get(key) is not None]
                if points:
                    axis.plot(*zip(*points), ".-", color=color, label=label if n == 0 else None)
        _mark_faults(axis, series, t0)
        axis.set(xlabel="seconds since the job started", ylabel="per second", title="Throughput")
        axis.legend(fontsize=8)
        plots.append(("Throughput", _png(figure)))
    if series["checkpoints"]:
        figure, axis = plt.subplots(figsize=(12, 3.2))
        saves = series["checkpoints"]
        labels = [f"{s['step']}\n(a{s.get('attempt')})" for s in saves]
        positions = range(len(saves))
        axis.bar([p - 0.2 for p in positions], [s.get("blocking_s") or 0 for s in saves], 0.4,
                 label="training stalled (blocking s)")
        axis.bar([p + 0.2 for p in positions], [s.get("persist_s") or 0 for s in saves], 0.4,
                 label="persist s (in the background)")
        axis.set_xticks(list(positions), labels, fontsize=7)
        axis.set(xlabel="checkpoint step (attempt)", ylabel="seconds", title="Checkpoint stalls and persist time")
        axis.legend(fontsize=8)
        plots.append(("Checkpoints", _png(figure)))
    if series["system"]:
        figure, cpu = plt.subplots(figsize=(12, 3.2))
        for i, (attempt, rows) in enumerate(_by_attempt(series["system"]).items()):
            color = COLORS[i % len(COLORS)]
            cpu.plot([r["time"] - t0 for r in rows], [r.get("cpu_percent") for r in rows], ".-", color=color,
                     label=f"CPU % attempt {attempt} ({rows[0].get('node')})")
        memory = cpu.twinx()
        rows = series["system"]
        memory.plot([r["time"] - t0 for r in rows], [(r.get("memory_used_bytes") or 0) / 2**30 for r in rows],
                    color="grey", linewidth=1, label="memory used GiB")
        memory.set_ylabel("GiB")
        _mark_faults(cpu, series, t0)
        cpu.set(xlabel="seconds since the job started", ylabel="CPU %", title="Node CPU and memory")
        cpu.legend(fontsize=8, loc="lower left")
        plots.append(("System", _png(figure)))
    if series["gpus"]:
        figure, (util, mem) = plt.subplots(1, 2, figsize=(12, 3.4))
        for i, (device, rows) in enumerate(sorted(series["gpus"].items())):
            color = COLORS[i % len(COLORS)]
            util.plot([r["time"] - t0 for r in rows], [r.get("gpu_utilization_percent") for r in rows], ".-",
                      color=color, label=device)
            mem.plot([r["time"] - t0 for r in rows], [(r.get("memory_used_bytes") or 0) / 2**30 for r in rows],
                     ".-", color=color, label=device)
        util.set(xlabel="seconds", ylabel="%", title="GPU utilization per device")
        mem.set(xlabel="seconds", ylabel="GiB", title="GPU memory used per device")
        util.legend(fontsize=8)
        plots.append(("GPUs", _png(figure)))
    if series["faults"] or series["goodput"] is not None:
        figure, (good, recovery) = plt.subplots(1, 2, figsize=(12, 3))
        goodput = series["goodput"] or 0.0
        good.barh(["goodput"], [goodput], color="#2ca02c")
        good.barh(["goodput"], [1 - goodput], left=[goodput], color="#dddddd")
        good.set(xlim=(0, 1), title=f"Goodput {goodput:.1%} (training time / wall time)")
        recovered = [f for f in series["faults"] if f["recovery_s"] is not None]
        names = [f"attempt {f['attempt']} on {f['node']}" for f in recovered]
        recovery.bar(names or ["no recovery"], [f["recovery_s"] for f in recovered] or [0], color="#d62728")
        recovery.set(ylabel="seconds", title="Recovery time per fault (last step to training again)")
        plots.append(("Goodput and recovery", _png(figure)))
    return plots


def _recovery_plot(faults: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each fault's recovery as one bar, stacked by phase; an unknown phase is left out of its bar and named."""
    if not faults:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(12, 0.6 + 0.5 * len(faults)))
    names = [f"attempt {f['attempt']} -> {f['next_attempt']}" for f in faults]
    left = [0.0] * len(faults)
    for color, (phase, _, _) in zip(COLORS, RECOVERY_PHASES):
        widths = [f["phases"][phase] or 0.0 for f in faults]
        axis.barh(names, widths, left=left, color=color, label=phase.replace("_", " "))
        left = [a + b for a, b in zip(left, widths)]
    for y, fault in enumerate(faults):
        if fault.get("unknown"):
            axis.annotate("unknown: " + ", ".join(p.replace("_", " ") for p in fault["unknown"]), (left[y], y),
                          fontsize=7, va="center", xytext=(4, 0), textcoords="offset points")
    axis.set(xlabel="seconds from the fault to the next attempt's first step", title="Recovery per fault, by phase")
    axis.legend(fontsize=8, ncol=len(RECOVERY_PHASES), loc="lower right")
    return [("Recovery phases", _png(figure))]


def _recovery_table(faults: list[dict[str, Any]]) -> str:
    """The phases of each fault's recovery in seconds; an unknown phase says `unknown` and why (never 0)."""
    esc = html.escape
    head = "".join(f"<th>{esc(p.replace('_', ' '))}</th>" for p, _, _ in RECOVERY_PHASES)
    def cell(value: float | None, why: str | None) -> str:
        if value is None:
            return f"<td title='{esc(why or '')}'><i>unknown</i></td>"
        return f"<td>{value:.2f}s</td>"

    rows = []
    for fault in faults:
        unknown = fault.get("unknown") or {}
        cells = "".join(cell(fault["phases"][p], unknown.get(p)) for p, _, _ in RECOVERY_PHASES)
        what = (f"attempt {fault['attempt']} on {fault['node']} ({fault['verdict']}) -> attempt "
                f"{fault['next_attempt']} on {fault['next_node']}")
        rows.append(f"<tr><td>{esc(what)}</td>{cell(fault['recovery_s'], 'see the phases')}{cells}</tr>")
    reasons = [f"attempt {f['attempt']} -> {f['next_attempt']}, {p.replace('_', ' ')}: {why}"
               for f in faults for p, why in (f.get("unknown") or {}).items()]
    return ("<h2>Recovery per fault</h2><p>From the fault (the attempt's processes end) to the next attempt's first "
            "step: detect (SAT classifies it), schedule (the next attempt starts on a node), start (imports, model, "
            "data), restore (the checkpoint is found, verified and loaded), first step.</p>"
            f"<table class='recovery'><tr><th>fault</th><th>recovery</th>{head}</tr>{''.join(rows)}</table>"
            + ("<ul>" + "".join(f"<li>unknown: {esc(r)}</li>" for r in reasons) + "</ul>" if reasons else ""))


def _fault_text(fault: dict[str, Any]) -> str:
    how = fault["verdict"] or fault["status"] or "ended"
    text = f"attempt {fault['attempt']} on {fault['node']}: {how} at step {fault['last_step']}"
    if fault["resumed_at"] is None:
        return text + ", not resumed"
    # the first step the next attempt's sidecar saw, not the checkpoint it resumed from (that is on the attempts' row)
    return (text + f", training again at step {fault['resumed_at_step']} on {fault['next_node']}"
            + (f" after {fault['recovery_s']:.1f}s" if fault["recovery_s"] is not None else ""))


def render_report_html(metrics: RunMetrics, *, title: str = "", omit: tuple[str, ...] = ()) -> str:
    """The whole page for one run: a summary table, the problems (if any) and the plots (but those named in `omit`)."""
    series = monitoring_series(metrics)
    summary = job_summary(metrics)
    recovery, planned = split_restarts(metrics)
    times = [r["time"] for records in metrics.records.values() for r in records]
    t0 = min(times) if times else 0.0
    status = metrics.history[-1]["status"] if metrics.history else (metrics.report or {}).get("status")
    esc = html.escape
    rows = [("status", status or "unknown"), ("source", metrics.source),
            ("attempts", ", ".join(f"{a['attempt']} on {a['node']} (steps {a['first_step']}-{a['last_step']})"
                                   for a in series["attempts"]) or "no training samples"),
            ("goodput", f"{summary['goodput']:.1%}" if summary["goodput"] is not None else "n/a"),
            ("faults", "; ".join(_fault_text(f) for f in summary["faults"]) or "none"),
            *([("planned restarts", "; ".join(format_recovery(r) for r in planned))] if planned else []),
            ("GPU series", f"{len(series['gpus'])} device(s)" if series["gpus"] else
             "none: no GPU was readable through NVML on the job's nodes")]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title or 'SAT job report')}</title>",
        STYLE,
        "</head><body>",
        f"<h1>{esc(title or 'SAT job report')}</h1>",
        "<table>" + "".join(f"<tr><td><b>{esc(k)}</b></td><td>{esc(str(v))}</td></tr>" for k, v in rows) + "</table>",
    ]
    if metrics.problems:
        parts.append("<div class='problems'><b>Some metrics could not be read (the rest is shown):</b><ul>"
                     + "".join(f"<li><code>{esc(p)}</code></li>" for p in metrics.problems) + "</ul></div>")
    if recovery:
        parts.append(_recovery_table(recovery))
    import matplotlib

    # Labels (node and device names, statuses) are what the training wrote: text, never mathtext (issue 44.7:
    # a device name "gpu$\frac{$" made the report a 500).
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        plots = _plots(series, t0) + _recovery_plot(recovery)
    if not plots:
        parts.append("<p>No metrics series were found for this run.</p>")
    for name, png in [(name, png) for name, png in plots if name not in omit]:
        parts.append(f"<h2>{esc(name)}</h2><img alt='{esc(name)}' src='data:image/png;base64,{png}'>")
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    parts.append(f"<p style='color:#777'>Generated {generated} from {len(metrics.files)} series file(s).</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
