"""Every link of the view works inside Airflow's embedded view: no target or navigation its iframe's sandbox refuses.

Airflow 3 shows a plugin's external view (the Training Jobs, Workspaces and Nodes menu
entries) in an iframe sandboxed with `allow-scripts allow-same-origin allow-forms
allow-downloads`: no `allow-top-navigation*`, no `allow-popups`. A link with target `_top`,
`_parent` or `_blank`, `window.open` or a script setting the top window's location does
nothing there ("Unsafe attempt to initiate navigation"). The view's pages navigate in place;
links to Airflow's own pages move Airflow's app (templates/airflow_links.js).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

VIEW_SANDBOX = "allow-scripts allow-same-origin allow-forms allow-downloads"
TEMPLATES = ROOT / "sat_tasks" / "ui" / "templates"
# Python modules that write HTML a /sat page serves (the job report).
HTML_WRITERS = [ROOT / "sat_tasks" / "pipeline" / "report_html.py"]
FORBIDDEN = [
    ("a target other than _self", re.compile(r"""<[a-zA-Z]+\b[^>]*\s(?:form)?target\s*=\s*(?!['"]?_self\b)""")),
    ("window.open (popups are not allowed)", re.compile(r"\bwindow\.open\s*\(|\bopen\s*\(\s*['\"]https?:")),
    ("navigating the top or parent window", re.compile(
        r"\b(?:top|parent)\.location(?:\.href)?\s*=(?!=)|\b(?:top|parent)\.location\.(?:assign|replace)\s*\(")),
]


def offences(text: str) -> list[str]:
    return [rule for rule, pattern in FORBIDDEN if pattern.search(text)]


def _sources() -> list[Path]:
    return sorted(p for p in TEMPLATES.rglob("*") if p.suffix in {".html", ".js"}) + HTML_WRITERS


def test_no_page_of_the_view_uses_a_navigation_the_sandbox_refuses():
    found = {str(path.relative_to(ROOT)): offences(path.read_text()) for path in _sources()}
    assert {path: rules for path, rules in found.items() if rules} == {}
    assert len(found) > 10  # the templates were found


@pytest.mark.parametrize(("text", "rule"), [
    pytest.param("<a href='/dags/x' target='_top'>grid</a>", "a target other than _self", id="target-top"),
    pytest.param('<a class="b" target=_blank href="/sat/r">report</a>', "a target other than _self", id="target-blank"),
    pytest.param("<form method='post' target='_parent'>", "a target other than _self", id="form-target"),
    pytest.param("<button formtarget='_blank'>", "a target other than _self", id="formtarget"),
    pytest.param("window.open('/sat/jobs/x/report')", "window.open (popups are not allowed)", id="window-open"),
    pytest.param("window.top.location.href = '/dags/x'", "navigating the top or parent window", id="top-location"),
    pytest.param("parent.location.assign('/x')", "navigating the top or parent window", id="parent-assign"),
])
def test_the_guard_finds_a_planted_navigation(text, rule):
    assert offences(text) == [rule]


@pytest.mark.parametrize("text", [
    pytest.param("<a href='/sat/jobs' target='_self'>jobs</a>", id="self"),
    pytest.param("var a=e.target.closest('a');", id="event-target"),
    pytest.param("if(window.top===window)return;", id="comparing-top"),
    pytest.param("top.history.pushState(null,'',href)", id="history"),
])
def test_the_guard_lets_in_place_navigation_be(text):
    assert offences(text) == []


def test_airflows_external_view_sandbox_is_the_one_the_view_is_built_for():
    """The installed Airflow UI frames plugin views with this sandbox; if an upgrade changes it, look again."""
    import airflow

    bundles = list((Path(airflow.__file__).parent / "ui" / "dist" / "assets").glob("index-*.js"))
    sandboxes = {value for bundle in bundles for value in re.findall(r"sandbox:`([^`]*)`", bundle.read_text())}
    assert VIEW_SANDBOX in sandboxes, sandboxes
    assert "allow-top-navigation" not in VIEW_SANDBOX and "allow-popups" not in VIEW_SANDBOX


def test_each_page_names_the_airflow_entry_it_belongs_to_and_the_plugin_lists_the_same_entries():
    """The plugin's menu entries are core.links.AIRFLOW_VIEWS; a page of one (list, job page, Workspaces, Nodes) names
    it on its body, which airflow_view.js (on every page) uses to move Airflow's route there; forms stay neutral."""
    from plugins.sat_training_jobs import SatTrainingJobsPlugin
    from sat_tasks.core.links import AIRFLOW_VIEWS

    routes = [route for _name, _href, route in AIRFLOW_VIEWS]
    assert [(v["name"], v["href"], v["url_route"]) for v in SatTrainingJobsPlugin.external_views] == list(AIRFLOW_VIEWS)
    owners = {}
    for template in TEMPLATES.glob("*.html"):
        found = re.search(r"{% block airflow_view %}([^{]*){% endblock %}", template.read_text())
        if found and template.name != "base.html":
            owners[template.name] = found.group(1)
    assert owners == {"jobs.html": "training-jobs", "job.html": "training-jobs", "compare.html": "training-jobs",
                      "workspaces.html": "workspaces",
                      "nodes.html": "nodes"}, owners
    assert set(owners.values()) <= set(routes)
    base = (TEMPLATES / "base.html").read_text()
    assert "data-airflow-view='{% block airflow_view %}{% endblock %}'" in base and '"airflow_view.js"' in base
    script = (TEMPLATES / "airflow_view.js").read_text()
    assert "replaceState" in script and "/plugin/" in script and not offences(script)


def test_airflows_plugin_route_is_the_entry_then_the_frames_own_path():
    """airflow_view.js writes `/plugin/<url_route><the frame's path>`: the installed UI builds the route that way."""
    import airflow

    bundles = list((Path(airflow.__file__).parent / "ui" / "dist" / "assets").glob("index-*.js"))
    text = "".join(bundle.read_text() for bundle in bundles)
    assert re.search(r"=`/plugin/\$\{\w+\?\?``\}`", text), "Airflow's plugin route is no longer /plugin/<url_route>"
    assert re.search(r"pathname:`\$\{\w+\}\$\{\w+\}`", text), "Airflow no longer appends the frame's path to its route"


def test_a_page_renders_its_entry_and_the_routes_it_may_move_between():
    """A neutral page (not found) names no entry, so it never moves Airflow's route; the routes are SAT's four."""
    from sat_tasks.ui.templating import render

    page = render("not_found.html", detail="no run r")
    assert "<body data-airflow-view=''>" in page
    assert '["training-jobs", "create-training-job", "workspaces", "nodes"]' in page
