"""Building a job DAG reuses what `@task` works out from each task body (issue 31.2): the DAG is the same.

`dag_factory._task` decorates the first body of each code as written (Airflow infers its signature
and `multiple_outputs`) and hands the next bodies those facts: a DAG built from the facts serializes
exactly as one built by plain inference, for a job DAG (Spot: the capacity sensors too) and the
generic DAG.
"""

from __future__ import annotations

import json

import pytest
from airflow.serialization.serialized_objects import DagSerialization

from sat_tasks.airflow import dag_factory
from sat_tasks.spec import load_spec
from tests.conftest import ROOT

SPECS = ["tiny-llama-demo.yaml", "tiny-llama-spot.yaml"]


def _serialized(job, dag_id: str) -> str:
    data = DagSerialization.to_dict(dag_factory.build_job_dag(job, dag_id=dag_id, fileloc="/dags/sat_jobs_00.py"))
    data["dag"].pop("last_loaded", None)
    return json.dumps(data, sort_keys=True, default=str)


@pytest.mark.parametrize("spec", [*SPECS, None], ids=[*SPECS, "generic"])
def test_a_dag_built_from_the_cached_facts_is_the_dag_airflow_infers(spec, monkeypatch):
    job = load_spec(ROOT / "include" / "jobs" / spec) if spec else None
    dag_id = job.name if job else dag_factory.GENERIC_DAG_ID
    monkeypatch.setattr(dag_factory, "_BODY_FACTS", {})
    inferred = _serialized(job, dag_id)  # every body decorated as written
    facts = dict(dag_factory._BODY_FACTS)
    assert facts, "the first build records what Airflow inferred"
    assert _serialized(job, dag_id) == inferred  # every body from the recorded facts
    assert dag_factory._BODY_FACTS == facts
    # the facts are Airflow's: `-> dict` bodies push their keys (multiple_outputs), the others do not
    dag = dag_factory.build_job_dag(job, dag_id=dag_id)
    assert dag.get_task("validate_spec").multiple_outputs is True
    assert dag.get_task("cleanup_run").multiple_outputs is False
