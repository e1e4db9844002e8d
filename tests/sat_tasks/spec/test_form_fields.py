"""One table of the Training Job's form fields (issue 46): SAT's Create page and the generic DAG's form read it."""

from __future__ import annotations

import itertools

import pytest

from sat_tasks.spec import job_schema, parse_spec
from sat_tasks.spec.form_fields import (
    DAG_SECTIONS,
    FIELDS,
    PAGE_SECTIONS,
    dag_fields,
    field_schema,
    page_fields,
)


def test_each_name_and_each_spec_path_is_one_row():
    names = [f.name for f in FIELDS]
    paths = [f.path for f in FIELDS if f.path]
    params = [f.dag.param for f in FIELDS if f.dag]
    assert len(set(names)) == len(names) and len(set(paths)) == len(paths) and len(set(params)) == len(params)
    assert all(f.section in PAGE_SECTIONS for f in FIELDS if f.section is not None)
    assert all(f.dag.section in DAG_SECTIONS for f in FIELDS if f.dag)
    assert all(f.section is not None or f.dag is not None for f in FIELDS), "a row no form shows"


@pytest.mark.parametrize("form", [f for f in FIELDS if f.path], ids=lambda f: f.name)
def test_each_spec_path_is_a_field_of_the_model_with_its_rule(form):
    schema = field_schema(form.path, job_schema())
    assert schema.get("description") and form.rule and form.schema == schema
    assert form.description == (form.help or schema["description"])
    for option in form.options:  # a choice the page offers is one the model takes
        assert option in schema["enum"]


def test_the_two_forms_show_the_rows_by_their_own_sections_in_the_tables_order():
    page = page_fields()
    assert [f.section for f in page] == sorted((f.section for f in page), key=PAGE_SECTIONS.index)
    assert [f.name for f in page][:3] == ["name", "learning_type", "framework"]
    dag = dag_fields()
    assert [f.dag.param for f in dag] == [
        "name", "learning_type", "framework", "job_failover", "command", "nodes", "server_type", "gpus_per_node",
        "memory", "shared_memory", "image_url", "registry_conn_id", "script_url", "data_source",
        "results_destination", "file_storage_mount", "tags", "extra"]
    order = {f.name: i for i, f in enumerate(FIELDS)}
    for fields, section_of in ((page, lambda f: f.section), (dag, lambda f: f.dag.section)):
        for before, after in itertools.pairwise(fields):
            if section_of(before) == section_of(after):
                assert order[before.name] < order[after.name]


def test_the_page_defaults_make_a_valid_job_once_named():
    spec: dict = {}
    for form in page_fields():
        if form.path and form.default is not None and form.kind != "textarea":
            node = spec
            *parents, leaf = form.path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = form.default
    assert parse_spec({**spec, "name": "a-job"}).image.url == "registry.sat.local/sat/training:0.1.0"
