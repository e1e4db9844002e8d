"""Every `[sat]` setting is declared once (`sat_tasks.settings`): reads, start-up checks and generated files agree."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from sat_tasks import config, settings
from tests.support.paths import REPO

SAT = [sys.executable, "-m", "sat_tasks.cli"]
SPEC = REPO / "include" / "jobs" / "tiny-llama-demo.yaml"


def test_the_generated_files_agree_with_the_table():
    """airflow.cfg's [sat] section and docs/configuration.md: `python -m sat_tasks.settings --write` made them."""
    for path, text in settings.generated_files(REPO).items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: python -m sat_tasks.settings --write"
    reference = (REPO / "docs" / "configuration.md").read_text()
    for setting in settings.SETTINGS:
        assert f"| `{setting.name}` |" in reference


def test_the_check_of_the_generated_files_sees_a_hand_edit(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "airflow.cfg").write_text("[core]\nx = 1\n\n[sat]\nbackend = local\n# an edit by hand\n")
    wanted = settings.generated_files(tmp_path)
    assert wanted[tmp_path / "airflow.cfg"].startswith("[core]\nx = 1\n\n[sat]\n# Generated from")
    assert "an edit by hand" not in wanted[tmp_path / "airflow.cfg"]


_LITERAL_READ = re.compile(r"""sat_setting\(\s*["']([a-z0-9_]+)["']""")
_CONSTANT = re.compile(r"""^(?:[A-Z_]*SETTING[A-Z_]*|DATA_ROOTS)\s*=\s*["']([a-z0-9_]+)["']""", re.MULTILINE)


def test_every_setting_the_code_reads_is_declared():
    """Each literal key passed to sat_setting, and each *SETTING* constant, is in the table."""
    read = set()
    for path in (REPO / "sat_tasks").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        read |= set(_LITERAL_READ.findall(text)) | set(_CONSTANT.findall(text))
    assert read, "the scan found no read: its pattern is wrong"
    assert sorted(k for k in read if settings.declared(k) is None) == []


def test_the_kubernetes_settings_are_declared_with_their_defaults():
    from sat_tasks.backends.kubernetes.settings import KubernetesSettings

    declared = {s.name[len("k8s_"):]: s.default for s in settings.SETTINGS if s.name.startswith("k8s_")}
    wanted = {f.name: ("" if f.default in (None, MISSING) else str(f.default).lower() if isinstance(f.default, bool)
                       else str(f.default)) for f in fields(KubernetesSettings)}
    assert declared == wanted


def test_a_read_of_an_undeclared_key_is_an_error():
    with pytest.raises(KeyError, match="not declared"):
        config.sat_setting("no_such_setting_anywhere")


def test_a_family_member_is_declared_and_defaults_to_the_callers_value(monkeypatch):
    assert settings.declared("data_roots_team_a").name == "data_roots_<workspace>"
    assert settings.declared("data_roots_") is None  # the prefix alone names no workspace
    assert config.sat_setting("data_roots_team_a", "") == ""
    monkeypatch.setenv("AIRFLOW__SAT__DATA_ROOTS_TEAM_A", "s3://team-a/")
    assert config.sat_setting("data_roots_team_a", "") == "s3://team-a/"


@pytest.mark.parametrize(("key", "value", "line"), [
    ("local_runtim", "auto", "[sat] local_runtim (the environment): no such setting; did you mean local_runtime?"),
    ("k8s_kueue", "maybe", "[sat] k8s_kueue = 'maybe' (the environment): must be true or false"),
    ("local_node_slots", "two", "[sat] local_node_slots = 'two' (the environment): must be a whole number"),
    ("backend", "slurm", "[sat] backend = 'slurm' (the environment): must be one of local, kubernetes"),
])
def test_a_bad_key_or_value_names_itself(monkeypatch, key, value, line):
    monkeypatch.setenv(f"AIRFLOW__SAT__{key.upper()}", value)
    assert line in config.settings_problems()


def _sat(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SAT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_sat_validate_and_sat_up_refuse_an_unknown_key_in_the_config_file(tmp_path):
    """Refused before anything starts, with the key, where it is, and the nearest known one."""
    import os

    cfg = tmp_path / "airflow.cfg"
    cfg.write_text("[sat]\nbackend = local\nworkspace_wait_secs = 10\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__SAT__")}
    env.update(AIRFLOW_CONFIG=str(cfg), AIRFLOW_HOME=str(tmp_path), PYTHONPATH=str(REPO))
    for args in (["validate", str(SPEC)], ["up", "--db", "sqlite"]):
        result = _sat(args, env, tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert ("[sat] workspace_wait_secs (the config file): no such setting; did you mean workspace_wait_seconds?"
                in result.stderr)
    cfg.write_text("[sat]\nbackend = local\nworkspace_wait_seconds = 10\n")
    result = _sat(["validate", str(SPEC)], env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_helm_values_set_only_declared_settings_with_valid_values():
    import yaml

    values = yaml.safe_load((REPO / "docker" / "helm-values.yaml").read_text())
    section = {key: str(value) for key, value in values["config"]["sat"].items()}
    assert section and settings.problems(section, {}) == []


def test_a_generators_command_line_names_stale_files_and_writes_them(tmp_path, capsys):
    from sat_tasks.settings import regenerate

    fresh, stale, missing = tmp_path / "fresh.md", tmp_path / "stale.md", tmp_path / "missing.md"
    fresh.write_text("same", encoding="utf-8")
    stale.write_text("old", encoding="utf-8")
    files = {fresh: "same", stale: "new", missing: "made"}
    assert regenerate(files, tmp_path, ["prog"]) == 1 and stale.read_text() == "old" and not missing.exists()
    assert capsys.readouterr().out.split() == ["stale:", "stale.md", "stale:", "missing.md"]
    assert regenerate(files, tmp_path, ["prog", "--write"]) == 0
    assert (stale.read_text(), missing.read_text()) == ("new", "made")
    assert regenerate(files, tmp_path, ["prog"]) == 0
