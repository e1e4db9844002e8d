"""The team's own checks of a finished run, through SAT's fixtures (no knowledge of SAT's file layout)."""


def test_smoke_run_learns_and_keeps_its_checkpoints(sat_job_run):
    run = sat_job_run("jobs/tiny-lm.yaml")  # the same run as the generated `smoke` test: it runs once
    assert run.status == "Completed"
    assert run.checkpoints[-1] == 40
    loss = run.report["first_loss"][1], run.report["last_loss"][1]
    assert loss[1] < loss[0], f"the loss did not go down: {loss}"
    assert "Starting dataset initialization" in run.job_log
    metrics = run.metrics()  # the series SAT's Monitoring tab plots
    assert not metrics.problems and metrics.records.get("training"), (metrics.problems, sorted(metrics.records))
