"""Every rule of the Training Job spec, valid and invalid, and the `sat validate` command."""

from __future__ import annotations

import copy

import pytest
import yaml

from sat_tasks.cli import main as sat_main
from sat_tasks.spec import SpecError, TrainingJob, load_spec, parse_spec
from tests.support.paths import REPO

ROOT = REPO

BASE = {
    "name": "good-job.v1",
    "learning_type": "on-demand",
    "framework": "pytorch",
    "job_failover": True,
    "nodes": 1,
    "resources": {"gpus_per_node": 8, "memory": "512Gi", "shared_memory": "64Gi", "server_type": "g2"},
    "image": {"url": "registry.example.com/team/train:1.0", "registry_conn_id": "sat_registry_team"},
    "storage": {"script_url": "s3://code-bucket/train.py"},
    "data": {"source": "s3://data-bucket/corpus/"},
    "results": {"destination": "s3://results-bucket/out/"},
    "command": "python train.py",
    "tags": {"team": "ml"},
}


def with_change(path: str, value):
    spec = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return spec


DELETE = object()


def problems(spec) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec, source="job.yaml")
    return {p.field: p.rule for p in info.value.problems}


def test_base_spec_is_valid():
    job = parse_spec(BASE)
    assert job.name == "good-job.v1"
    assert job.max_attempts() == 4  # first attempt + 3 failovers


@pytest.mark.parametrize(
    "path,value",
    [
        pytest.param("name", "abc", id="name-3-chars"),
        pytest.param("name", "a" * 63, id="name-63-chars"),
        pytest.param("name", "a.b-c9", id="name-dots-dashes"),
        pytest.param("learning_type", "spot", id="spot-without-failover"),
        pytest.param("framework", "deepspeed", id="deepspeed"),
        pytest.param("nodes", 2, id="two-nodes"),
        pytest.param("command", "abc", id="command-3-chars"),
        pytest.param("command", "x" * 1024, id="command-1024-chars"),
        pytest.param("tags", {f"k{i}": "v" for i in range(50)}, id="50-tags"),
        pytest.param("schedule", "0 3 * * *", id="cron"),
        pytest.param("schedule", "@daily", id="preset"),
        pytest.param("schedule", "asset:s3://data-bucket/corpus/", id="asset"),
        pytest.param("storage.file_storage_mount", None, id="no-file-storage"),
        pytest.param("resources.server_type", "g3", id="g3"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "600"}, id="grace-600"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "45.5"}, id="grace-fraction"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "3600"}, id="grace-an-hour"),
    ],
)
def test_valid_variants(path, value):
    spec = with_change(path, value)
    if path == "learning_type":
        spec["job_failover"] = False
    assert isinstance(parse_spec(spec), TrainingJob)


@pytest.mark.parametrize(
    "path,value,field,rule_part",
    [
        pytest.param("name", "ab", "name", "3-63 chars", id="name-too-short"),
        pytest.param("name", "a" * 64, "name", "3-63 chars", id="name-too-long"),
        pytest.param("name", "Upper", "name", "lowercase", id="name-uppercase"),
        pytest.param("name", "-abc", "name", "starting and ending", id="name-leading-dash"),
        pytest.param("name", "abc.", "name", "starting and ending", id="name-trailing-dot"),
        pytest.param("name", "a_b_c", "name", "lowercase", id="name-underscore"),
        pytest.param("learning_type", "reserved", "learning_type", "on-demand", id="learning-type-enum"),
        pytest.param("framework", "jax", "framework", "pytorch", id="framework-enum"),
        pytest.param("nodes", 0, "nodes", "between 1", id="nodes-zero"),
        pytest.param("command", "ab", "command", "3-1024", id="command-too-short"),
        pytest.param("command", "x" * 1025, "command", "3-1024", id="command-too-long"),
        pytest.param("tags", {f"k{i}": "v" for i in range(51)}, "tags", "at most 50", id="51-tags"),
        pytest.param("tags", {"bad key": "v"}, "tags", "key", id="tag-key-chars"),
        pytest.param("data.source", "http://bucket/x", "data.source", "s3://", id="data-not-s3"),
        pytest.param("data.source", "s3://Bucket/x", "data.source", "s3://", id="data-bucket-uppercase"),
        pytest.param("data.source", "s3://bucket/../x", "data.source", "'..'", id="data-dotdot"),
        pytest.param("results.destination", "/local/path", "results.destination", "s3://", id="results-not-s3"),
        pytest.param("storage.script_url", "ftp://x/y.py", "storage.script_url", "s3://", id="script-not-s3"),
        pytest.param("storage.file_storage_mount", "/mnt/fs", "storage.file_storage_mount", "no longer accepted",
                     id="mount-path-refused"),
        pytest.param("storage.file_storage_mount", "relative/dir", "storage.file_storage_mount", "File Storage volume",
                     id="mount-not-a-name"),
        pytest.param("image.url", "has space:1", "image.url", "without spaces", id="image-space"),
        pytest.param("image.registry_conn_id", "bad id!", "image.registry_conn_id", "connection id",
                     id="conn-id-chars"),
        pytest.param("resources.memory", "lots", "resources.memory", "quantity", id="memory-quantity"),
        pytest.param("resources.shared_memory", "1 GB", "resources.shared_memory", "quantity", id="shm-quantity"),
        pytest.param("resources.server_type", "g9", "resources.server_type", "one of", id="server-type"),
        pytest.param("resources.gpus_per_node", 9, "resources.gpus_per_node", "between 0 and 8", id="gpus-9"),
        pytest.param("schedule", "every day", "schedule", "cron", id="schedule-bad"),
        pytest.param("data.source", DELETE, "data.source", "required", id="data-missing"),
        pytest.param("surprise", 1, "surprise", "unknown field", id="unknown-field"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "soon"}, "env", "CKPT_GRACE_SECONDS='soon'", id="grace-text"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "0"}, "env", "> 0 and <= 3600", id="grace-zero"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "-30"}, "env", "> 0 and <= 3600", id="grace-negative"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "3601"}, "env", "> 0 and <= 3600", id="grace-over-an-hour"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "nan"}, "env", "> 0 and <= 3600", id="grace-nan"),
        pytest.param("env", {"CKPT_GRACE_SECONDS": "inf"}, "env", "> 0 and <= 3600", id="grace-inf"),
    ],
)
def test_invalid_fields_name_field_and_rule(path, value, field, rule_part):
    found = problems(with_change(path, value))
    assert field in found, found
    assert rule_part in found[field]


def test_failover_refused_with_spot():
    found = problems(with_change("learning_type", "spot"))
    assert found == {"job_failover": "not allowed with learning_type spot (Spot jobs resume instead)"}


def test_all_problems_reported_at_once_including_cross_field():
    spec = with_change("learning_type", "spot")
    spec["name"] = "X"
    spec["command"] = "x"
    spec["data"] = {"source": "nope"}
    found = problems(spec)
    assert set(found) == {"name", "command", "data.source", "job_failover"}


def test_faults_refused_outside_local_backend():
    spec = with_change("backend", "kubernetes")
    spec["faults"] = [{"kind": "hardware", "at_step": 3}]
    assert "faults" in problems(spec)


def test_fault_needs_exactly_one_trigger():
    spec = with_change("faults", [{"kind": "hang"}])
    assert any(f.startswith("faults") for f in problems(spec))


def test_error_message_format(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change("name", "B")))
    with pytest.raises(SpecError) as info:
        load_spec(bad)
    assert str(info.value).startswith(f"{bad}: name: must be 3-63 chars")


def test_yaml_syntax_error_is_clear(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError) as info:
        load_spec(bad)
    assert "is not valid YAML at line" in str(info.value)


@pytest.mark.parametrize("path", sorted((ROOT / "include" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_are_valid(path):
    job = load_spec(path)
    assert job.backend in (None,) or job.backend.value == "local"


def test_sat_validate_exit_codes_and_lines(tmp_path, capsys):
    good = ROOT / "include" / "jobs" / "tiny-llama-demo.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change("name", "B") | {"command": "x"}))
    assert sat_main(["validate", str(good)]) == 0
    capsys.readouterr()
    assert sat_main(["validate", "-q", str(good), str(bad)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [
        f"{bad}: name: must be 3-63 chars of lowercase letters, digits, '-' or '.', starting and ending with a letter or digit",
        f"{bad}: command: must be 3-1024 chars",
    ]
