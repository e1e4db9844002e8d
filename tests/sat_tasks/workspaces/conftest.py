"""Shared test data: a workspace mapping and a job spec that names it."""

from __future__ import annotations

import copy

import pytest

WORKSPACE = {
    "name": "team-a",
    "resources": {"server_type": "g2", "gpus_per_node": 8, "memory": "1600Gi", "cpu": "100"},
    "nodes": 3,
    "contract": {"start": "2026-01-01", "end": "2099-12-31"},  # tests that read the real clock stay in it
}


def job_spec(**overrides) -> dict:
    spec = {
        "name": "ws-job",
        "nodes": 2,
        "workspace": "team-a",
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "512Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/team/train:1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": "python train.py",
    }
    spec.update(overrides)
    return spec


@pytest.fixture
def workspace_data() -> dict:
    return copy.deepcopy(WORKSPACE)


@pytest.fixture
def sat_dirs(tmp_path, monkeypatch):
    """A private workspaces folder and work dir (the slot boards live there)."""
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    return tmp_path
