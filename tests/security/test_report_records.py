"""The job report renders whatever the training wrote in its metrics series (issue 44.7): a record with a non-date
`ended_at` or a device name matplotlib would read as mathtext made `/report` a 500.
"""

from __future__ import annotations

import json

import pytest

from sat_tasks.io.metrics import RunMetrics, job_summary
from sat_tasks.pipeline.report_html import render_report_html


def _metrics(job: list[dict], system: list[dict]) -> RunMetrics:
    found = RunMetrics(source="s3://sat-demo/results/x/r/")
    training = [{"series": "training", "time": 100.0 + i, "attempt": a, "node": "n0", "global_step": i, "loss": 1.0,
                 "steps_per_second": 2.0} for a in (1, 2) for i in range(a * 10, a * 10 + 3)]
    found.add_file("metrics/attempt-1/n0/training.jsonl", "\n".join(json.dumps(r) for r in training))
    found.add_file("metrics/sat/job.jsonl", "\n".join(json.dumps(r) for r in job))
    found.add_file("metrics/attempt-1/n0/system.jsonl", "\n".join(json.dumps(r) for r in system))
    return found.finish()


GPU = {"series": "system", "time": 101.0, "attempt": 1, "node": "n0", "gpu_utilization_percent": 50,
       "gpu_memory_used_bytes": 1 << 30}


@pytest.mark.parametrize("ended_at", ["yesterday", "2026-12-07T10:00:00Z", [1], {"a": 1}, True, None])
def test_a_non_numeric_ended_at_renders(ended_at):
    job = [{"series": "job", "time": 105.0, "attempt": 1, "node": "n0", "event": "attempt_end", "status": "Failed",
            "verdict": "hardware", "ended_at": ended_at}]
    metrics = _metrics(job, [])
    summary = job_summary(metrics)
    assert summary["faults"][0]["ended_at"] == 105.0  # the record's own time
    assert "<h1>" in render_report_html(metrics, title="t")


@pytest.mark.parametrize("device", ["gpu$\\frac{$", "gpu0 $x^{$", "gpu$$", "gpu\\$", "gpu" + "$" * 200])
def test_a_device_name_is_drawn_as_text_never_as_mathtext(device):
    metrics = _metrics([], [{**GPU, "device": device}])
    page = render_report_html(metrics, title="t")
    assert "<h2>GPUs</h2>" in page
