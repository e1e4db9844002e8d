"""Compare runs (issue 45 item 7): the query's rule, the settings rows, and the loss curves on shared axes."""

from __future__ import annotations

import pytest

from sat_tasks.ui import compare


def _page(job: str, run_id: str, losses: list[float], **spec) -> dict:
    base = {"name": job, "learning_type": "on-demand", "framework": "pytorch", "nodes": 1,
            "resources": {"server_type": "g2", "gpus_per_node": 8, "memory": "512Gi"},
            "image": {"url": "registry.example.com/t:1"}, "data": {"source": "s3://d/x/"}, "command": "python t.py",
            "job_failover": True, "env": {"HF_TOKEN": "hf_secret_value", "LR": "3e-4"}}
    return {"job": job, "run_id": run_id, "status": "Completed", "goodput": 0.9, "gpu_hours": 1.5,
            "spec": {**base, **spec},
            "monitoring": {"loss": [{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)], "note": None}}


@pytest.mark.parametrize(("values", "says"), [
    (["dag/a"], "got 1"),
    ([f"dag/r{i}" for i in range(7)], "got 7"),
    (["dag/a", "dag/a"], "named twice"),
    (["no-slash", "dag/b"], "got 'no-slash'"),
    (["/run", "dag/b"], "got '/run'"),
])
def test_the_runs_are_named_as_the_rule_says(values, says):
    with pytest.raises(compare.CompareQueryError, match=says) as refused:
        compare.parse_refs(values)
    assert str(refused.value).startswith("run: name 2 to 6 runs as <dag_id>/<run_id>")


def test_a_run_id_keeps_its_slashes_and_colons():
    assert compare.parse_refs(["d1/manual__2026-12-07T10:00:00+00:00", "d2/a/b"]) == [
        ("d1", "manual__2026-12-07T10:00:00+00:00"), ("d2", "a/b")]


def test_settings_side_by_side_mark_what_differs_and_show_env_names_only():
    pages = [_page("sweep", "r1", [3.0, 2.0]), _page("sweep", "r2", [3.1, 1.5], nodes=2)]
    found = compare.comparison(pages, ["/sat/a", "/sat/b"])
    rows = {row["label"]: row for row in found["settings"]}
    assert rows["Nodes"] == {"label": "Nodes", "cells": ["1", "2"], "differs": True}
    assert rows["Framework"]["differs"] is False
    assert rows["Environment (names)"]["cells"] == ["HF_TOKEN, LR", "HF_TOKEN, LR"]
    assert "hf_secret_value" not in repr(found)
    assert [(r["last_loss"], r["steps"]) for r in found["runs"]] == [(2.0, 20), (1.5, 20)]


def test_the_curves_share_their_axes_one_line_per_run_that_logged():
    pages = [_page("a", "r1", [4.0, 2.0]), _page("b", "r2", []), _page("c", "r3", [1.0, 0.5, 0.25])]
    chart = compare.loss_chart(compare.comparison(pages, ["/1", "/2", "/3"])["series"])
    assert [label for _, _, label in chart.lines] == ["a · r1", "c · r3"]
    assert (chart.x_from, chart.x_to, chart.y_from, chart.y_to) == ("10", "30", "0", "4")
    first = chart.lines[0][1].split()
    assert first[0] == f"{chart.left:.1f},{chart.bottom - 1.0 * (chart.bottom - chart.top):.1f}"  # (10, 4.0)
    assert compare.loss_chart([]).lines == ()
