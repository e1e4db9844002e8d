"""Spec files take no YAML anchors or aliases (a billion-laughs chain stays one fast error), and no duplicate keys
(issue 44, findings 6 and 7)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from sat_tasks.spec import SpecError
from sat_tasks.spec.loading import ALIAS_RULE, read_yaml_file

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "include" / "jobs"


def laughs(levels: int = 40) -> str:
    """A billion-laughs chain: each level a list of ten aliases of the one before (10**levels leaves once expanded)."""
    lines = ["name: laughs", "env:", "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_chain_is_one_spec_error_within_a_second(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs())
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        read_yaml_file(path)
    assert time.monotonic() - started < 1.0
    assert str(caught.value) == f"{path}: <file>: {ALIAS_RULE} (line 3)"


@pytest.mark.parametrize("text", [
    pytest.param("name: a\nenv: &e {A: '1'}\n", id="anchor-only"),
    pytest.param("name: a\nenv: &e {A: '1'}\ntags: *e\n", id="anchor-and-alias"),
])
def test_any_anchor_or_alias_is_refused(tmp_path, text):
    path = tmp_path / "a.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="anchor or alias"):
        read_yaml_file(path)


@pytest.mark.parametrize("text,field", [
    pytest.param("name: a\nname: b\n", "name", id="top-level"),
    pytest.param("name: a\nresources:\n  nodes: 1\n  nodes: 2\n", "resources.nodes", id="nested"),
    pytest.param("name: a\nenv: {A: '1', A: '2'}\n", "env.A", id="flow"),
    pytest.param("name: a\nnotifications:\n- webhook: x\n  webhook: y\n", "notifications.0.webhook", id="in-a-list"),
])
def test_duplicate_keys_are_refused_naming_the_field(tmp_path, text, field):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        read_yaml_file(path)
    assert [p.field for p in caught.value.problems] == [field]
    assert "given twice" in caught.value.problems[0].rule


def test_same_key_in_sibling_mappings_is_fine(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: a\nnotifications:\n- webhook: x\n- webhook: y\nenv: {webhook: z}\n")
    assert read_yaml_file(path)["notifications"] == [{"webhook": "x"}, {"webhook": "y"}]


def test_alias_chain_is_one_import_error_and_the_other_dags_load(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    for path in JOBS.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "laughs.yaml").write_text(laughs())
    monkeypatch.setenv("AIRFLOW__SAT__JOBS_DIR", str(tmp_path))
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert set(bag.dags) == {"sat_training_job"} | {p.stem for p in JOBS.glob("*.yaml")}
    assert list(bag.import_errors) == [str(ROOT / "dags" / "sat_job_spec_errors.py")]
    assert f"{tmp_path / 'laughs.yaml'}: <file>: {ALIAS_RULE}" in next(iter(bag.import_errors.values()))


def test_the_view_answers_while_a_spec_is_parsed(tmp_path):
    """The view's spec cache parses outside its lock: a slow parse of one request holds up no other request."""
    from sat_tasks.spec.loading import load_spec
    from sat_tasks.ui.run_index import SpecCache

    for path in JOBS.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "laughs.yaml").write_text(laughs())
    started, release = threading.Event(), threading.Event()

    def slow_load(path: Path):
        if path.name == "laughs.yaml" and not started.is_set():
            started.set()
            release.wait(60)
        return load_spec(path)

    cache = SpecCache(slow_load)
    first = threading.Thread(target=cache.jobs, args=(tmp_path,))
    first.start()
    try:
        assert started.wait(60)
        answered: list = []
        second = threading.Thread(target=lambda: answered.append(cache.jobs(tmp_path)))
        second.start()
        second.join(30)
        assert answered and set(answered[0]) == {p.stem for p in JOBS.glob("*.yaml")}
    finally:
        release.set()
        first.join(60)
