"""The one [sat] reader: the environment, then the config file, then the defaults; no Airflow import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sat_tasks import config
from tests.support.paths import REPO


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    path = tmp_path / "airflow.cfg"
    path.write_text("[core]\nexecutor = LocalExecutor\n\n[sat]\nbackend = kubernetes\n"
                    "work_dir = ${SAT_TEST_ROOT}/work\nk8s_master_port = 29600\n")
    monkeypatch.setenv("AIRFLOW_CONFIG", str(path))
    monkeypatch.setenv("SAT_TEST_ROOT", "/data")
    for key in ("BACKEND", "WORK_DIR", "K8S_MASTER_PORT", "LOCAL_NODES"):
        monkeypatch.delenv(f"AIRFLOW__SAT__{key}", raising=False)
    return path


def test_the_file_then_the_defaults(cfg):
    assert config.sat_setting("backend") == "kubernetes"
    assert config.sat_setting("work_dir") == "/data/work"  # ${VAR} expanded as Airflow expands it
    assert config.sat_setting("local_nodes") == config.SAT_DEFAULTS["local_nodes"]
    assert config.sat_setting("k8s_master_port") == "29600"
    assert config.sat_setting("k8s_gpu_resource") == "nvidia.com/gpu"  # the declared default (sat_tasks.settings)


def test_the_environment_wins(cfg, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "local")
    assert config.sat_setting("backend") == "local"


def test_an_unknown_setting_without_a_default_is_a_programming_error(cfg):
    with pytest.raises(KeyError, match="no_such_setting"):
        config.sat_setting("no_such_setting")


def test_the_file_is_read_again_when_it_changes(cfg):
    assert config.sat_setting("backend") == "kubernetes"
    cfg.write_text("[sat]\nbackend = local\n")
    import os

    os.utime(cfg, (cfg.stat().st_atime + 5, cfg.stat().st_mtime + 5))
    assert config.sat_setting("backend") == "local"


def test_kubernetes_settings_come_from_the_same_reader(cfg):
    from sat_tasks.backends.kubernetes.settings import KubernetesSettings, SettingError

    assert KubernetesSettings.from_sat_config().master_port == 29600
    cfg.write_text("[sat]\nk8s_master_port = lots\n")
    import os

    os.utime(cfg, (cfg.stat().st_atime + 10, cfg.stat().st_mtime + 10))
    with pytest.raises(SettingError, match=r"\[sat\] k8s_master_port = 'lots': must be a whole number"):
        KubernetesSettings.from_sat_config()


def test_reading_a_setting_imports_no_airflow():
    code = "import sys; from sat_tasks.config import sat_setting; sat_setting('backend'); print('airflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
