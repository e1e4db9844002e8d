"""Issue 44.1: a job's data source and script come only from the operator's data roots, never SAT's own trees.

The attack: a person refused the demo DAG created a job whose `data.source` was the demo run's
results; Create answered 201 and the job's credentials read the victim's `job.log`. Create's
"holds no objects" check also told whether any prefix held objects. Now `io.data_roots` refuses a
source in a results tree (the run's own job DAG's part aside), in SAT's own trees or the task
logs, and outside `[sat] data_roots` when set, naming the field and the rule; Create asks it
before Object Storage, and `validate_spec` asks it again for the person who triggered the run.
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import pytest

from sat_tasks.io.run_layout import JobRun, scoped
from sat_tasks.spec import parse_spec
from sat_tasks.ui.create import validate_form
from tests.sat_tasks.ui.test_api import (  # noqa: F401 (the module-scoped app and its client)
    DEMO,
    GENERIC,
    _good_form,
    _headers,
    admin,
    app,
    client,
)
from tests.security.test_run_ownership import _Person


def source_refusals(*args, **kwargs):
    from sat_tasks.io.data_roots import source_refusals

    return source_refusals(*args, **kwargs)


JOBS = {"tiny-llama-demo": "s3://sat-demo/results/", "other-job": "s3://team-b/out/"}


def _job(source: str, script: str | None = None, destination: str = "s3://mine/results/", **fields):
    spec = {"name": "reader", "image": {"url": "registry.sat.local/sat/training:0.1.0"}, "command": "python t.py",
            "data": {"source": source}, "results": {"destination": destination}, **fields}
    if script:
        spec["storage"] = {"script_url": script}
    return parse_spec(spec)


@pytest.mark.parametrize(("source", "words"), [
    pytest.param("s3://sat-demo/results/tiny-llama-demo/tiny-llama-demo/run-1/", "lies inside the results tree "
                 "s3://sat-demo/results/", id="another-dags-results"),
    pytest.param("s3://sat-demo/results/tiny-llama-demo/tiny-llama-demo/run-1/job.log", "lies inside the results "
                 "tree s3://sat-demo/results/", id="another-runs-job-log"),
    pytest.param("s3://sat-demo/results", "lies inside the results tree", id="the-results-tree-without-slash"),
    pytest.param("s3://team-b/out/sat_training_job/x/", "lies inside the results tree s3://team-b/out/",
                 id="a-job-dags-destination"),
    pytest.param("s3://mine/results/sat_training_job/", "lies inside the results tree s3://mine/results/",
                 id="its-own-destinations-generic-dag"),
    pytest.param("s3://sat-demo/results/_node-health/", "SAT's own tree _node-health/", id="node-health"),
    pytest.param("s3://anywhere/x/_warm-pool/job/", "SAT's own tree _warm-pool/", id="warm-pool"),
    pytest.param("s3://sat-demo/_revoked-credentials/results/", "SAT's own tree _revoked-credentials/",
                 id="revocations"),
    pytest.param("s3://sat-logs/airflow/logs/dag_id=tiny-llama-demo/", "lies inside Airflow's remote task logs",
                 id="task-logs"),
    pytest.param("s3://sat-logs/airflow", "contains Airflow's remote task logs", id="above-the-task-logs"),
])
def test_a_source_in_a_results_tree_sats_own_trees_or_the_logs_is_refused(monkeypatch, source, words):
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER", "s3://sat-logs/airflow/logs")
    for job in (_job(source), _job("s3://sat-demo/datasets/tiny-corpus/", script=source)):
        refusals = source_refusals(job, GENERIC, jobs=JOBS)
        assert len(refusals) == 1, refusals
        field = "data.source" if job.data.source == source else "storage.script_url"
        assert refusals[0].field == field and words in refusals[0].rule and "ADR 0039" in refusals[0].rule
        assert str(refusals[0]).startswith(f"{field}: {source} ")


def test_a_job_dags_run_reads_its_own_dags_results_and_no_other_dags():
    own = "s3://sat-demo/results/tiny-llama-demo/tiny-llama-demo/run-1/output/"
    assert source_refusals(_job(own), "tiny-llama-demo", jobs=JOBS) == []
    assert source_refusals(_job(own), "other-job", jobs=JOBS)  # another job DAG
    assert source_refusals(_job(own), GENERIC, jobs=JOBS)  # the generic DAG is every creator's: no own part
    assert source_refusals(_job(own), None, jobs=JOBS)  # Create: before any run
    ledger = "s3://sat-demo/results/_node-health/"
    assert source_refusals(_job(ledger), "tiny-llama-demo", jobs=JOBS)


def test_the_data_roots_allow_only_their_prefixes_and_a_workspace_may_have_its_own(monkeypatch):
    ordinary = _job("s3://sat-demo/datasets/tiny-corpus/", script="s3://sat-demo/scripts/seed_train.py")
    assert source_refusals(ordinary, None, jobs=JOBS) == []  # no roots declared: any prefix outside the fences
    monkeypatch.setenv("AIRFLOW__SAT__DATA_ROOTS", "s3://sat-demo/datasets/, s3://sat-demo/scripts/")
    assert source_refusals(ordinary, None, jobs=JOBS) == []
    outside = source_refusals(_job("s3://team-b/raw/", script="s3://sat-demo/datasetsX/t.py"), None, jobs=JOBS)
    assert [r.field for r in outside] == ["data.source", "storage.script_url"]
    assert all("outside the deployment's data roots s3://sat-demo/datasets/, s3://sat-demo/scripts/" in r.rule
               and "[sat] data_roots" in r.rule for r in outside)
    monkeypatch.setenv("AIRFLOW__SAT__DATA_ROOTS_TEAM_B", "s3://team-b/raw/")
    team_b = _job("s3://team-b/raw/part/", workspace="team-b")
    assert source_refusals(team_b, None, jobs=JOBS) == []
    assert source_refusals(_job("s3://team-b/raw/part/"), None, jobs=JOBS)  # not in the workspace: global roots
    monkeypatch.setenv("AIRFLOW__SAT__DATA_ROOTS", "s3://sat-demo/")  # a root over a results tree: the fence wins
    assert source_refusals(_job("s3://sat-demo/results/tiny-llama-demo/"), None, jobs=JOBS)


def test_create_refuses_before_it_asks_object_storage():
    """No existence oracle: a refused source is never looked up; an allowed one is."""
    asked: list[str] = []

    def exists(uri: str) -> bool:
        asked.append(uri)
        return False

    victim = "s3://sat-demo/results/tiny-llama-demo/tiny-llama-demo/run-1/"
    result = validate_form(_good_form("thief", **{"data.source": victim}), exists=exists)
    assert result.job is None and asked == []
    assert any("lies inside the results tree s3://sat-demo/results/" in rule for rule in result.errors["data.source"])
    result = validate_form(_good_form("reader"), exists=exists)
    assert asked == ["s3://sat-demo/datasets/tiny-corpus/", "s3://sat-demo/scripts/seed_train.py"]


def test_the_create_route_refuses_another_dags_results_and_starts_nothing(client, admin):
    outsider = _headers("outsider", "user")  # the auth manager denies them the demo DAG
    victim = f"s3://sat-demo/results/{DEMO}/{DEMO}/manual__x/"
    for data in ({"data.source": victim}, {"storage.script_url": victim + "job.log"},
                 {"data.source": "s3://sat-demo/results/_node-health/"}):
        response = client.post("/sat/api/jobs", headers=outsider, json={"form": _good_form("thief", **data)})
        assert response.status_code == 422, response.text
        field = next(iter(data))
        assert [e["field"] for e in response.json()["errors"]] == [field]
        assert "ADR 0039" in response.json()["errors"][0]["rule"]
    missing = client.post("/sat/api/jobs", headers=outsider, json={"form": _good_form(
        "thief", **{"data.source": victim + "no-such/"})}).json()
    assert "holds no objects" not in str(missing)  # the same answer whether or not the victim's prefix exists


def test_validate_spec_refuses_the_source_for_the_person_who_triggered_the_run(s3_hook, demo_bucket):
    from sat_tasks.errors import JobStopped
    from sat_tasks.pipeline.steps import check_person

    job = scoped(_job(f"s3://sat-demo/results/{DEMO}/{DEMO}/manual__x/", destination="s3://sat-demo/results/"),
                 GENERIC)
    run = JobRun(job, "manual__crafted-conf-source")
    with pytest.raises(JobStopped, match="refused for the person who triggered the run"):
        check_person(run.job, run, _Person("outsider"), log=lambda _m: None)
    last = run.history(lambda _m: None).entries()[-1]
    assert last["status"] == "Failed" and "data.source: s3://sat-demo/results/" in last["reason"]
    assert "lies inside the results tree s3://sat-demo/results/" in last["reason"]
    fine = JobRun(scoped(_job("s3://sat-demo/datasets/tiny-corpus/"), GENERIC), "manual__fine-source")
    check_person(fine.job, fine, _Person("outsider"), log=lambda _m: None)
    assert fine.history(lambda _m: None).entries() == []


def test_validate_spec_refuses_a_secret_env_for_the_person_who_triggered_the_run(s3_hook, demo_bucket):
    """A REST API trigger skips Create: validate_spec refuses the secret again (ADR 0043), naming no value."""
    from sat_tasks.errors import JobStopped
    from sat_tasks.pipeline.steps import check_person

    token = "hf_" + "A1b2C3d4" * 4
    job = scoped(_job("s3://sat-demo/datasets/tiny-corpus/", destination="s3://sat-demo/results/", env={"HUB": token}),
                 GENERIC)
    run = JobRun(job, "manual__crafted-conf-env")
    with pytest.raises(JobStopped, match="refused for the person who triggered the run") as refused:
        check_person(run.job, run, _Person("outsider"), log=lambda _m: None)
    last = run.history(lambda _m: None).entries()[-1]
    assert last["status"] == "Failed" and "env.HUB: the value looks like a Hugging Face token" in last["reason"]
    assert token not in last["reason"] and token not in str(refused.value)
