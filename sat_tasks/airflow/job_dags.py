"""Generate one DAG per job spec file, keeping each bad file's problems apart from the good ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.spec import SpecError, dag_id_for, load_spec


@dataclass
class JobDagSet:
    """What a jobs directory yields: DAGs by id, and problems by spec file."""

    dags: dict = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    jobs: dict = field(default_factory=dict)  # dag_id -> the validated TrainingJob


def load_job_dags(jobs_dir: str | Path, fileloc: str | None = None, *, build: bool = True) -> JobDagSet:
    """Build a DAG for every `*.yaml`/`*.yml` spec in `jobs_dir`; a bad spec never breaks the others.

    With `build=False` the specs are only validated (no DAG objects): used to report errors.
    """
    result = JobDagSet()
    seen: dict[str, str] = {}
    for path in sorted(Path(jobs_dir).glob("*.y*ml")):
        try:
            job = load_spec(path)
        except SpecError as exc:
            result.errors[str(path)] = str(exc)
            continue
        dag_id = dag_id_for(job)
        if dag_id in seen:
            result.errors[str(path)] = f"{path}: name: job name {job.name!r} is already used by {seen[dag_id]}"
            continue
        seen[dag_id] = str(path)
        result.jobs[dag_id] = job
        if not build:
            continue
        from sat_tasks.airflow.dag_factory import build_job_dag

        result.dags[dag_id] = build_job_dag(
            job, dag_id=dag_id, spec_path=str(path), fileloc=fileloc,
            doc_md=f"Training Job **{job.name}** from `{path.name}`.\n\n```yaml\n{path.read_text()}\n```",
        )
    return result
