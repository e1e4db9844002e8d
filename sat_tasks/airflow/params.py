"""The generic DAG's trigger form ("Create Training Job"): Params generated from the Training Job's JSON Schema.

Each form field maps to a path in the spec (`FORM_FIELDS`); its type, length, pattern,
range, enum and description come from `TrainingJob.model_json_schema()`, so the form
checks what the model checks and no rule is copied by hand. The form is flat; the
`extra` field carries any other spec fields as JSON (`spot`, `env`, `faults`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param

from sat_tasks.spec import TrainingJob, job_schema

_NOT_IN_FORM = ("x-rule", "title", "default")


@dataclass(frozen=True)
class FormField:
    """One field of the form: its name, the spec path it fills, its section and (optional) default."""

    name: str
    path: str | None
    section: str
    default: Any = None
    has_default: bool = False


def _field(name: str, path: str | None, section: str, *default: Any) -> FormField:
    return FormField(name, path, section, default[0] if default else None, bool(default))


JOB, COMPUTE, IMAGE, DATA, ADVANCED = "Job", "Compute", "Container image", "Data and results", "Advanced"
FORM_FIELDS: tuple[FormField, ...] = (
    _field("name", "name", JOB, "my-training-job"),
    _field("learning_type", "learning_type", JOB),
    _field("framework", "framework", JOB),
    _field("job_failover", "job_failover", JOB, True),
    _field("command", "command", JOB, "python train.py"),
    _field("nodes", "nodes", COMPUTE),
    _field("server_type", "resources.server_type", COMPUTE),
    _field("gpus_per_node", "resources.gpus_per_node", COMPUTE),
    _field("memory", "resources.memory", COMPUTE),
    _field("shared_memory", "resources.shared_memory", COMPUTE),
    _field("image_url", "image.url", IMAGE, "registry.sat.local/sat/training:0.1.0"),
    _field("registry_conn_id", "image.registry_conn_id", IMAGE),
    _field("script_url", "storage.script_url", DATA),
    _field("data_source", "data.source", DATA, "s3://sat-demo/datasets/tiny-corpus/"),
    _field("results_destination", "results.destination", DATA, "s3://sat-demo/results/"),
    _field("file_storage_mount", "storage.file_storage_mount", DATA),
    _field("tags", "tags", ADVANCED, {}),
)
EXTRA_DESCRIPTION = ("more spec fields as JSON: spot, elastic, env, faults (local backend), backend, "
                     "startup_timeout_seconds, ...")


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` with a `$ref` into `$defs` replaced by the definition (its own keys win)."""
    if "$ref" in node:
        target = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _section(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The object `node` describes, refs resolved; an optional section (`elastic: Elastic | None`) its object branch."""
    node = _resolve(schema, node)
    if "properties" not in node and "anyOf" in node:
        node = next((branch for b in node["anyOf"] if "properties" in (branch := _resolve(schema, b))), node)
    return node


def field_schema(path: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of the spec field at `path` (`resources.memory`), refs resolved, Optional as a type list."""
    schema = schema or job_schema()
    node: dict[str, Any] = schema
    for part in path.split("."):
        node = _section(schema, node)
        node = node["properties"][part]
    node = _resolve(schema, node)
    if "anyOf" in node:  # `X | None`: the form takes null or X's constraints
        branches = [_resolve(schema, b) for b in node["anyOf"]]
        real = [b for b in branches if b.get("type") != "null"]
        merged = {k: v for k, v in node.items() if k != "anyOf"}
        if len(real) == 1:
            merged.update({k: v for k, v in real[0].items() if k != "type"})
            merged["type"] = ["null", real[0].get("type", "string")]
        node = merged
    return node


def generic_params() -> dict[str, Param]:
    """The "Create Training Job" form: sections, enums, patterns, ranges and descriptions from the model."""
    schema = job_schema()
    params: dict[str, Param] = {}
    for form in FORM_FIELDS:
        prop = field_schema(form.path, schema)
        default = form.default if form.has_default else prop.get("default")
        keywords = {k: v for k, v in prop.items() if k not in _NOT_IN_FORM}
        params[form.name] = Param(default, section=form.section, **keywords)
    params["extra"] = Param({}, type="object", section=ADVANCED, description=EXTRA_DESCRIPTION)
    return params


def spec_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """Turn the form's flat values into a spec mapping (validated later by the spec model)."""
    spec: dict[str, Any] = {}
    for form in FORM_FIELDS:
        node = spec
        *parents, leaf = form.path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = params.get(form.name)
    spec["tags"] = spec.get("tags") or {}
    extra = params.get("extra") or {}
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
        node: Any = data
        for part in form.path.split("."):
            node = node[part]
        values[form.name] = node
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
    values["extra"] = extra
    return values
