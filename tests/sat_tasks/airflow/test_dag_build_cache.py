"""Building a job DAG reuses what `@task` works out from each task body (issue 31.2): the DAG is the same.

`dag_factory._task` decorates the first body of each code as written (Airflow reads its signature)
and hands the next bodies that signature: a DAG built from the cached signatures serializes exactly
as one built by plain inspection, for a job DAG (Spot: the capacity sensors too) and the generic DAG.
Every `@task` pushes its return value as one XCom (`multiple_outputs=False`), `-> dict` or not.
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
    monkeypatch.setattr(dag_factory, "_BODY_SIGNATURES", {})
    inferred = _serialized(job, dag_id)  # every body decorated as written
    signatures = dict(dag_factory._BODY_SIGNATURES)
    assert signatures, "the first build records the signatures Airflow read"
    assert _serialized(job, dag_id) == inferred  # every body from the recorded signatures
    assert dag_factory._BODY_SIGNATURES == signatures
    # one XCom per task: a `-> dict` body (validate_spec, classify, decide) does not push its keys too
    dag = dag_factory.build_job_dag(job, dag_id=dag_id)
    decorated = [t for t in dag.tasks if hasattr(t, "multiple_outputs")]
    assert {"validate_spec", "attempt_1.classify", "attempt_1.decide", "cleanup_run"} <= {t.task_id for t in decorated}
    assert not [t.task_id for t in decorated if t.multiple_outputs]
