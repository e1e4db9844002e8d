"""The registry login the jobs of these tests name (`sat_registry_main`): a login the deployment shares
(`[sat] shared_registry_connections`) with an Airflow connection for their images' registry, so the
launch path makes the run's image pull Secret from it (ADR 0032)."""

from __future__ import annotations

import json

import pytest

SHARED_LOGIN = {"conn_type": "docker", "host": "registry.example.com", "login": "robot",
                "password": "registry-password-of-the-tests"}


@pytest.fixture(autouse=True)
def shared_registry_login(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS", "sat_registry_main")
    monkeypatch.setenv("AIRFLOW_CONN_SAT_REGISTRY_MAIN", json.dumps(SHARED_LOGIN))
    return SHARED_LOGIN


# The File Storage volume the jobs of these tests name (`storage.file_storage_mount: filestore`; ADR 0040).
FILE_STORAGE_VOLUMES = {"filestore": {"claim": "fs-filestore", "mount_path": "/mnt/filestore"}}


@pytest.fixture(autouse=True)
def file_storage_volumes(monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__FILE_STORAGE_VOLUMES", json.dumps(FILE_STORAGE_VOLUMES))
    return FILE_STORAGE_VOLUMES
