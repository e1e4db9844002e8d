"""A spec nested thousands deep is one import error for its file; the other job DAGs still load (issue 29.8)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sat_tasks.spec import SpecError, parse_spec
from sat_tasks.spec.loading import MAX_NESTING, NESTING_RULE, read_yaml_file

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "include" / "jobs"
DEPTH = 10_000


@pytest.mark.parametrize("text", [
    pytest.param("name: deep\nenv: " + "[" * DEPTH + "]" * DEPTH + "\n", id="flow-lists"),
    pytest.param("name: deep\nenv:\n" + "".join("  " * i + "k:\n" for i in range(1, DEPTH)), id="block-mappings"),
])
def test_deep_yaml_is_a_spec_error_naming_the_file_and_rule(tmp_path, text):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        read_yaml_file(path)
    assert str(caught.value) == f"{path}: <file>: {NESTING_RULE}"
    assert f"deeper than {MAX_NESTING} levels" in NESTING_RULE


def test_deep_mapping_from_conf_is_a_spec_error():
    data: dict = {"name": "deep-job"}
    node = data
    for _ in range(DEPTH):
        node["env"] = {}
        node = node["env"]
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="conf")
    assert [str(p) for p in caught.value.problems] == [f"<spec>: {NESTING_RULE}"]


def test_deep_spec_file_is_one_import_error_and_the_other_dags_load(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    for path in JOBS.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "deep.yaml").write_text("name: deep\nenv: " + "[" * DEPTH + "]" * DEPTH + "\n")
    monkeypatch.setenv("AIRFLOW__SAT__JOBS_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert set(bag.dags) == {"sat_training_job"} | {p.stem for p in JOBS.glob("*.yaml")}
    assert list(bag.import_errors) == [str(ROOT / "dags" / "sat_job_spec_errors.py")]
    assert f"{tmp_path / 'deep.yaml'}: <file>: {NESTING_RULE}" in next(iter(bag.import_errors.values()))
