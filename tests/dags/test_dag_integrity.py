"""DAG integrity: every file imports, every DAG is well-formed, bad specs stay contained."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "include" / "jobs"
HEAVY = ("torch", "transformers", "great_expectations", "kubernetes", "deepspeed", "datasets", "moto")


def load_bag(jobs_dir: Path | None = None, monkeypatch=None):
    from airflow.dag_processing.dagbag import DagBag

    if jobs_dir is not None:
        monkeypatch.setenv("AIRFLOW__SAT__JOBS_DIR", str(jobs_dir))
    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="module")
def bag():
    return load_bag()


def test_every_dag_file_imports(bag):
    assert bag.import_errors == {}
    expected = {"sat_training_job"} | {yaml.safe_load(p.read_text())["name"] for p in JOBS.glob("*.yaml")}
    assert set(bag.dags) == expected


def test_every_dag_has_tags_owner_and_sane_settings(bag):
    for dag_id, dag in bag.dags.items():
        assert dag.tags and "sat" in dag.tags, dag_id
        assert dag.catchup is False, dag_id
        assert dag.start_date.tzinfo is not None, dag_id
        assert dag.doc_md, dag_id
        for task in dag.tasks:
            assert task.owner == "sat", (dag_id, task.task_id)
            assert 0 <= task.retries <= 3, (dag_id, task.task_id)
            assert task.retry_delay <= timedelta(minutes=10)


def test_job_dag_shape(bag):
    dag = bag.dags["tiny-llama-demo"]
    ids = {t.task_id for t in dag.tasks}
    assert {"validate_spec", "check_image", "stage_data", "validate_data", "upload_results", "finalize",
            "cleanup_run"} <= ids
    assert {f"attempt_{k}.{step}" for k in range(1, 5) for step in ("launch", "classify", "decide", "cleanup")} <= ids
    assert "attempt_5.launch" not in ids  # 1 attempt + at most 3 failovers
    assert dag.get_task("check_image").downstream_task_ids == {"stage_data"}
    assert dag.get_task("stage_data").downstream_task_ids == {"validate_data"}
    assert dag.get_task("attempt_1.classify").trigger_rule == "none_skipped"  # runs after a failed launch
    assert dag.get_task("finalize").trigger_rule == "all_done"
    # The next attempt waits for the whole previous group (its decision and its cleanup).
    assert dag.get_task("attempt_2.launch").upstream_task_ids == {"attempt_1.decide", "attempt_1.cleanup"}
    assert dag.get_task("attempt_1.cleanup").trigger_rule == "all_done"
    # The run's volume goes once the outputs are uploaded, whatever happened; finalize decides the run's state.
    assert dag.get_task("cleanup_run").upstream_task_ids == {"upload_results", "validate_spec"}
    assert dag.get_task("cleanup_run").trigger_rule == "all_done"
    assert {t.task_id for t in dag.leaves} == {"finalize", "cleanup_run"}
    spot = bag.dags["tiny-llama-spot"]
    assert "attempt_2.wait_for_capacity" in {t.task_id for t in spot.tasks}
    assert spot.get_task("attempt_2.wait_for_capacity").mode == "reschedule"


def test_each_job_dag_lives_in_the_shard_file_of_its_spec(bag):
    """The stable assignment end to end: the DAG of `x.yaml` is defined by `dags/sat_jobs_<shard_of('x.yaml')>.py`."""
    from sat_tasks.airflow.shards import shard_of

    for path in JOBS.glob("*.yaml"):
        dag = bag.dags[yaml.safe_load(path.read_text())["name"]]
        assert dag.fileloc == str(ROOT / "dags" / f"sat_jobs_{shard_of(path.name):02d}.py")


def test_generic_dag_form(bag):
    dag = bag.dags["sat_training_job"]
    params = dag.params
    sections = {params.get_param(k).schema.get("section") for k in params}
    assert {"Job", "Compute", "Container image", "Data and results", "Advanced"} <= sections
    assert params.get_param("learning_type").schema["enum"] == ["on-demand", "spot"]
    assert params.get_param("framework").schema["enum"] == ["pytorch", "deepspeed"]
    assert params.get_param("server_type").schema["enum"] == ["cpu", "g2", "g3"]
    assert all(params.get_param(k).description for k in params)
    from sat_tasks.airflow.params import spec_from_params
    from sat_tasks.spec import parse_spec

    defaults = {k: params[k] for k in params}
    assert parse_spec(spec_from_params(defaults)).name == "my-training-job"


def test_params_round_trip_a_spec():
    from sat_tasks.airflow.params import params_from_spec, spec_from_params
    from sat_tasks.spec import load_spec, parse_spec

    for path in JOBS.glob("*.yaml"):
        job = load_spec(path)
        assert parse_spec(spec_from_params(params_from_spec(job))) == job


def test_bad_spec_is_one_import_error_and_others_load(tmp_path, monkeypatch):
    for path in JOBS.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"name": "Bad_Name", "command": "x"}))
    bag = load_bag(tmp_path, monkeypatch)
    assert set(bag.dags) == {"sat_training_job", "tiny-llama-demo", "tiny-llama-spot"}
    assert list(bag.import_errors) == [str(ROOT / "dags" / "sat_job_spec_errors.py")]
    message = next(iter(bag.import_errors.values()))
    assert f"{tmp_path / 'broken.yaml'}: name: must be 3-63 chars" in message
    assert f"{tmp_path / 'broken.yaml'}: command: must be 3-1024 chars" in message
    assert f"{tmp_path / 'broken.yaml'}: image: required field is missing" in message


def test_duplicate_job_names_are_reported(tmp_path, monkeypatch):
    shutil.copy(JOBS / "tiny-llama-demo.yaml", tmp_path / "a.yaml")
    shutil.copy(JOBS / "tiny-llama-demo.yaml", tmp_path / "b.yaml")
    bag = load_bag(tmp_path, monkeypatch)
    assert "tiny-llama-demo" in bag.dags
    assert "already used by" in next(iter(bag.import_errors.values()))


def test_parsing_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(ROOT / 'dags')!r})\n"
        f"print(json.dumps({{'dags': len(bag.dags), 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dags"] == 3
    assert result["heavy"] == []


def test_asset_and_cron_schedules(tmp_path, monkeypatch):
    spec = yaml.safe_load((JOBS / "tiny-llama-demo.yaml").read_text())
    (tmp_path / "cron.yaml").write_text(yaml.safe_dump({**spec, "name": "cron-job", "schedule": "0 3 * * *"}))
    (tmp_path / "asset.yaml").write_text(
        yaml.safe_dump({**spec, "name": "asset-job", "schedule": "asset:s3://sat-demo/datasets/tiny-corpus/"})
    )
    bag = load_bag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert bag.dags["cron-job"].timetable.expression == "0 3 * * *"
    assert "s3://sat-demo/datasets/tiny-corpus/" in str(bag.dags["asset-job"].timetable.asset_condition)


def test_kubernetes_backend_dag_uses_the_pod_operator(tmp_path, monkeypatch):
    spec = yaml.safe_load((JOBS / "tiny-llama-demo.yaml").read_text())
    spec.pop("faults")
    multi = {**spec, "name": "k8s-multi", "backend": "kubernetes", "nodes": 2, "framework": "deepspeed",
             "resources": {"server_type": "g2", "gpus_per_node": 8, "memory": "512Gi", "shared_memory": "64Gi"}}
    (tmp_path / "k8s.yaml").write_text(yaml.safe_dump({**spec, "name": "k8s-job", "backend": "kubernetes"}))
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump(multi))
    bag = load_bag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    dag = bag.dags["k8s-job"]
    launch = dag.get_task("attempt_1.launch")
    assert type(launch).__name__ == "SatTrainingPodOperator"
    assert launch.on_finish_action.value == "keep_pod"
    assert dag.get_task("attempt_1.cleanup").trigger_rule == "all_done"
    assert dag.get_task("attempt_1.classify").upstream_task_ids == {"attempt_1.launch", "validate_spec"}
    # The same shape as a local job's DAG: only the launch operator differs (the backend's).
    local = load_bag(JOBS, monkeypatch).dags["tiny-llama-demo"]
    assert {t.task_id for t in dag.tasks} == {t.task_id for t in local.tasks}
    assert type(local.get_task("attempt_1.launch")).__name__ == "LocalLaunchOperator"
    ranks = {t.task_id for t in bag.dags["k8s-multi"].tasks if t.task_id.startswith("attempt_1.launch")}
    assert ranks == {"attempt_1.launch", "attempt_1.launch_rank_1"}
