"""The "Create Training Job" form: Params generated from the Training Job's JSON Schema, not copied by hand."""

from __future__ import annotations

import pytest
from airflow.sdk.definitions.param import Param, ParamsDict

from sat_tasks.airflow.params import (
    FORM_FIELDS,
    field_schema,
    generic_params,
    params_from_spec,
    spec_from_params,
)
from sat_tasks.spec import job_schema, load_spec, parse_spec
from tests.support.paths import REPO

CONSTRAINTS = ("type", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "enum",
               "maxProperties", "propertyNames")


@pytest.mark.parametrize("form", FORM_FIELDS, ids=lambda f: f.dag.param)
def test_each_form_field_carries_the_models_constraints(form):
    param = generic_params()[form.dag.param]
    prop = field_schema(form.path, job_schema())
    for keyword in CONSTRAINTS:
        assert param.schema.get(keyword) == prop.get(keyword), keyword
    assert param.schema["section"] == form.dag.section and param.description
    assert param.schema["title"] == form.label  # the label the Create page shows (one table: spec.form_fields)


def test_an_optional_field_takes_null_or_its_constraints():
    schema = generic_params()["registry_conn_id"].schema
    assert schema["type"] == ["null", "string"] and schema["pattern"] == r"^[A-Za-z0-9_.-]{1,250}$"


@pytest.mark.parametrize(("field", "value"), [
    pytest.param("name", "ab", id="name-too-short"),
    pytest.param("name", "Has Spaces", id="name-pattern"),
    pytest.param("nodes", 0, id="nodes-zero"),
    pytest.param("gpus_per_node", 9, id="gpus-9"),
    pytest.param("server_type", "g9", id="server-type"),
    pytest.param("memory", "lots", id="memory"),
    pytest.param("data_source", "http://bucket/x", id="data-not-s3"),
])
def test_the_form_refuses_what_the_model_refuses_before_anything_runs(field, value):
    params = ParamsDict(generic_params())
    with pytest.raises(Exception, match=field if field != "gpus_per_node" else "gpus_per_node"):
        params[field] = value
        params.validate()


def test_the_forms_defaults_make_a_valid_job():
    params = generic_params()
    values = {name: param.value for name, param in params.items()}
    assert parse_spec(spec_from_params(values)).name == "my-training-job"
    assert all(isinstance(p, Param) for p in params.values())


@pytest.mark.parametrize("path", sorted((REPO / "include" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_form_reproduces_every_shipped_spec(path):
    job = load_spec(path)
    assert parse_spec(spec_from_params(params_from_spec(job))) == job
