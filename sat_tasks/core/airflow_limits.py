"""Airflow's concurrency limits for a deployment that runs a number of attempts at once (issue 45.5).

Pure arithmetic, shared by the backends that keep slot boards (`backends.base.QueuesOnSlots`,
which count the attempts) and by `sat up` (`service.concurrency`, which hands the limits to the
components).
"""

from __future__ import annotations

from dataclasses import dataclass

# Worker slots beyond the launches: the other tasks of the runs in flight (validate_spec, staging, classify,
# decide, upload, finalize) run beside the launches that hold or wait for a node.
PIPELINE_WORKERS = 4
# Tasks of one DAG run at once (Airflow 3 counts max_active_tasks per run): a launch beside a growth watch, the
# ranks of a multi-node launch on Kubernetes, the cleanups of an attempt.
TASKS_PER_RUN = 16


@dataclass(frozen=True)
class AirflowConcurrency:
    """Airflow's limits for a pool that runs `attempts` attempts at once.

    `max_active_runs_per_dag`: one run training per slot and one staged behind it, waiting in
    line on the board (past that, runs wait in Airflow's queue: "queued behind N runs").
    `parallelism` (worker slots of the LocalExecutor): a launch for each of those runs, whether it
    holds a slot or waits for one, and `PIPELINE_WORKERS` more for the runs' other tasks.
    """

    attempts: int
    parallelism: int
    max_active_runs_per_dag: int
    max_active_tasks_per_dag: int

    def settings(self) -> dict[str, int]:
        """`[core]` key -> value."""
        return {"parallelism": self.parallelism, "max_active_runs_per_dag": self.max_active_runs_per_dag,
                "max_active_tasks_per_dag": self.max_active_tasks_per_dag}


def airflow_limits(attempts: int) -> AirflowConcurrency:
    """The limits for `attempts` attempts at once (at least one)."""
    attempts = max(1, attempts)
    return AirflowConcurrency(attempts=attempts, parallelism=2 * attempts + PIPELINE_WORKERS,
                              max_active_runs_per_dag=2 * attempts, max_active_tasks_per_dag=TASKS_PER_RUN)
