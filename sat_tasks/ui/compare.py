"""Compare runs: the loss curves of selected runs on one chart, and their settings side by side (issue 45 item 7).

What a console user does after a sweep: pick two to six runs and see which learned faster and
what differed. The curves are each run's job page's (`jobs.monitoring`: the Trainer's log in the
newest mirrored checkpoint); the settings are the fields of each run's validated spec, with the
rows whose values differ marked. A spec's `env` shows its names only, never a value (a token may
be in one, issue 44.4).

A run is named `<dag_id>/<run_id>` (a DAG id has no `/`); `parse_refs` refuses anything else,
more than `MAX_RUNS`, or the same run twice, with the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sat_tasks.core.links import split_run_ref
from sat_tasks.errors import SatError
from sat_tasks.ui.pages import Scale

MAX_RUNS = 6
MIN_RUNS = 2
REF_RULE = (f"run: name {MIN_RUNS} to {MAX_RUNS} runs as <dag_id>/<run_id> (a run= parameter each, "
            "from the list's Compare button)")
# One colour per run, in order (GitHub's Primer palette: distinguishable, and for common colour blindness).
COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#6e7781")
# The spec's fields shown, in this order (a dotted path into `TrainingJob.to_dict()`), and their labels.
SETTINGS: tuple[tuple[str, str], ...] = (
    ("name", "Job"), ("learning_type", "Learning type"), ("framework", "Framework"), ("nodes", "Nodes"),
    ("resources.server_type", "Server type"), ("resources.gpus_per_node", "GPUs per node"),
    ("resources.memory", "Memory"), ("image.url", "Image"), ("data.source", "Data"), ("command", "Command"),
    ("job_failover", "Failover"), ("elastic.min_nodes", "Elastic: fewest nodes"), ("env", "Environment (names)"),
)


class CompareQueryError(SatError, ValueError):
    """The runs to compare are not named as the rule says; the message is the rule."""


def parse_refs(values: list[str]) -> list[tuple[str, str]]:
    """`[(dag_id, run_id), ...]` from the `run` parameters; CompareQueryError naming the rule otherwise."""
    refs: list[tuple[str, str]] = []
    for value in values:
        ref = split_run_ref(value)
        if ref is None:
            raise CompareQueryError(f"{REF_RULE}; got {value[:80]!r}")
        dag_id, run_id = ref
        if (dag_id, run_id) in refs:
            raise CompareQueryError(f"{REF_RULE}; {value[:80]!r} is named twice")
        refs.append((dag_id, run_id))
    if not MIN_RUNS <= len(refs) <= MAX_RUNS:
        raise CompareQueryError(f"{REF_RULE}; got {len(refs)}")
    return refs


def _at(spec: dict[str, Any], path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _shown(path: str, value: Any) -> str:
    if value is None:
        return "–"
    if path == "env":
        return ", ".join(sorted(value)) if isinstance(value, dict) and value else "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@dataclass(frozen=True)
class Series:
    """One run's curve: its label, colour and (step, loss) points."""

    label: str
    colour: str
    href: str
    points: list[tuple[float, float]] = field(default_factory=list)


def comparison(pages: list[dict[str, Any]], hrefs: list[str]) -> dict[str, Any]:
    """What the compare page shows of `pages` (job pages, in the order asked): series, settings rows, a summary row
    per run (status, goodput, GPU-hours, last loss)."""
    series = [Series(label=f"{p['job']} · {p['run_id']}", colour=COLOURS[i % len(COLOURS)], href=hrefs[i],
                     points=[(float(e["step"]), float(e["loss"])) for e in p["monitoring"]["loss"]])
              for i, p in enumerate(pages)]
    rows = []
    for path, label in SETTINGS:
        values = [_shown(path, _at(p.get("spec") or {}, path)) for p in pages]
        rows.append({"label": label, "cells": values, "differs": len(set(values)) > 1})
    runs = [{"label": s.label, "colour": s.colour, "href": s.href, "status": p.get("status"),
             "goodput": p.get("goodput"), "gpu_hours": p.get("gpu_hours"),
             "last_loss": s.points[-1][1] if s.points else None, "steps": int(s.points[-1][0]) if s.points else None,
             "note": p["monitoring"].get("note")}
            for s, p in zip(series, pages, strict=True)]
    return {"series": series, "settings": rows, "runs": runs}


@dataclass(frozen=True)
class MultiChart:
    """Several runs' curves laid out for templates/compare.html: one polyline per run, shared axes."""

    title: str
    lines: tuple[tuple[str, str, str], ...] = ()  # (colour, points, label)
    x_from: str = ""
    x_to: str = ""
    y_from: str = ""
    y_to: str = ""
    width: int = 720
    height: int = 280
    left: int = 60
    top: int = 24
    right: int = 704
    bottom: int = 240


def loss_chart(series: list[Series]) -> MultiChart:
    """Loss by step of every series on shared axes (empty lines where a run logged no loss yet)."""
    chart = MultiChart("Loss by step")
    points = [pt for s in series for pt in s.points]
    if not points:
        return chart
    scale = Scale.fit([x for x, _ in points], [y for _, y in points],
                      (chart.left, chart.top, chart.right, chart.bottom))
    lines = tuple((s.colour, scale.polyline(s.points), s.label) for s in series if s.points)
    return MultiChart("Loss by step", lines=lines, **scale.ends())
