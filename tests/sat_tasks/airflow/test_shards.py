"""Job DAG shards: a stable file per spec, every spec in exactly one file, the name hint, the sixteen DAG files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sat_tasks.airflow.shards import JOB_DAG_FILES, job_dag_files, name_hint, shard_of

ROOT = Path(__file__).resolve().parents[3]
NAMES = [f"team-{i % 7}-job-{i:04d}.yaml" for i in range(2000)]


def test_a_spec_keeps_its_shard_from_release_to_release():
    """Pinned values: a change of hash would move every job DAG to another file."""
    assert [shard_of(n) for n in ("tiny-llama-demo.yaml", "tiny-llama-spot.yaml", "a.yaml", "b.yaml")] == [10, 5, 13, 9]
    assert shard_of("x", 1000) == 32


def test_every_spec_is_in_exactly_one_shard_and_the_shards_are_even():
    shards = [{n for n in NAMES if shard_of(n) == k} for k in range(JOB_DAG_FILES)]
    assert sum(len(s) for s in shards) == len(NAMES) and set().union(*shards) == set(NAMES)
    assert min(len(s) for s in shards) > len(NAMES) / JOB_DAG_FILES / 2


@pytest.mark.parametrize("shards", [pytest.param(n, id=f"{n}-to-{n + 1}") for n in (1, 4, 16, 31)])
def test_one_more_shard_moves_specs_only_into_the_new_one(shards):
    moved = [n for n in NAMES if shard_of(n, shards + 1) != shard_of(n, shards)]
    assert all(shard_of(n, shards + 1) == shards for n in moved)
    assert len(moved) < 2 * len(NAMES) / (shards + 1)


def test_no_shard_count_below_one():
    with pytest.raises(ValueError, match="shards: must be at least 1"):
        shard_of("a.yaml", 0)


@pytest.mark.parametrize(("text", "hint"), [
    pytest.param("name: my-job\nnodes: 1\n", "my-job", id="plain"),
    pytest.param('nodes: 1\nname: "my.job"  # a comment\n', "my.job", id="double-quoted"),
    pytest.param("name: 'j01'\n", "j01", id="single-quoted"),
    pytest.param("nodes: 1\n", None, id="no-name"),
    pytest.param("name: a-job\nname: b-job\n", None, id="two-name-lines"),
    pytest.param("name: >-\n  folded-name\n", None, id="block-scalar"),
    pytest.param("name: &anchor my-job\n", None, id="anchor"),
    pytest.param("image:\n  name: inner\n", None, id="nested-key-only"),
    pytest.param("name: Upper_Case\n", None, id="not-a-job-name"),
])
def test_name_hint(text, hint):
    assert name_hint(text) == hint


def test_the_dags_folder_has_the_sixteen_job_dag_files_alike():
    files = {p.name for p in (ROOT / "dags").glob("sat_jobs*.py")}
    assert files == job_dag_files() and len(files) == JOB_DAG_FILES
    texts = {re.sub(r"shard \d\d", "shard NN", (ROOT / "dags" / f).read_text()) for f in files}
    assert len(texts) == 1
