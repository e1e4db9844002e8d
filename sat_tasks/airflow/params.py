"""The generic DAG's trigger form ("Create Training Job"): Params generated from the Training Job's JSON Schema.

Its fields are rows of the one table both Create forms read (`sat_tasks.spec.form_fields`):
each maps to a path in the spec under a flat param name (`FORM_FIELDS`), with the table's label
as its title; its type, length, pattern, range, enum and description come from
`TrainingJob.model_json_schema()`, so the form checks what the model checks and no rule is
copied by hand. The form is flat; the `extra` field carries any other spec fields as JSON
(`spot`, `env`, `faults`, ...).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from sat_tasks.spec import TrainingJob, job_schema
from sat_tasks.spec.form_fields import (
    DAG_ADVANCED,
    DAG_COMPUTE,
    DAG_DATA,
    DAG_IMAGE,
    DAG_JOB,
    EXTRA_DESCRIPTION,
    UNSET,
    FormField,
    dag_fields,
    field_schema,
)

__all__ = ["ADVANCED", "COMPUTE", "DATA", "EXTRA", "EXTRA_DESCRIPTION", "EXTRA_FIELD", "FORM_FIELDS", "IMAGE", "JOB",
           "FormField", "field_schema", "generic_params", "param_default", "params_from_spec", "spec_from_params"]

_NOT_IN_FORM = ("x-rule", "title", "default")
JOB, COMPUTE, IMAGE, DATA, ADVANCED = DAG_JOB, DAG_COMPUTE, DAG_IMAGE, DAG_DATA, DAG_ADVANCED
# The form's fields that fill one spec path each, in the order of its Params; `extra` (every other field) last.
FORM_FIELDS: tuple[FormField, ...] = tuple(f for f in dag_fields() if f.path is not None)
# `extra`: every other spec field, as a JSON object (the page's Advanced JSON).
EXTRA_FIELD, EXTRA = next((f, f.dag) for f in dag_fields() if f.path is None and f.dag is not None)


def param_default(form: FormField, schema: dict[str, Any]) -> Any:
    """The value a fresh trigger form shows: the DAG form's own, else the table's, else the model's."""
    assert form.dag is not None
    if form.dag.default is not UNSET:
        return form.dag.default
    return form.default if form.default is not None else schema.get("default")


def generic_params() -> dict[str, Param]:
    """The "Create Training Job" form: sections, labels, enums, patterns, ranges and descriptions from the model."""
    schema = job_schema()
    params: dict[str, Param] = {}
    for form in FORM_FIELDS:
        assert form.dag is not None and form.path is not None
        prop = field_schema(form.path, schema)
        keywords = {k: v for k, v in prop.items() if k not in _NOT_IN_FORM}
        if form.dag.description:
            keywords["description"] = form.dag.description
        params[form.dag.param] = Param(param_default(form, prop), title=form.label, section=form.dag.section,
                                       **keywords)
    params[EXTRA.param] = Param(param_default(EXTRA_FIELD, {}), type="object", title=EXTRA_FIELD.label,
                                section=EXTRA.section, description=EXTRA.description)
    return params


def spec_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """Turn the form's flat values into a spec mapping (validated later by the spec model)."""
    spec: dict[str, Any] = {}
    for form in FORM_FIELDS:
        assert form.dag is not None and form.path is not None
        node = spec
        *parents, leaf = form.path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = params.get(form.dag.param)
    spec["tags"] = spec.get("tags") or {}
    extra = params.get(EXTRA.param) or {}
    if spec.get("learning_type") == "spot" and "job_failover" not in extra:
        spec["job_failover"] = False
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


def params_from_spec(job: TrainingJob) -> dict[str, Any]:
    """The form values that reproduce `job` (used by `sat run` with the generic DAG)."""
    data = job.to_dict()
    values: dict[str, Any] = {}
    for form in FORM_FIELDS:
        assert form.dag is not None and form.path is not None
        node: Any = data
        for part in form.path.split("."):
            node = node[part]
        values[form.dag.param] = node
    in_form = {form.path for form in FORM_FIELDS}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "tags":
            rest = {k: v for k, v in value.items() if f"{key}.{k}" not in in_form}
            if rest and key in ("resources", "image", "data", "storage"):
                extra[key] = rest
            elif rest and key not in ("resources", "image", "data", "storage", "results"):
                extra[key] = value
        elif key not in in_form and value not in (None, [], {}):
            extra[key] = value
    values[EXTRA.param] = extra
    return values
