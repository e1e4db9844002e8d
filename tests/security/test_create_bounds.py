"""Create bounds what it reads (issue 44.7): a body past 256 KiB is a short 413, read no further; JSON nested
100k deep (the body or Advanced) is a 422 naming the rule, never a 500; a 5000-character workspace name is a 404
that names no server path.

The app is Airflow's API server with the project's plugins (the fixtures of tests/sat_tasks/ui/test_api.py).
The TestClient raises a server error in the test, so a 500 fails it.
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import json
import time

import pytest

from sat_tasks.spec.loading import NESTING_RULE
from tests.sat_tasks.ui.test_api import _good_form, admin, app, client  # noqa: F401 (module-scoped fixtures)

BIG = 6 * 1024 * 1024
DEEP = 100_000


def test_a_create_body_past_the_bound_is_a_short_413(client, admin):
    form = _good_form("big-body", advanced=json.dumps({"env": {"X": "a" * BIG}}))
    started = time.monotonic()
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 413, response.text[:300]
    assert len(response.content) < 2048 and "larger than 262144 bytes" in response.text
    assert time.monotonic() - started < 20  # was 26 s and an 18 MB answer


def test_a_create_form_past_the_bound_is_a_413(client, admin):
    response = client.post("/sat/jobs/new", headers=admin,
                           data=_good_form("big-form", advanced=json.dumps({"env": {"X": "a" * BIG}})))
    assert response.status_code == 413 and len(response.content) < 2048


def test_advanced_json_nested_100k_deep_is_a_422_naming_the_rule(client, admin):
    form = _good_form("deep-advanced", advanced="[" * DEEP + "]" * DEEP)
    response = client.post("/sat/api/jobs", headers=admin, json={"form": form})
    assert response.status_code == 422, response.text[:300]
    assert {"field": "advanced", "rule": NESTING_RULE, "input": "advanced"} in response.json()["errors"]


def test_a_create_body_nested_100k_deep_is_a_422(client, admin):
    body = '{"form": ' + "[" * DEEP + "]" * DEEP + "}"
    response = client.post("/sat/api/jobs", headers={**admin, "Content-Type": "application/json"}, content=body)
    assert response.status_code == 422, response.text[:300]
    assert "nested at most 64 levels" in response.json()["detail"]


@pytest.mark.parametrize("method,path", [("PUT", "/sat/api/workspaces/{name}"), ("DELETE", "/sat/api/workspaces/{name}")])
def test_a_5000_character_workspace_name_is_a_404_naming_no_server_path(client, admin, method, path):
    from sat_tasks.io.workspaces import workspaces_dir

    response = client.request(method, path.format(name="w" * 5000), headers=admin,
                              **({"json": {"nodes": 1}} if method == "PUT" else {}))
    assert response.status_code == 404, response.text[:300]
    detail = response.json()["detail"]
    assert str(workspaces_dir()) not in detail and str(workspaces_dir().parent) not in detail
    assert detail.startswith("no workspace named 'wwww") and "a workspace name must be 1-63 chars" in detail
    assert len(response.content) < 2048
