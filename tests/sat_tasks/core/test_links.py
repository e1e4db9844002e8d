"""A run page's address is spelled so that decoding it changes nothing a browser would keep literal."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from sat_tasks.core.links import job_page_path, path_segment


@pytest.mark.parametrize("run_id", ["manual__2026-12-02T23:02:40.157810+00:00", "scheduled__2026-12-01T00:00:00+00:00",
                                    "backfill__2026-12-01T00:00:00+00:00", "team@lab,run=1;try(2)!"])
def test_airflow_run_ids_stay_as_they_are(run_id):
    # Airflow's embedded view rebuilds the frame's address from its decoded route and reloads the frame when they
    # differ: a run ID's address must be its own decoding
    path = job_page_path("sat_training_job", run_id)
    assert path == f"/sat/jobs/sat_training_job/runs/{run_id}" and unquote(path) == path


@pytest.mark.parametrize(("value", "spelled"), [("a/b", "a%2Fb"), ("50%", "50%25"), ("x?y#z", "x%3Fy%23z"),
                                                ("two words", "two%20words"), ("it's", "it%27s"), ("a&b", "a%26b"),
                                                ("é", "%C3%A9"), ("<b>", "%3Cb%3E")])
def test_what_would_change_the_path_or_the_page_is_still_encoded(value, spelled):
    assert path_segment(value) == spelled and unquote(path_segment(value)) == value
