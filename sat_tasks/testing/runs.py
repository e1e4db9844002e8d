"""Turn a spec into a short local test run (or a rehearsal), run it through its DAG, and read back what it left.

`short_job` applies the overrides to a copy of the job, never to the spec file: the local
backend, `SAT_MAX_STEPS` / `SAT_SAVE_STEPS` in the environment, a data sample, no registry
connection (the local backend pulls no image), no injected faults but the rehearsal's.
`run_spec` runs it as `sat run` does (`sat_tasks.cli.run.run_job`: the job's own DAG, from
the session's jobs dir, with `dag.test()`) and returns a `FinishedRun`: what a user's test
reads, in SAT's words.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from ckpt_engine.contract import (
    JOB_LOG_NAME,
    MAX_STEPS_ENV,
    REHEARSE_ACTION_ENV,
    REHEARSE_AT_STEP_ENV,
    REHEARSE_ATTEMPT_ENV,
    SAVE_STEPS_ENV,
)
from sat_tasks.spec import FaultKind, TrainingJob, parse_spec
from sat_tasks.spec.testing import (
    JobTest,
    Rehearsal,
    Scenario,
)
from sat_tasks.testing.session import HarnessSession

SMOKE = "smoke"
INJECT_DIR = Path(__file__).parent / "inject"
LOG_TAIL = 30


@dataclass(frozen=True)
class Overrides:
    """What makes a run short; each value, when set, wins over the spec's `test:` section (command line)."""

    max_steps: int | None = None
    save_steps: int | None = None
    data_sample: int | None = None

    def resolve(self, section: JobTest | None) -> Overrides:
        """These overrides over the spec's `test:` values."""
        section = section or JobTest()
        return Overrides(
            max_steps=self.max_steps or section.max_steps,
            save_steps=self.save_steps or section.save_steps,
            data_sample=self.data_sample or section.data_sample,
        )


def short_job(job: TrainingJob, overrides: Overrides, rehearsal: Rehearsal | None = None) -> TrainingJob:
    """A copy of `job` for a local test run: short, on the local backend, with the rehearsal's failure only."""
    data = job.to_dict()
    section = job.test or JobTest()
    env = {**data.get("env", {}), **section.env}
    if overrides.max_steps:
        env[MAX_STEPS_ENV] = str(overrides.max_steps)
    if overrides.save_steps:
        env[SAVE_STEPS_ENV] = str(overrides.save_steps)
    data.update(backend="local", env=env, faults=[], test=None, schedule=None)
    data["image"] = {**data["image"], "registry_conn_id": None}
    if rehearsal is not None:
        if rehearsal.scenario is Scenario.HARDWARE_FAULT:
            data["faults"] = [{"kind": FaultKind.HARDWARE.value, "attempt": 1, "at_step": rehearsal.at_step,
                               "xid": 79}]
        elif rehearsal.scenario is Scenario.SPOT_RECLAIM:
            data["faults"] = [{"kind": FaultKind.PREEMPTION.value, "attempt": 1, "at_step": rehearsal.at_step}]
            data["spot"] = {**data["spot"], "poll_seconds": min(data["spot"]["poll_seconds"], 1)}
        # inject/sitecustomize.py: the script raises (user_error), or holds at the step until the fault strikes
        env.update({REHEARSE_AT_STEP_ENV: str(rehearsal.at_step), REHEARSE_ATTEMPT_ENV: "1",
                    REHEARSE_ACTION_ENV: "raise" if rehearsal.scenario is Scenario.USER_ERROR else "hold"})
        data["command"] = (f"export PYTHONPATH={shlex.quote(str(INJECT_DIR))}${{PYTHONPATH:+:$PYTHONPATH}}; "
                           + data["command"])
    return parse_spec(data, source=f"{job.name} (test run)")


def run_spec(session: HarnessSession, spec_path: Path, job: TrainingJob, overrides: Overrides,
             rehearsal: Rehearsal | None = None) -> FinishedRun:
    """The smoke run (`rehearsal` None) or a rehearsal of the spec's `job`, once per session."""
    label = rehearsal.label if rehearsal is not None else SMOKE

    def start() -> FinishedRun:
        from sat_tasks.cli.run import run_job

        hook = session.hook()
        session.ensure_db()
        session.seed(spec_path, job)
        resolved = overrides.resolve(job.test)
        short = short_job(job, resolved, rehearsal)
        if resolved.data_sample:
            sample = session.sample_data(short, resolved.data_sample)
            short = parse_spec({**short.to_dict(), "data": {**short.to_dict()["data"], "source": sample}},
                               source=f"{job.name} (test run)")
        # The job's own DAG, as `sat run` builds it for a spec in the jobs dir (the session's, empty otherwise).
        staged_spec = session.jobs_dir / f"{short.name}.yaml"
        staged_spec.write_text(yaml.safe_dump(short.to_dict(), sort_keys=False), encoding="utf-8")
        airflow_log = session.log_path(short.name, label)
        try:  # as `sat run` prints it: steps, status changes, the summary; Airflow's logs in their file
            report = run_job(short, staged_spec, airflow_log=airflow_log)
        finally:
            staged_spec.unlink(missing_ok=True)
        return FinishedRun(spec_path=spec_path, label=label, job=short, overrides=resolved, report=report, hook=hook,
                           airflow_log=airflow_log)

    return session.run(spec_path, label, start)


@dataclass
class FinishedRun:
    """A finished test run of one job, read from Object Storage (the job report, its log, metrics, checkpoints).

    `status` is the final job status; `statuses` the status history in order; `attempts` one
    dict per attempt (`verdict`, `node`, `evidence`, `resumed_from`, `last_committed_step`,
    `step_at_end`, `exit_code`); `checkpoints` the committed steps; `job_log` the log all
    attempts appended to; `metrics()` the run's metrics series (`sat_tasks.io.metrics`);
    `airflow_log` the file that holds Airflow's logs of the run (the task runner's, every task's).
    """

    spec_path: Path
    label: str
    job: TrainingJob
    overrides: Overrides
    report: dict[str, Any] | None
    hook: Any = field(repr=False, default=None)
    airflow_log: Path | None = None

    @property
    def run_id(self) -> str | None:
        return (self.report or {}).get("run_id")

    @property
    def status(self) -> str | None:
        return (self.report or {}).get("status")

    @property
    def history(self) -> list[dict[str, Any]]:
        return list((self.report or {}).get("history") or [])

    @property
    def statuses(self) -> list[str]:
        return [entry["status"] for entry in self.history]

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return list((self.report or {}).get("attempts") or [])

    @property
    def verdicts(self) -> list[str | None]:
        return [attempt.get("verdict") for attempt in self.attempts]

    @property
    def checkpoints(self) -> list[int]:
        return sorted(int(name.rsplit("-", 1)[1]) for name in (self.report or {}).get("checkpoints") or [])

    @property
    def results_uri(self) -> str | None:
        return (self.report or {}).get("results")

    @property
    def global_step(self) -> int | None:
        return (self.report or {}).get("global_step")

    @cached_property
    def job_log(self) -> str:
        """The job's log (every attempt), from the results; '' when the run never got that far."""
        if not self.results_uri or self.hook is None:
            return ""
        from sat_tasks.spec import split_s3_uri

        bucket, key = split_s3_uri(self.results_uri + JOB_LOG_NAME)
        if not self.hook.check_for_key(key, bucket_name=bucket):
            return ""
        return self.hook.read_key(key, bucket_name=bucket)

    def log_tail(self, lines: int = LOG_TAIL) -> list[str]:
        return self.job_log.splitlines()[-lines:]

    def metrics(self):
        """The run's metrics series (`sat_tasks.io.metrics.RunMetrics`): training steps, checkpoint saves, job."""
        from sat_tasks.io.metrics import read_object_storage

        return read_object_storage(self.results_uri, self.hook)

    def describe(self) -> list[str]:
        """What SAT saw, for a failure message: the status history, each attempt's verdict and evidence, the log tail."""
        lines = [(f"job {self.job.name} ({self.spec_path}), {self.label} run {self.run_id or '(none)'}: "
                 f"final status {self.status!r}")]
        if self.report is None:
            lines.append("  no job report was written: the run stopped before `finalize` (see Airflow's logs)")
        for entry in self.history:
            lines.append(f"  status {entry.get('status')!r} at {entry.get('at')}: {entry.get('reason')}")
        for attempt in self.attempts:
            lines.append(f"  attempt {attempt.get('attempt')} on {attempt.get('node')}: exit {attempt.get('exit_code')}, "
                         f"verdict {attempt.get('verdict')}, step at end {attempt.get('step_at_end')}, last "
                         f"committed {attempt.get('last_committed_step')}, resumed from {attempt.get('resumed_from')}")
            lines.extend(f"    evidence: {line}" for line in attempt.get("evidence") or [])
        tail = self.log_tail()
        if tail:
            lines.append(f"  last {len(tail)} lines of the job log:")
            lines.extend(f"    | {line}" for line in tail)
        if self.airflow_log is not None:
            lines.append(f"  Airflow's logs: {self.airflow_log}")
        return lines
