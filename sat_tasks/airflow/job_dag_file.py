"""What one `dags/sat_jobs_NN.py` file defines: the job DAGs of its shard, built within its parse budget (ADR 0023)."""

from __future__ import annotations

from pathlib import Path

from sat_tasks.airflow.parse_budget import SkipReport, parse_budget, record_pass
from sat_tasks.airflow.shards import shard_of, spec_paths


def shard_dags(fileloc: str, jobs_dir: str | Path, started: float) -> dict:
    """What `dags/sat_jobs_NN.py` defines: the DAGs of shard NN, within the file's parse budget from `started`.

    A shard with no spec returns at once, before the spec model and the DAG factory are imported
    (a small deployment leaves most files empty, and each is parsed in a fresh process).
    """
    shard = int(Path(fileloc).stem.rsplit("_", 1)[-1])
    if not any(shard_of(path.name) == shard for path in spec_paths(jobs_dir)):
        record_pass(jobs_dir, SkipReport(Path(fileloc).name, (), 0, 0.0, 0.0))
        return {}
    from sat_tasks.airflow.job_dags import load_shard_dags

    return load_shard_dags(jobs_dir, shard, fileloc=fileloc, budget=parse_budget(fileloc, started)).dags
