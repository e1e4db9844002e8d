"""The spec's `test:` section, the overrides a test run gets, SAT's expected rehearsal outcomes, and failure messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from sat_tasks.spec import SpecError, load_spec, parse_spec
from sat_tasks.spec.testing import Rehearsal, Scenario
from sat_tasks.testing.checks import (
    JobCheckFailed,
    check_rehearsal,
    check_smoke,
    expected_outcome,
)
from sat_tasks.testing.runs import INJECT_DIR, FinishedRun, Overrides, short_job
from tests.support.paths import REPO

USER_REPO = REPO / "include" / "examples" / "user-repo"


def job(**fields):
    spec = {
        "name": "harness-job", "job_failover": True,
        "image": {"url": "registry.example.com/t/train:1", "registry_conn_id": "team_registry"},
        "data": {"source": "s3://team/data/"}, "results": {"destination": "s3://team/results/"},
        "command": 'python train.py --max_steps "${SAT_MAX_STEPS:-2000}"',
        "faults": [{"kind": "hang", "attempt": 1, "at_step": 3}],
        "test": {"max_steps": 20, "save_steps": 5, "env": {"EXTRA": "1"},
                 "rehearse": [{"scenario": "hardware_fault", "at_step": 8}]},
    }
    spec.update(fields)
    return parse_spec(spec)


def test_example_specs_carry_a_test_section():
    spec = load_spec(USER_REPO / "jobs" / "tiny-lm.yaml")
    assert spec.test.max_steps == 40 and spec.test.save_steps == 10 and spec.test.data_sample == 2
    assert [r.label for r in spec.test.rehearse] == ["hardware_fault@15", "user_error@5"]
    assert spec.test.seed[0].source == "../scripts/train.py"


@pytest.mark.parametrize(("section", "field", "rule"), [
    pytest.param({"rehearse": [{"scenario": "meteor", "at_step": 3}]}, "test.rehearse.0.scenario",
                 "must be one of", id="unknown-scenario"),
    pytest.param({"max_steps": 0}, "test.max_steps", "greater than or equal to 1", id="zero-steps"),
    pytest.param({"smoke_steps": 3}, "test.smoke_steps", "unknown field", id="unknown-field"),
    pytest.param({"rehearse": [{"scenario": "user_error", "at_step": 2}, {"scenario": "user_error", "at_step": 2}]},
                 "test.rehearse", "scenario listed twice: user_error@2", id="duplicate"),
])
def test_a_bad_test_section_is_a_spec_problem(section, field, rule):
    with pytest.raises(SpecError) as caught:
        job(test=section)
    assert any(p.field == field and rule in p.rule for p in caught.value.problems), caught.value.problems


def test_the_test_run_is_short_local_and_without_the_specs_faults():
    original = job()
    short = short_job(original, Overrides(max_steps=20, save_steps=5))
    assert short.env == {"EXTRA": "1", "SAT_MAX_STEPS": "20", "SAT_SAVE_STEPS": "5"}
    assert short.backend.value == "local" and short.faults == [] and short.test is None
    assert short.image.registry_conn_id is None and short.command == original.command
    assert original.test.max_steps == 20 and original.faults  # the spec itself is untouched


def test_command_line_overrides_win_over_the_section():
    resolved = Overrides(max_steps=7).resolve(job().test)
    assert (resolved.max_steps, resolved.save_steps, resolved.data_sample) == (7, 5, None)


@pytest.mark.parametrize(("scenario", "faults", "action"), [
    pytest.param("hardware_fault", [("hardware", 1, 8)], "hold", id="hardware"),
    pytest.param("spot_reclaim", [("preemption", 1, 8)], "hold", id="spot"),
    pytest.param("user_error", [], "raise", id="user-error"),
])
def test_a_rehearsal_injects_its_failure_at_its_step(scenario, faults, action):
    short = short_job(job(), Overrides(), Rehearsal(scenario=scenario, at_step=8))
    assert [(f.kind.value, f.attempt, f.at_step) for f in short.faults] == faults
    assert {k: v for k, v in short.env.items() if k.startswith("SAT_REHEARSE")} == {
        "SAT_REHEARSE_AT_STEP": "8", "SAT_REHEARSE_ATTEMPT": "1", "SAT_REHEARSE_ACTION": action}
    assert short.command.startswith(f"export PYTHONPATH={INJECT_DIR}${{PYTHONPATH:+:$PYTHONPATH}}; python train.py")


@pytest.mark.parametrize(("fields", "scenario", "expected"), [
    pytest.param({}, "hardware_fault", ("HARDWARE", "failover", "Pending - failoverinprogress", "Completed"),
                 id="failover"),
    pytest.param({"job_failover": False}, "hardware_fault", ("HARDWARE", "stop", "Failed", "Failed"),
                 id="no-failover"),
    pytest.param({"max_failovers": 0}, "hardware_fault",
                 ("HARDWARE", "stop", "Pending - maxretriesexceeded", "Pending - maxretriesexceeded"), id="no-budget"),
    pytest.param({"learning_type": "spot", "job_failover": False}, "spot_reclaim",
                 ("PREEMPTED", "resume", "Pending - preempted", "Completed"), id="spot"),
    pytest.param({"learning_type": "spot", "job_failover": False, "spot": {"max_resumes": 0}}, "spot_reclaim",
                 ("PREEMPTED", "stop", "Failed", "Failed"), id="spot-no-resumes"),
    pytest.param({}, "user_error", ("INTERNAL", "stop", "Pending - internalerror", "Pending - internalerror"),
                 id="user-error"),
])
def test_expected_outcomes_follow_sats_restart_policy(fields, scenario, expected):
    got = expected_outcome(job(**fields), Rehearsal(scenario=scenario, at_step=5))
    assert (got.verdict, got.action, got.decision_status, got.final_status) == expected


def finished(report: dict, log: str = "", **overrides) -> FinishedRun:
    run = FinishedRun(spec_path=Path("jobs/harness-job.yaml"), label="hardware_fault@8", job=job(),
                      overrides=Overrides(max_steps=20, save_steps=5, **overrides), report=report)
    run.__dict__["job_log"] = log
    return run


def report(status: str, *attempts: dict, checkpoints=(5, 10, 15, 20), global_step=20, between=()) -> dict:
    statuses = ["Pending", "Running", *between, status]
    return {"run_id": "manual__1", "status": status, "global_step": global_step, "results": "s3://team/r/",
            "history": [{"status": s, "at": f"t{i}", "reason": "why"} for i, s in enumerate(statuses)],
            "attempts": list(attempts), "checkpoints": [f"checkpoint-{s}" for s in checkpoints]}


def test_a_rehearsal_that_did_not_fail_over_says_what_sat_saw():
    attempt = {"attempt": 1, "node": "node-a", "exit_code": 1, "verdict": "INTERNAL", "step_at_end": 9,
               "last_committed_step": 5, "resumed_from": None,
               "evidence": ["Traceback (most recent call last):", "KeyError: 'labels'"]}
    run = finished(report("Pending - internalerror", attempt),
                   log="\n".join(f"line {i}" for i in range(100)) + "\nKeyError: 'labels'")
    with pytest.raises(JobCheckFailed) as caught:
        check_rehearsal(run, Rehearsal(scenario=Scenario.HARDWARE_FAULT, at_step=8))
    text = str(caught.value)
    assert text.startswith("jobs/harness-job.yaml: rehearsal hardware_fault@8 of job harness-job (expected: "
                           "verdict HARDWARE, then failover, final status 'Completed') failed:")
    assert "attempt 1 verdict INTERNAL, expected HARDWARE" in text
    assert "no attempt 2 ran, expected a failover after HARDWARE" in text
    assert "final status 'Pending - internalerror', expected 'Completed'" in text
    assert "evidence: KeyError: 'labels'" in text  # what the classifier saw
    assert "| KeyError: 'labels'" in text and "| line 71" in text and "| line 69" not in text  # the last 30 lines


def test_a_rehearsal_that_resumed_from_the_wrong_step_fails():
    first = {"attempt": 1, "node": "node-a", "verdict": "HARDWARE", "last_committed_step": 5, "step_at_end": 8}
    second = {"attempt": 2, "node": "node-b", "verdict": "SUCCEEDED", "resumed_from": None, "step_at_end": 20}
    between = ("Pending - failoverinprogress", "Running")
    run = finished(report("Completed", first, second, between=between))
    with pytest.raises(JobCheckFailed, match=r"attempt 2 resumed from step None, expected the last committed "
                                             r"checkpoint of attempt 1 \(step 5\)"):
        check_rehearsal(run, Rehearsal(scenario=Scenario.HARDWARE_FAULT, at_step=8))
    second["resumed_from"] = 5
    check_rehearsal(finished(report("Completed", first, second, between=between)), Rehearsal(scenario="hardware_fault", at_step=8))


def test_a_smoke_run_that_ignored_the_step_overrides_fails():
    attempt = {"attempt": 1, "node": "node-a", "verdict": "SUCCEEDED", "step_at_end": 2000}
    run = finished(report("Completed", attempt, checkpoints=(200, 400), global_step=2000))
    with pytest.raises(JobCheckFailed) as caught:
        check_smoke(run)
    assert "trained to step 2000, expected SAT_MAX_STEPS=20" in str(caught.value)
    assert "checkpoints at steps [200, 400], expected one every SAT_SAVE_STEPS=5 steps" in str(caught.value)
    check_smoke(finished(report("Completed", {**attempt, "step_at_end": 20})))


def test_a_failed_check_names_the_file_with_the_runs_airflow_logs(tmp_path):
    attempt = {"attempt": 1, "node": "node-a", "verdict": "SUCCEEDED", "step_at_end": 2000}
    run = finished(report("Completed", attempt, checkpoints=(200, 400), global_step=2000))
    run.airflow_log = tmp_path / "sat-logs" / "harness-job-smoke-20261202T040656Z-1.log"
    with pytest.raises(JobCheckFailed) as caught:
        check_smoke(run)
    assert str(caught.value).splitlines()[-1] == f"  Airflow's logs: {run.airflow_log}"
    run.report = None
    assert "  no job report was written: the run stopped before `finalize` (see Airflow's logs)" in run.describe()
