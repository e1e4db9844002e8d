"""The spec's rules live in the model: the JSON Schema carries them, `sat schema` prints it, editors validate with it."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

from sat_tasks.cli import main as sat_main
from sat_tasks.spec import SpecError, TrainingJob, job_schema, parse_spec
from tests.sat_tasks.spec.test_spec import BASE, with_change
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def schema() -> dict:
    return job_schema()


def test_sat_schema_prints_the_models_schema(capsys):
    assert sat_main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == job_schema()
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(printed)


def test_the_schema_carries_the_field_constraints(schema):
    props, defs = schema["properties"], schema["$defs"]
    assert (props["name"]["minLength"], props["name"]["maxLength"]) == (3, 63) and "pattern" in props["name"]
    assert (props["nodes"]["minimum"], props["nodes"]["maximum"]) == (1, 64)
    assert (props["command"]["minLength"], props["command"]["maxLength"]) == (3, 1024)
    assert props["tags"]["maxProperties"] == 50 and "pattern" in props["tags"]["propertyNames"]
    assert defs["Resources"]["properties"]["server_type"]["enum"] == ["cpu", "g2", "g3"]
    assert defs["Resources"]["properties"]["gpus_per_node"]["maximum"] == 8
    assert "pattern" in defs["Resources"]["properties"]["memory"]
    assert defs["SpotPolicy"]["properties"]["max_resumes"]["maximum"] == 5
    assert defs["LearningType"]["enum"] == ["on-demand", "spot"]
    # Each constrained field says its rule in words (what a form shows, what an error says).
    assert props["name"]["x-rule"].startswith("must be 3-63 chars")


@pytest.mark.parametrize("path", sorted((REPO / "include" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_an_editor_validating_with_the_schema_accepts_the_shipped_specs(schema, path):
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


@pytest.mark.parametrize(("path", "value"), [
    pytest.param("name", "ab", id="name-too-short"),
    pytest.param("name", "Upper-case", id="name-pattern"),
    pytest.param("name", "a..b", id="name-double-dot"),
    pytest.param("nodes", 0, id="nodes-zero"),
    pytest.param("nodes", 65, id="nodes-65"),
    pytest.param("command", "x" * 1025, id="command-too-long"),
    pytest.param("resources.gpus_per_node", 9, id="gpus-9"),
    pytest.param("resources.memory", "lots", id="memory-not-a-quantity"),
    pytest.param("resources.server_type", "g9", id="server-type"),
    pytest.param("data.source", "http://x/y", id="data-not-s3"),
    pytest.param("learning_type", "reserved", id="learning-type"),
    pytest.param("tags", {f"k{i}": "v" for i in range(51)}, id="51-tags"),
    pytest.param("tags", {"bad key": "v"}, id="tag-key"),
    pytest.param("surprise", 1, id="unknown-field"),
])
def test_schema_and_model_refuse_the_same_field_values(schema, path, value):
    spec = with_change(path, value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, schema)
    with pytest.raises(SpecError):
        parse_spec(spec)


def test_the_base_spec_passes_both(schema):
    jsonschema.validate(copy.deepcopy(BASE), schema)
    assert isinstance(parse_spec(BASE), TrainingJob)


@pytest.mark.parametrize("quantity", ["500m", "1.5", "2Gi", "512M", "8Gi", "0.5Gi", "1e3"])
def test_kubernetes_quantities_are_accepted(quantity):
    job = parse_spec(with_change("resources.cpu", quantity))
    assert job.resources.cpu == quantity
    parse_spec(with_change("resources.memory", quantity))


@pytest.mark.parametrize("quantity", ["lots", "2GB", "1.5.5", "-1", "0", "", "1 Gi"])
def test_nonsense_quantities_are_refused_with_the_field_and_the_rule(quantity):
    with pytest.raises(SpecError) as info:
        parse_spec(with_change("resources.cpu", quantity))
    (problem,) = info.value.problems
    assert problem.field == "resources.cpu" and "Kubernetes quantity" in problem.rule


def test_quantities_do_not_import_the_kubernetes_client():
    import subprocess
    import sys

    code = ("import sys; from sat_tasks.spec.quantities import parse_quantity; "
            "assert parse_quantity('500m') * 2 == 1; print('kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
