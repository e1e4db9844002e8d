"""The checks the plugin generates for each spec: DAG integrity, the smoke run, each rehearsal.

A failed check raises `JobCheckFailed` with lines that name the job, the step and what SAT
saw (status history, verdicts and their evidence, the last lines of the job log), so a
CI log says why without a debugger. Expected rehearsal outcomes come from SAT's own
restart policy (`sat_tasks.core.policy.decide_next`) applied to the job's settings, unless
the rehearsal names `expect_status`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ckpt_engine.contract import (
    CONCURRENT_DIR,
    LAST_STEP_ENV,
    MAX_STEPS_ENV,
    OUTPUT_DIR_ENV,
    SAVE_STEPS_ENV,
)
from sat_tasks.config import PROJECT_ROOT
from sat_tasks.core.attempt import attempt_group_id
from sat_tasks.spec import TrainingJob
from sat_tasks.spec.testing import Rehearsal, Scenario
from sat_tasks.testing.runs import FinishedRun

BASE_TASKS = ("validate_spec", "check_image", "stage_data", "validate_data", "upload_results", "finalize",
              "cleanup_run")
GROUP_TASKS = ("classify", "decide", "cleanup")
COMPLETED = "Completed"


class JobCheckFailed(AssertionError):
    """A generated check failed; `lines` say which job, which step, and what SAT saw."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


# ---- DAG integrity --------------------------------------------------------------------------------
@contextmanager
def _jobs_dir(folder: Path) -> Iterator[None]:
    previous = os.environ.get("AIRFLOW__SAT__JOBS_DIR")
    os.environ["AIRFLOW__SAT__JOBS_DIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("AIRFLOW__SAT__JOBS_DIR", None)
        else:
            os.environ["AIRFLOW__SAT__JOBS_DIR"] = previous


@cache
def load_folder(folder: Path) -> Any:
    """SAT's job DAG files parsed by Airflow's DagBag with `folder` as the jobs dir (once per folder)."""
    from airflow.dag_processing.dagbag import DagBag

    with _jobs_dir(folder):
        bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"), safe_mode=False)
    return bag


def check_integrity(spec_path: Path) -> TrainingJob:
    """The spec validates, its DAG file imports, and the DAG has the tasks and attempt groups the job implies."""
    from sat_tasks.spec import SpecError, dag_id_for, load_spec

    try:
        job = load_spec(spec_path)
    except SpecError as exc:
        raise JobCheckFailed([(f"{spec_path}: the spec is invalid ({len(exc.problems)} problem(s)); fix the "
                              "fields named:")] + [f"  {problem}" for problem in exc.problems]) from None
    bag = load_folder(spec_path.parent.resolve())
    mine = [text for text in bag.import_errors.values() if str(spec_path.resolve()) in text]
    if mine:
        raise JobCheckFailed([f"{spec_path}: SAT's DAG files report an import error for this spec:"]
                             + [f"  {line}" for text in mine for line in text.splitlines()])
    others = {f: text for f, text in bag.import_errors.items() if "sat_job_spec_errors" not in f}
    if others:
        raise JobCheckFailed([f"{spec_path}: a DAG file failed to import:"]
                             + [f"  {f}: {text.splitlines()[-1] if text else ''}" for f, text in others.items()])
    dag = bag.dags.get(dag_id_for(job))
    if dag is None:
        raise JobCheckFailed([f"{spec_path}: no DAG {dag_id_for(job)!r} was built (DAGs: {sorted(bag.dags)})"])
    problems = dag_problems(job, dag)
    if problems:
        raise JobCheckFailed([(f"{spec_path}: the DAG of job {job.name} is not what a {job.learning_type.value} job "
                              f"with job_failover={job.job_failover} needs:")] + [f"  {p}" for p in problems])
    return job


def dag_problems(job: TrainingJob, dag: Any) -> list[str]:
    """What is missing or extra in the job's DAG, in words (empty: as expected)."""
    problems = []
    ids = set(dag.task_dict)
    problems += [f"task {task} is missing" for task in BASE_TASKS if task not in ids]
    expected_groups = [attempt_group_id(k) for k in range(1, job.max_attempts() + 1)]
    groups = sorted({tid.split(".", 1)[0] for tid in ids if "." in tid}, key=lambda g: (len(g), g))
    if groups != expected_groups:
        problems.append(f"attempt groups {groups}, expected {expected_groups} (1 + "
                        + ("spot.max_resumes" if job.is_spot else "max_failovers" if job.job_failover else "0") + ")")
    for k, group in enumerate(expected_groups, start=1):
        inside = {tid.split(".", 1)[1] for tid in ids if tid.startswith(group + ".")}
        problems += [f"{group}.{task} is missing" for task in GROUP_TASKS if task not in inside]
        if not inside - set(GROUP_TASKS) - {"wait_for_capacity", "watch_growth"}:
            problems.append(f"{group} has no launch task")
        waits = "wait_for_capacity" in inside
        if waits != (k > 1 and job.is_spot):
            problems.append(f"{group}.wait_for_capacity is {'present' if waits else 'missing'}")
    finalize = dag.task_dict.get("finalize")
    if finalize is not None and str(finalize.trigger_rule) not in ("all_done", "TriggerRule.ALL_DONE"):
        problems.append(f"finalize runs on {finalize.trigger_rule}, not all_done")
    if not dag.tags:
        problems.append("the DAG has no tags")
    if not (dag.default_args or {}).get("owner"):
        problems.append("the DAG has no owner")
    return problems


# ---- smoke -----------------------------------------------------------------------------------------
def check_smoke(run: FinishedRun) -> None:
    """The short run completed, trained the steps asked for, and committed checkpoints every `save_steps`."""
    problems = []
    if run.status != COMPLETED:
        problems.append(f"final status {run.status!r}, expected {COMPLETED!r}")
    if run.attempts and run.verdicts != ["SUCCEEDED"]:
        problems.append(f"verdicts {run.verdicts}, expected ['SUCCEEDED'] (one attempt, no fault)")
    steps = run.overrides.max_steps
    reached = run.global_step if run.global_step is not None else (run.attempts[-1].get("step_at_end")
                                                                    if run.attempts else None)
    if steps and run.status == COMPLETED and reached != steps:
        problems.append(f"trained to step {reached}, expected {MAX_STEPS_ENV}={steps}: the command must pass it on, "
                        f'e.g. --max_steps "${{{MAX_STEPS_ENV}:-5000}}"')
    every = run.overrides.save_steps
    if run.status == COMPLETED and not run.checkpoints:
        problems.append("no checkpoint was committed: does the script checkpoint through SAT's engine "
                        f"(DecoratedCheckpointing, or CheckpointEngine under ${OUTPUT_DIR_ENV}/{CONCURRENT_DIR})?")
    elif every and _off_interval(run.checkpoints, reached, every):
        problems.append(f"checkpoints at steps {run.checkpoints}, expected one every {SAVE_STEPS_ENV}={every} steps: "
                        f'the command must pass it on, e.g. --save_steps "${{{SAVE_STEPS_ENV}:-500}}"')
    if problems:
        raise JobCheckFailed([f"{run.spec_path}: smoke run of job {run.job.name} failed:"]
                             + [f"  {p}" for p in problems] + run.describe())


def _off_interval(steps: list[int], last: int | None, every: int) -> bool:
    """Whether the kept checkpoints (retention may have removed early ones) are not every `every` steps.

    A final checkpoint at the last step may come off the interval.
    """
    regular = [step for step in steps if step != last]
    return any(step % every for step in regular) or any(b - a != every for a, b in itertools.pairwise(regular))


# ---- rehearsals --------------------------------------------------------------------------------------
VERDICT_OF = {Scenario.HARDWARE_FAULT: "HARDWARE", Scenario.SPOT_RECLAIM: "PREEMPTED", Scenario.USER_ERROR: "INTERNAL"}


@dataclass(frozen=True)
class Expected:
    """What SAT must do in a rehearsal: the first attempt's verdict, the decision, the final status."""

    verdict: str
    action: str  # failover, resume or stop (sat_tasks.core.handoffs.Action)
    decision_status: str | None  # the status the decision records (None: none)
    final_status: str


def expected_outcome(job: TrainingJob, rehearsal: Rehearsal) -> Expected:
    """SAT's restart policy applied to this job and the rehearsal's verdict."""
    from sat_tasks.core.handoffs import Action, Plan, Verdict, VerdictKind
    from sat_tasks.core.policy import decide_next

    verdict = VERDICT_OF[rehearsal.scenario]
    decision = decide_next(job, Plan(attempt=1), Verdict(kind=VerdictKind(verdict), attempt=1, node="node"), now=0.0)
    status = decision.status.value if decision.status is not None else None
    final = status if decision.action is Action.STOP else COMPLETED
    return Expected(verdict=verdict, action=decision.action.value, decision_status=status,
                    final_status=rehearsal.expect_status or final)


def check_rehearsal(run: FinishedRun, rehearsal: Rehearsal) -> None:
    """The rehearsal reached the verdict, the decision, the resume step and the final status SAT must reach."""
    expected = expected_outcome(run.job, rehearsal)
    problems = []
    attempts = run.attempts
    first = attempts[0] if attempts else {}
    if not attempts:
        problems.append("no attempt ran: the job stopped before training (see the status history)")
    elif first.get("verdict") != expected.verdict:
        problems.append(f"attempt 1 verdict {first.get('verdict')}, expected {expected.verdict}")
    steps = run.overrides.max_steps
    if steps and first.get("step_at_end") is not None and first["step_at_end"] >= steps:
        problems.append(f"attempt 1 reached the last step ({first['step_at_end']}) before the failure at step "
                        f"{rehearsal.at_step} struck: nothing was rehearsed; rehearse at an earlier step")
    if expected.decision_status and expected.decision_status not in run.statuses:
        problems.append(f"the decision after attempt 1 should record {expected.decision_status!r} ({expected.action}); "
                        f"statuses were {run.statuses}")
    if expected.action == "stop":
        if len(attempts) > 1:
            problems.append(f"{len(attempts)} attempts ran, expected 1 (SAT stops after {expected.verdict})")
    elif attempts:
        if len(attempts) < 2:
            problems.append(f"no attempt 2 ran, expected a {expected.action} after {expected.verdict}")
        else:
            committed, second = first.get("last_committed_step"), attempts[1]
            if rehearsal.at_step >= (run.overrides.save_steps or 1) and committed is None:
                problems.append(f"no checkpoint was committed before the failure at step {rehearsal.at_step}: "
                                "the resume starts from scratch")
            if second.get("resumed_from") != committed:
                problems.append(f"attempt 2 resumed from step {second.get('resumed_from')}, expected the last "
                                f"committed checkpoint of attempt 1 (step {committed}): does the script resume "
                                f"when {LAST_STEP_ENV} is set?")
            if expected.action == "failover" and second.get("node") == first.get("node"):
                problems.append(f"attempt 2 ran on {second.get('node')}, the node that failed")
    if run.status != expected.final_status:
        problems.append(f"final status {run.status!r}, expected {expected.final_status!r}")
    if problems:
        raise JobCheckFailed([(f"{run.spec_path}: rehearsal {rehearsal.label} of job {run.job.name} "
                              f"(expected: verdict {expected.verdict}, then {expected.action}, final status "
                              f"{expected.final_status!r}) failed:")] + [f"  {p}" for p in problems] + run.describe())
