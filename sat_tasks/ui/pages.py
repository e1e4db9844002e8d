"""The Training Jobs view's pages: the list, a job page with its tabs, the Create form, the Delete confirmation.

Each function turns what `sat_tasks.ui.jobs` read into a template's context and renders it
(`templates/`, autoescaped: every value is escaped). A little script adds what a page cannot
do alone (the tabs show one section at a time, the job page follows the status without a
reload) and the pages work without it (every section shown, a reload shows the news).
Nothing here reads a secret (the spec holds none, the registry password field is never
filled back in). Forms post to the same origin (`sat_tasks.ui.security` checks it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import yaml

from sat_tasks.core.links import path_segment
from sat_tasks.core.status import TERMINAL, JobStatus, airflow_failed_because
from sat_tasks.ui.create import FIELDS, SECTIONS, FormField, help_text
from sat_tasks.ui.templating import job_href, render

__all__ = ["TABS", "create_page", "delete_page", "deleted_page", "job_href", "job_page_html", "list_page",
           "stop_page"]

# The plots of the job report the Monitoring tab draws itself (its embedded report leaves them out: each chart once).
CHARTS_ON_THE_PAGE = ("Loss", "Throughput")
# The job page's tabs: (section id, label); each is a block of that name in templates/job.html.
TABS = (("details", "Details"), ("attempts", "Attempts"), ("checkpoints", "Checkpoints"), ("logs", "Logs"),
        ("outputs", "Outputs"), ("monitoring", "Monitoring"), ("tags", "Tags"))


# The guide's words for the spec's values (the list's cells and filter menus).
LEARNING_TYPES = {"on-demand": "On-Demand", "spot": "Spot"}
FRAMEWORKS = {"pytorch": "PyTorch", "deepspeed": "DeepSpeed"}
# The list's columns a person may sort by: (sort key, header); the others are plain headers.
SORTABLE = {"job": "Job", "status": "Status", "submitted": "Submitted", "started": "Started",
            "gpu_hours": "GPU-hours", "creator": "Created by", "workspace": "Workspace"}
WORD_COLUMNS = {"job", "status", "creator", "workspace"}


def list_page(found: Any, choices: dict[str, list[str]] | None = None, problem: Any = None) -> str:
    """The Training Jobs list: search, filters, sortable headers and pages over every run (`run_index.JobsPage`)."""
    query = found.query

    def href(**changes: Any) -> str:
        params = query.params(**changes)
        return "/sat/jobs" + ("?" + urlencode(params) if params else "")

    def sort_href(key: str) -> str:  # words sort A-Z first, times and amounts newest/largest first; a click flips
        first = "asc" if key in WORD_COLUMNS else "desc"
        order = ("desc" if query.order == "asc" else "asc") if query.sort == key else first
        return href(sort=key, order=order, page=1)

    first = (query.page - 1) * query.per_page + 1 if found.rows else 0
    # `until` is exclusive (the day after the one asked for, at midnight): the date field shows the day asked for.
    until_day = (query.until - timedelta(seconds=1)).date().isoformat() if query.until else ""
    return render("jobs.html", found=found, query=query, rows=found.rows, problem=problem, href=href,
                  sort_href=sort_href, sortable=SORTABLE, statuses=[s.value for s in JobStatus],
                  learning_types=LEARNING_TYPES, frameworks=FRAMEWORKS, choices=choices or {},
                  since_day=query.since.date().isoformat() if query.since else "", until_day=until_day,
                  first=first, last=first + len(found.rows) - 1 if found.rows else 0,
                  filtered=bool(query.params(sort="started", order="desc", page=1, per_page=query.per_page)),
                  scheduled=any(row["schedule"] for row in found.rows), now=_now())


def _now() -> str:
    """When a page is made (ISO, UTC): what a running job's GPU-hours count on from in the browser."""
    return datetime.now(UTC).isoformat()


# ---- the Create Training Job form ------------------------------------------------------------------
@dataclass(frozen=True)
class FieldView:
    """One input of the Create form as the template shows it: the field, its value and its problems."""

    form: FormField
    value: Any
    errors: list[str]
    help: str

    @property
    def text(self) -> str:
        return "" if self.value is None else str(self.value)


def create_page(values: dict[str, Any] | None = None, errors: dict[str, list[str]] | None = None,
                notice: str | None = None) -> str:
    """The "Create Training Job" form, in sections; with the posted values and each problem next to its field."""
    errors = errors or {}
    sections = [(section, [FieldView(form, _form_value(form, values), errors.get(form.name, []), help_text(form))
                           for form in FIELDS if form.section == section]) for section in SECTIONS]
    return render("create.html", sections=sections, notice=notice,
                  problems=sum(len(lines) for lines in errors.values()))


def _form_value(form: FormField, values: dict[str, Any] | None) -> Any:
    """The field's default on a fresh form, else what was posted (a checkbox: on or off)."""
    if values is None:
        return form.default
    if form.kind == "checkbox":
        return values.get(form.name) not in (None, "", "off", "false")
    return values.get(form.name)


# ---- the job page -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LineChart:
    """A line chart laid out for templates/chart.html: coordinates as text, markers as (x, label)."""

    id: str
    title: str
    x_label: str
    y_label: str
    path: str = ""
    dots: tuple[tuple[str, str, str], ...] = ()
    marks: tuple[tuple[str, str], ...] = ()
    x_from: str = ""
    x_to: str = ""
    y_from: str = ""
    y_to: str = ""
    width: int = 720
    height: int = 240
    left: int = 60
    top: int = 24
    right: int = 704  # width - 16
    bottom: int = 200  # height - 40

    @property
    def x_middle(self) -> str:
        return f"{(self.width + self.left) / 2:.0f}"


@dataclass(frozen=True)
class Scale:
    """Data to pixel coordinates in a chart's plot box, shared by every chart of the view.

    The y axis starts at zero or below; an axis of one value is widened by one, so a single point
    (or a flat curve) still lays out.
    """

    x0: float
    x1: float
    y0: float
    y1: float
    box: tuple[int, int, int, int]  # left, top, right, bottom

    @classmethod
    def fit(cls, xs: list[float], ys: list[float], box: tuple[int, int, int, int]) -> Scale:
        x0, x1 = min(xs), max(xs)
        y0, y1 = min(0.0, min(ys)), max(ys)
        return cls(x0, x1 if x1 > x0 else x0 + 1, y0, y1 if y1 > y0 else y0 + 1, box)

    def x(self, x: float) -> str:
        left, _, right, _ = self.box
        return f"{left + (x - self.x0) / (self.x1 - self.x0) * (right - left):.1f}"

    def y(self, y: float) -> str:
        _, top, _, bottom = self.box
        return f"{bottom - (y - self.y0) / (self.y1 - self.y0) * (bottom - top):.1f}"

    def polyline(self, points: list[tuple[float, float]]) -> str:
        return " ".join(f"{self.x(x)},{self.y(y)}" for x, y in points)

    def ends(self) -> dict[str, str]:
        """The axis ends as the charts label them: `x_from`, `x_to`, `y_from`, `y_to`."""
        return {"x_from": f"{self.x0:g}", "x_to": f"{self.x1:g}", "y_from": f"{self.y0:.3g}",
                "y_to": f"{self.y1:.3g}"}


def line_chart(points: list[tuple[float, float]], markers: list[tuple[float, str]], *, title: str,
               x_label: str, y_label: str, chart_id: str) -> LineChart:
    """Lay out a line chart of `points` with dashed vertical `markers` (no dots: "no data yet")."""
    chart = LineChart(chart_id, title, x_label, y_label)
    if not points:
        return chart
    scale = Scale.fit([x for x, _ in points] + [x for x, _ in markers], [y for _, y in points],
                      (chart.left, chart.top, chart.right, chart.bottom))
    return LineChart(chart_id, title, x_label, y_label, path=scale.polyline(points),
                     dots=tuple((scale.x(x), scale.y(y), f"{x:g}: {y:.4g}") for x, y in points),
                     marks=tuple((scale.x(x), label) for x, label in markers), **scale.ends())


def monitoring_charts(monitoring: dict[str, Any]) -> dict[str, LineChart]:
    """The Monitoring tab's charts: loss by step (resume markers), steps/s over time (attempt markers)."""
    loss = [(p["step"], p["loss"]) for p in monitoring["loss"]]
    step_marks = [(m["step"], m["label"]) for m in monitoring["markers"] if m["step"] is not None]
    stamped = [r for r in monitoring["steps_per_second"] if r["t"]]
    start = min([r["t"] for r in stamped] + [m["at"] for m in monitoring["markers"] if m["at"]], default=0.0)
    rate = [(round(r["t"] - start, 1), r["steps_per_second"]) for r in stamped]
    time_marks = [(round(m["at"] - start, 1), m["label"]) for m in monitoring["markers"] if m["at"] and stamped]
    return {"loss": line_chart(loss, step_marks, title="Loss by step", x_label="step", y_label="loss",
                               chart_id="loss-chart"),
            "rate": line_chart(rate, time_marks, title="Steps per second over time",
                               x_label="seconds since the first log", y_label="steps/s", chart_id="rate-chart")}


def job_page_html(page: dict[str, Any], tag_errors: list[str] | None = None, tags_typed: str | None = None) -> str:
    """A job page: status (live), actions, and the tabs Details, Attempts, Checkpoints, Logs, Monitoring, Tags.

    With `tag_errors` (a refused tag edit) the page opens on the Tags tab, with the problems and what was typed.
    """
    href = f"/sat/{job_href(page)}"
    seen = f"{len(page['history'])}/{len(page['attempts'])}/{1 if page.get('stop_requested') else 0}/" \
           f"{page['run_state']}"
    return render(
        "job.html", page=page, tabs=TABS, tag_errors=tag_errors or [], href=href,
        api_href=f"/sat/api/{job_href(page)}", log_href=f"/sat/api/{job_href(page)}/log",
        report_href=f"{href}/report", grid=f"/dags/{path_segment(page['dag_id'])}/runs/{path_segment(page['run_id'])}",
        seen=seen, terminal=json.dumps(sorted(s.value for s in TERMINAL)), stopped=JobStatus.STOPPED.value,
        airflow_failed_because=airflow_failed_because,
        spec_yaml=yaml.safe_dump(page["spec"], sort_keys=False, allow_unicode=True), charts=monitoring_charts(page["monitoring"]),
        learning_types=LEARNING_TYPES, frameworks=FRAMEWORKS, now=_now(),
        tags_text=tags_typed if tags_typed is not None else "\n".join(f"{k}={v}" for k, v in page["tags"].items()),
        open_tab="tags" if tag_errors else None)


def stop_page(page: dict[str, Any]) -> str:
    """The Stop confirmation: Stop asks first, as Delete does."""
    return render("stop.html", page=page, href=f"/sat/{job_href(page)}")


def delete_page(page: dict[str, Any]) -> str:
    """The Delete confirmation: what goes, what stays unless asked."""
    return render("delete.html", page=page, href=f"/sat/{job_href(page)}")


def deleted_page(job: str, run_id: str, removed_objects: int | None) -> str:
    """What Delete did."""
    return render("deleted.html", job=job, run_id=run_id, removed_objects=removed_objects)
