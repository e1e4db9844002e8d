"""The DAG integrity check: the attempt groups and tasks a job's learning type and failover setting imply."""

from __future__ import annotations

import pytest

from sat_tasks.spec import parse_spec
from sat_tasks.testing.checks import dag_problems

BASE = {"image": {"url": "registry.example.com/t/train:1"}, "data": {"source": "s3://team/data/"},
        "results": {"destination": "s3://team/results/"}, "command": "python train.py"}
ON_DEMAND = {**BASE, "name": "on-demand-job", "job_failover": True, "max_failovers": 2}
SPOT = {**BASE, "name": "spot-job", "learning_type": "spot", "spot": {"max_resumes": 2}}
NO_FAILOVER = {**BASE, "name": "plain-job"}


def dag_of(spec: dict):
    from sat_tasks.airflow.dag_factory import build_job_dag

    job = parse_spec(spec)
    return build_job_dag(job, dag_id=job.name)


@pytest.mark.parametrize("spec", [ON_DEMAND, SPOT, NO_FAILOVER], ids=["on-demand", "spot", "no-failover"])
def test_a_jobs_own_dag_is_as_expected(spec):
    assert dag_problems(parse_spec(spec), dag_of(spec)) == []


def test_a_dag_that_does_not_match_the_job_is_described():
    spot_dag = dag_of(SPOT)  # 3 attempts, Spot waits
    problems = dag_problems(parse_spec({**ON_DEMAND, "max_failovers": 3}), spot_dag)
    assert "attempt groups ['attempt_1', 'attempt_2', 'attempt_3'], expected ['attempt_1', 'attempt_2', " \
           "'attempt_3', 'attempt_4'] (1 + max_failovers)" in problems
    assert "attempt_2.wait_for_capacity is present" in problems and "attempt_4.classify is missing" in problems
    assert "attempt_4 has no launch task" in problems
    assert dag_problems(parse_spec(NO_FAILOVER), dag_of(ON_DEMAND))[0].startswith("attempt groups ['attempt_1', ")
