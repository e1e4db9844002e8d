"""docs/spec-reference.md is generated from the Training Job's JSON Schema and names every field with its rule."""

from __future__ import annotations

import copy

from sat_tasks.spec import job_schema, reference
from tests.support.paths import REPO


def _fields(schema: dict, node: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every field of the schema as (path, its schema), nested objects and list items (`[]`) included."""
    found = []
    for name, prop in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        found.append((here, prop))
        inner = next((b for b in prop.get("anyOf", []) if b.get("type") != "null"), prop)
        suffix = ""
        if inner.get("type") == "array" and "items" in inner:
            inner, suffix = inner["items"], "[]"
        if "$ref" in inner:
            target = schema["$defs"][inner["$ref"].rsplit("/", 1)[-1]]
            if "properties" in target:
                found += _fields(schema, target, here + suffix)
    return found


def test_the_committed_reference_is_the_generated_one():
    for path, text in reference.generated_files(REPO).items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: {reference.GENERATOR}"


def test_every_field_of_the_schema_has_a_row_with_a_description():
    schema = job_schema()
    text = reference.markdown(schema)
    # A row's cells: field, type, required, default, allowed, description (a `|` inside a cell is escaped: `\|`).
    cells = {line[2:-2].split(" | ")[0].strip("`"): line[2:-2].split(" | ") for line in text.splitlines()
             if line.startswith("| `")}
    rows = {path: " | ".join(row) for path, row in cells.items()}
    fields = _fields(schema, schema)
    assert len(fields) > 60
    for path, _prop in fields:
        assert path in cells and len(cells[path]) == 6, path
        assert cells[path][5].strip(), f"{path}: no description in the schema (add one in sat_tasks/spec/)"
    for required in schema["required"]:
        assert cells[required][2] == "yes"
    assert "one of `cpu`, `g2`, `g3`" in rows["resources.server_type"]
    assert cells["nodes"][3:5] == ["`1`", ">= 1 and <= 64"]
    assert "## `notifications[]`" in text and "[Notification](#notifications)" in rows["notifications"]


def test_a_change_to_the_schema_changes_the_reference():
    """The check can fail: a new rule or description in the schema is a stale reference until regenerated."""
    schema = job_schema()
    changed = copy.deepcopy(schema)
    changed["properties"]["nodes"]["maximum"] = 128
    changed["properties"]["command"]["description"] = "what the container runs"
    before, after = reference.markdown(schema), reference.markdown(changed)
    assert before != after and ">= 1 and <= 128" in after and "what the container runs" in after


def test_the_reference_is_one_link_from_the_readme_and_the_user_guide():
    assert "(docs/spec-reference.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "(spec-reference.md)" in (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
