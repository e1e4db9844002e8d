"""Bulk Stop and Delete from the list (issue 45.7): one confirmation, each run checked as its own route checks it."""

from __future__ import annotations

import html

import pytest

from sat_tasks.ui.routers.bulk import MAX_RUNS, BulkQueryError, parse
from tests.sat_tasks.ui import test_api
from tests.sat_tasks.ui.test_api import GENERIC, _good_form, _headers, _set_state

app, client, admin = test_api.app, test_api.client, test_api.admin  # the module-scoped app, its client, the admin

OWN = {"Origin": "http://sat.test"}


def _person(name: str, role: str = "user") -> dict[str, str]:
    return {**_headers(name, role), **OWN}


def _create(client, who: str, name: str) -> str:
    response = client.post("/sat/api/jobs", headers=_person(who), json={"form": _good_form(name)})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def _state(client, admin, run_id: str) -> str | None:
    response = client.get(f"/api/v2/dags/{GENERIC}/dagRuns/{run_id}", headers=admin)
    return response.json()["state"] if response.status_code == 200 else None


def _rows(page: str) -> dict[str, str]:
    """run id -> what the page says happens (or happened) to it."""
    import re

    text = html.unescape(page)
    return {run: said for run, said in re.findall(
        r"data-run='sat_training_job/([^']+)'>.*?<td>(?:<span class='error'>)?([^<]*)(?:</span>)?</td></tr>", text,
        re.DOTALL)}


def _statuses(page: str) -> dict[str, str]:
    """Each listed run's Status cell (the status word's text)."""
    import re

    return dict(re.findall(r"data-run='sat_training_job/([^']+)'>.*?<td><span class='status \w*'>([^<]*)</span></td>",
                           html.unescape(page), re.DOTALL))


def test_the_rule_is_named_for_a_bad_request():
    assert parse("stop", ["d/r", "d/r", "e/s"]) == ("stop", [("d", "r"), ("e", "s")])
    for action, runs in (("pause", ["d/r"]), ("stop", []), ("stop", ["no-slash"]), ("delete", ["/r"]),
                         ("stop", [f"d/r{i}" for i in range(MAX_RUNS + 1)])):
        with pytest.raises(BulkQueryError, match="action: stop or delete"):
            parse(action, runs)


def test_a_person_stops_the_ticked_jobs_after_one_confirmation_and_others_runs_are_skipped(client, admin):
    mine, ended = _create(client, "carol", "carol-one"), _create(client, "carol", "carol-two")
    _set_state(GENERIC, ended, "success")
    theirs = _create(client, "dave", "dave-one")
    runs = [f"{GENERIC}/{r}" for r in (mine, ended, theirs)]

    asked = client.get("/sat/jobs/bulk", params={"action": "stop", "run": runs}, headers=_person("carol"))
    assert asked.status_code == 200, asked.text
    rows = _rows(asked.text)
    assert rows[mine] == "stop" and rows[ended] == "skipped: already ended: nothing to stop"
    statuses = _statuses(asked.text)  # the job's status in the list's words, not Airflow's run state
    assert statuses[mine] == "Pending" and statuses[ended] == "Completed", statuses
    assert "success" not in statuses.values() and "queued" not in statuses.values()
    assert rows[theirs] == "skipped: not found (or not yours to see)"  # dave's: as its own page answers
    assert "dave-one" not in asked.text and "Stop 1 of 3 selected jobs?" in html.unescape(asked.text)
    assert _state(client, admin, mine) in ("queued", "running")  # asking changed nothing

    refused = client.post("/sat/jobs/bulk", data={"action": "stop", "run": runs},
                          headers={**_headers("carol"), "Origin": "https://evil.example"})
    assert refused.status_code == 403 and _state(client, admin, mine) in ("queued", "running")

    done = client.post("/sat/jobs/bulk", data={"action": "stop", "run": runs}, headers=_person("carol"))
    assert done.status_code == 200, done.text
    rows = _rows(done.text)
    assert rows[mine] == "stop requested" and rows[theirs].startswith("skipped: not found")
    assert _state(client, admin, mine) == "failed"  # queued, never launched: the DAG run ends at once
    assert _state(client, admin, theirs) in ("queued", "running")  # dave's job goes on


def test_a_viewer_may_not_stop_and_delete_keeps_a_running_job(client, admin):
    running, ended = _create(client, "erin", "erin-one"), _create(client, "erin", "erin-two")
    _set_state(GENERIC, running, "running")
    _set_state(GENERIC, ended, "failed")
    runs = [f"{GENERIC}/{r}" for r in (running, ended)]

    viewer = client.post("/sat/jobs/bulk", data={"action": "stop", "run": runs}, headers=_person("vera", "viewer"))
    assert all(said.startswith("skipped") for said in _rows(viewer.text).values()), viewer.text  # not hers either

    done = client.post("/sat/jobs/bulk", data={"action": "delete", "run": runs}, headers=_person("erin"))
    rows = _rows(done.text)
    assert rows[running] == "skipped: running: stop it first"
    assert rows[ended].startswith("deleted") and "results stay in Object Storage" in rows[ended]
    assert _state(client, admin, ended) is None and _state(client, admin, running) == "running"
    bad = client.get("/sat/jobs/bulk", params={"action": "pause", "run": runs[0]}, headers=_person("erin"))
    assert bad.status_code == 400 and "action: stop or delete" in html.unescape(bad.text)


def test_the_list_offers_stop_and_delete_of_the_ticked_runs(client, admin):
    page = client.get("/sat/jobs", headers=admin)
    assert "formaction='/sat/jobs/bulk' name='action' value='stop' id='stop-selected'" in page.text
    assert "formaction='/sat/jobs/bulk' name='action' value='delete' id='delete-selected'" in page.text
