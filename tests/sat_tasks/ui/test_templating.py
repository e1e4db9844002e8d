"""The view's templates: autoescaped, shipped with the package, one block per job-page tab, the navigation on top."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch

import pytest

from sat_tasks.ui import pages
from sat_tasks.ui.templating import (
    NAVIGATION,
    TEMPLATES_DIR,
    duration,
    render,
    size,
    templates,
)
from tests.support.paths import REPO


@pytest.mark.parametrize(("seconds", "text"), [
    pytest.param(None, "", id="none"),
    pytest.param(59.9, "0m 59s", id="seconds"),
    pytest.param(3723, "1h 02m 03s", id="hours"),
])
def test_duration(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize(("n", "text"), [
    pytest.param(None, "", id="none"),
    pytest.param(512, "512 B", id="bytes"),
    pytest.param(1536, "1.5 KiB", id="kib"),
    pytest.param(5 * 1024 ** 3, "5.0 GiB", id="gib"),
    pytest.param(3 * 1024 ** 4, "3072.0 GiB", id="beyond-gib"),
])
def test_size(n, text):
    assert size(n) == text


def test_every_value_is_escaped_and_the_navigation_is_on_top():
    html = render("deleted.html", job="<img src=x onerror=alert(1)>", run_id="r'1", removed_objects=None)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html and "r&#39;1" in html
    nav = html[html.index("<nav class='views'>"):html.index("</nav>")]
    assert [f"<a href='{href}'>{label}</a>" in nav for label, href in NAVIGATION] == [True] * len(NAVIGATION)
    # Airflow's entries for the view, less the Create form (the list page's button)
    assert NAVIGATION == [("Training Jobs", "/sat/jobs"), ("Workspaces", "/sat/workspaces"), ("Nodes", "/sat/nodes")]
    assert "/sat/jobs/new" not in nav
    assert html.index("</nav>") < html.index("<h1>")


def test_each_job_page_tab_is_a_block_of_the_job_template():
    """A new tab is a line in pages.TABS and a block of its name in job.html: one without the other fails here."""
    blocks = set(templates.env.get_template("job.html").blocks)
    assert {tab for tab, _label in pages.TABS} <= blocks


def test_the_templates_are_package_data():
    """What `pip install` ships: every file under templates/ matches the package-data patterns."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["sat_tasks.ui"]
    files = sorted(p.relative_to(TEMPLATES_DIR.parent).as_posix() for p in TEMPLATES_DIR.rglob("*") if p.is_file())
    assert files and [f for f in files if not any(fnmatch(f, pattern) for pattern in data)] == []
