"""The view's pages as Jinja2 templates (`templates/`, autoescaped), their filters and the view's navigation.

Every page extends `base.html` (the navigation, the style, a `body` block and a `scripts`
block). A page is rendered with `render(name, **context)`; routes answer with the string,
or with `templates.TemplateResponse`. Every value is escaped by the template engine: a
template marks nothing safe that a person or a spec wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.templating import Jinja2Templates

from sat_tasks.core.links import AIRFLOW_VIEWS, FORM_VIEWS, job_page_path

TEMPLATES_DIR = Path(__file__).parent / "templates"

# The view's own navigation, on top of every page: (label, path), Airflow's entries for it less the
# forms. A new page of the view is a router in `sat_tasks.ui.app`, a template extending base.html
# and, when it is a place to go, an entry of `core.links.AIRFLOW_VIEWS`.
NAVIGATION: list[tuple[str, str]] = [(name, href) for name, href, route in AIRFLOW_VIEWS if route not in FORM_VIEWS]


def cell(value: Any) -> str:
    """A table cell's text: nothing for None."""
    return "" if value is None else str(value)


def duration(seconds: float | None) -> str:
    """`1h 02m 03s`, `2m 03s`; nothing for None."""
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def seconds(value: float | None) -> str:
    """`2.6 s` for a short span (a recovery's phases), `duration` from a minute on; `unknown` for None."""
    if value is None:
        return "unknown"
    return f"{value:.1f} s" if value < 60 else duration(value)


def size(n: int | None) -> str:
    """A byte count for people: `512 B`, `1.5 KiB`, ... `2.0 GiB`; nothing for None."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def job_href(row: dict[str, Any]) -> str:
    """A run's job page path relative to /sat/."""
    return job_page_path(row["dag_id"], row["run_id"]).removeprefix("/sat/")


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), autoescape=select_autoescape(["html"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(cell=cell, duration=duration, seconds=seconds, size=size, job_href=job_href)
    env.globals["navigation"] = NAVIGATION
    env.globals["airflow_routes"] = [route for _name, _href, route in AIRFLOW_VIEWS]
    return env


templates = Jinja2Templates(env=_environment())


def render(name: str, **context: Any) -> str:
    """The page `name` (a file under templates/) with `context`, as HTML text."""
    return templates.get_template(name).render(**context)
