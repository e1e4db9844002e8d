"""docs/spec-reference.md: every field of the Training Job spec, generated from its JSON Schema (issue 46).

The schema is the model's (`job_schema`, what `sat schema` prints), so the reference states each
field's path, type, whether it is required, its default, what it allows (values, pattern, range,
length) and its description exactly as the model checks them; nested objects get a section each.
`python -m sat_tasks.spec.reference --write` writes the file, `--check` (the default) says whether
it is stale; tests/sat_tasks/spec/test_reference.py fails while the committed file differs.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sat_tasks.spec.loading import job_schema

TITLE = "# Training Job spec reference"
GENERATOR = "python -m sat_tasks.spec.reference --write"
DOC = Path("docs") / "spec-reference.md"


@dataclass(frozen=True)
class Section:
    """One object of the spec: its path (`resources`, `notifications[]`; "" for the top level) and its schema."""

    path: str
    schema: dict[str, Any]

    @property
    def heading(self) -> str:
        return "Top level" if not self.path else f"`{self.path}`"

    @property
    def anchor(self) -> str:
        """GitHub's anchor for the heading (lower case, punctuation dropped, spaces as hyphens)."""
        return re.sub(r"[^\w\- ]", "", self.heading.strip().lower()).replace(" ", "-")


def _ref(schema: dict[str, Any], node: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the `$defs` name, the definition) a `$ref` points at, or (None, node)."""
    if "$ref" not in node:
        return None, node
    name = node["$ref"].rsplit("/", 1)[-1]
    return name, schema["$defs"][name]


def _optional(node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the non-null branch, True) for `X | None` (`anyOf` with null), else (node, False)."""
    branches = node.get("anyOf")
    if not branches:
        return node, False
    real = [b for b in branches if b.get("type") != "null"]
    if len(real) == 1 and len(real) < len(branches):
        return real[0], True
    return node, False


def _is_object(node: dict[str, Any]) -> bool:
    return "properties" in node


class _Walk:
    """The sections of the schema, each object once, in the order its fields name them (depth first)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.sections: list[Section] = []
        self.anchor_of: dict[str, str] = {}  # a field's path -> the anchor of its object's section
        self._visit("", schema)

    def _child(self, node: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(the object a field holds, "" or "[]" for a list of them), or (None, "") for a scalar field."""
        inner, _ = _optional(node)
        _, target = _ref(self.schema, inner)
        if _is_object(target):
            return target, ""
        if target.get("type") == "array":
            _, item = _ref(self.schema, target.get("items", {}))
            if _is_object(item):
                return item, "[]"
        return None, ""

    def _visit(self, path: str, node: dict[str, Any]) -> None:
        section = Section(path, node)
        self.sections.append(section)
        children = []
        for name, prop in node.get("properties", {}).items():
            target, suffix = self._child(prop)
            if target is not None:
                children.append((f"{path}.{name}{suffix}" if path else f"{name}{suffix}", target))
        for child_path, target in children:
            self.anchor_of[child_path] = Section(child_path, target).anchor
            self._visit(child_path, target)


def _code(value: Any) -> str:
    """A value as inline code (JSON), with the table's `|` escaped."""
    text = value if isinstance(value, str) else json.dumps(value)
    return "`" + str(text).replace("|", "\\|") + "`"


def _words(text: str) -> str:
    """Prose for a table cell: one line, `|` escaped, `<...>` shown as text rather than read as HTML."""
    text = " ".join(text.split())
    return text.replace("|", "\\|").replace("<", "&lt;")


def _span(low: Any, high: Any, unit: str) -> str:
    if low is not None and high is not None:
        return f"{low}-{high} {unit}"
    count = low if low is not None else high
    return f"{'at least' if low is not None else 'at most'} {count} {unit if count != 1 else unit[:-1]}"


def _allowed(schema: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """What a field allows, in words: its values, length, range, pattern, keys and entries."""
    found: list[str] = []
    _, target = _ref(schema, node)
    if "enum" in target:
        found.append("one of " + ", ".join(_code(v) for v in target["enum"]))
    if "minLength" in target or "maxLength" in target:
        found.append(_span(target.get("minLength"), target.get("maxLength"), "chars"))
    bounds = [f"{sign} {target[key]}" for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                         ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in target]
    if bounds:
        found.append(" and ".join(bounds))
    if "pattern" in target:
        found.append("pattern " + _code(target["pattern"]))
    if "minItems" in target or "maxItems" in target:
        found.append(_span(target.get("minItems"), target.get("maxItems"), "items"))
    if "maxProperties" in target:
        found.append(f"at most {target['maxProperties']} entries")
    if "pattern" in target.get("propertyNames", {}):
        found.append("keys match " + _code(target["propertyNames"]["pattern"]))
    values = target.get("additionalProperties")
    if isinstance(values, dict) and "maxLength" in values:
        found.append(f"values at most {values['maxLength']} chars")
    if target.get("type") == "array" and "items" in target and "properties" not in _ref(schema, target["items"])[1]:
        found += [f"each: {rule}" for rule in _allowed(schema, target["items"])]
    return found


class _Reference:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.walk = _Walk(schema)

    def type_of(self, path: str, node: dict[str, Any]) -> str:
        inner, optional = _optional(node)
        text = self._type(path, inner)
        return f"{text} or null" if optional else text

    def _type(self, path: str, node: dict[str, Any]) -> str:
        name, target = _ref(self.schema, node)
        if _is_object(target):
            return f"object ([{name}](#{self.walk.anchor_of[path]}))"
        kind = target.get("type", "any")
        if kind == "array":
            item_path = path + "[]"
            if item_path in self.walk.anchor_of:
                item_name, _ = _ref(self.schema, target["items"])
                return f"list of objects ([{item_name}](#{self.walk.anchor_of[item_path]}))"
            _, item = _ref(self.schema, target.get("items", {}))
            return f"list of {item.get('type', 'any')}s"
        if kind == "object":
            values = target.get("additionalProperties")
            value_type = values.get("type", "any") if isinstance(values, dict) else "any"
            return f"map of string to {value_type}"
        return str(kind)

    def default_of(self, node: dict[str, Any], required: bool) -> str:
        if required:
            return "—"
        if "default" in node:
            return _code(node["default"])
        inner, _ = _optional(node)
        _, target = _ref(self.schema, inner)
        if _is_object(target):
            return "each field's default"
        return {"array": "`[]`", "object": "`{}`"}.get(target.get("type", ""), "(none)")

    def description_of(self, node: dict[str, Any]) -> str:
        inner, _ = _optional(node)
        _, target = _ref(self.schema, inner)
        text = node.get("description") or inner.get("description") or target.get("description") or ""
        rule = node.get("x-rule") or inner.get("x-rule")
        if rule and rule not in text:
            text = f"{text.rstrip('.')}. Rule: {rule}" if text else f"Rule: {rule}"
        return _words(text)

    def rows(self, section: Section) -> list[str]:
        required = set(section.schema.get("required", ()))
        lines = ["| Field | Type | Required | Default | Allowed | Description |", "|---|---|---|---|---|---|"]
        for name, prop in section.schema.get("properties", {}).items():
            path = f"{section.path}.{name}" if section.path else name
            inner, _ = _optional(prop)
            allowed = "; ".join(_allowed(self.schema, inner)) or "any"
            lines.append(f"| `{path}` | {self.type_of(path, prop)} | {'yes' if name in required else 'no'} | "
                         f"{self.default_of(prop, name in required)} | {allowed} | {self.description_of(prop)} |")
        return lines

    def markdown(self) -> str:
        lines = [
            TITLE,
            "",
            f"Generated from the Training Job's JSON Schema (`sat schema` prints it; the model is "
            f"`sat_tasks/spec/model.py`) by `{GENERATOR}`; do not edit by hand.",
            "",
            "A spec is a YAML file (one Training Job, one DAG; see the [user guide](user-guide.md#the-training-job)).",
            "A field marked required has no default; any other may be left out. A field of type object is a",
            "section of its own below; `[]` in a path is each item of a list. `sat validate` reports a broken",
            "rule as `<field>: <rule>`. Rules between fields (Spot without failover, GPUs of a server type,",
            "elastic only with failover, ...) are checked by the model too and are not listed here.",
            "",
            "Sections: " + ", ".join(f"[{s.heading}](#{s.anchor})" for s in self.walk.sections) + ".",
        ]
        for section in self.walk.sections:
            lines += ["", f"## {section.heading}", ""]
            about = section.schema.get("description")
            if about:
                lines += [" ".join(about.split()), ""]
            lines += self.rows(section)
        return "\n".join(lines) + "\n"


def markdown(schema: dict[str, Any] | None = None) -> str:
    """docs/spec-reference.md: every field of the spec, from the JSON Schema (the model's unless given)."""
    return _Reference(schema or job_schema()).markdown()


def generated_files(root: Path) -> dict[Path, str]:
    """The files generated from the schema under the project `root`, with the text each must hold."""
    return {root / DOC: markdown()}


if __name__ == "__main__":  # pragma: no cover - `python -m sat_tasks.spec.reference --write | --check`
    from sat_tasks.settings import regenerate

    _project = Path(__file__).resolve().parents[2]
    sys.exit(regenerate(generated_files(_project), _project, sys.argv))
