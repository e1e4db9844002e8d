"""Read and validate job specs: every problem as `<file>: <field>: <rule>`, all of them at once."""

from __future__ import annotations

import functools
import inspect
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from sat_tasks.errors import SatError
from sat_tasks.spec.model import TrainingJob, cross_field_problems

# pydantic error types raised by a field constraint: reported with the field's own rule (`x-rule`).
_CONSTRAINT_ERRORS = frozenset({
    "string_pattern_mismatch", "string_too_short", "string_too_long", "greater_than", "greater_than_equal",
    "less_than", "less_than_equal", "too_long", "too_short",
})
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.]*): (.+)$", re.DOTALL)

# Deepest nesting of mappings and lists a spec may have: real specs use 4 levels; a file nested
# thousands deep would exhaust the recursion of the YAML composer and pydantic (RecursionError).
MAX_NESTING = 64
NESTING_RULE = f"is nested deeper than {MAX_NESTING} levels (mappings and lists)"

# libyaml's parser when PyYAML was built with it (it is, in the lock): ~20x faster than the pure-Python
# one on a spec, and a DAG file reads every spec on each parse. Same safe constructor, same marks.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecProblem(BaseModel):
    """One problem in a spec: the field path and the rule it breaks."""

    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


class SpecError(SatError, ValueError):
    """A spec breaks one or more rules; `problems` lists them all. Fix the fields named and validate again."""

    def __init__(self, source: str, problems: list[SpecProblem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class SpecFileErrors(SatError, ImportError):
    """One or more job spec files break rules; the message lists `<file>: <field>: <rule>` lines."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(
            f"{len(errors)} job spec file(s) are invalid and have no DAG:\n" + "\n".join(errors.values())
        )


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`Fault`, `list[Fault]`, `Resources | None`), if any."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def field_info(loc: tuple[Any, ...], model: type[BaseModel] = TrainingJob
               ) -> tuple[FieldInfo | None, type[BaseModel] | None]:
    """The field at an error location, and the model that holds the fields below it."""
    info: FieldInfo | None = None
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None, None
        info = current.model_fields[part]
        current = _model_of(info.annotation)
    return info, current


def _rule_of(info: FieldInfo | None) -> str | None:
    extra = info.json_schema_extra if info is not None else None
    rule = extra.get("x-rule") if isinstance(extra, dict) else None
    return rule if isinstance(rule, str) else None


def problems_from(exc: ValidationError, model: type[BaseModel] = TrainingJob) -> list[SpecProblem]:
    """pydantic's errors in the service's words: one `SpecProblem` per broken rule."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        field = ".".join(str(part) for part in loc)
        msg = err["msg"].removeprefix("Value error, ")
        info, holder = field_info(loc, model)
        rule = _rule_of(info)
        if err["type"] in _CONSTRAINT_ERRORS and rule:
            msg = rule
            if err["type"] == "too_long":  # pydantic counts a dict's items only after validation: count the input
                got = err.get("ctx", {}).get("actual_length")
                got = len(err["input"]) if got is None and hasattr(err.get("input"), "__len__") else got
                msg += "" if got is None else f" (got {got})"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] in ("enum", "literal_error"):
            msg = f"must be one of {err.get('ctx', {}).get('expected', '')}".strip()
        # A model's own rule names the field it is about ("job_failover: ...", "gpus_per_node: ...").
        named = _FIELD_PREFIX.match(msg)
        if named and (not loc or (holder is not None and named.group(1).split(".")[0] in holder.model_fields)):
            field = ".".join(p for p in (field, named.group(1)) if p)
            msg = named.group(2)
        problems.append(SpecProblem(field=field or "<spec>", rule=msg))
    return problems


def nesting_depth(data: Any, limit: int = MAX_NESTING) -> int:
    """How deeply `data`'s dicts and lists nest (a scalar is 0), counted without recursion up to `limit + 1`."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, (dict, list, tuple)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_spec(data: Any, source: str = "<spec>") -> TrainingJob:
    """Validate a mapping into a TrainingJob or raise SpecError listing every problem."""
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem(field="<spec>", rule="must be a mapping of fields")])
    if nesting_depth(data) > MAX_NESTING:
        raise SpecError(source, [SpecProblem(field="<spec>", rule=NESTING_RULE)])
    try:
        return TrainingJob.model_validate(data)
    except ValidationError as exc:
        problems = problems_from(exc)
        # Cross-field rules run only on a field-valid model; report them now too.
        for line in cross_field_problems(data):
            field, rule = line.split(": ", 1)
            if all(p.field != field for p in problems):
                problems.append(SpecProblem(field=field, rule=rule))
        raise SpecError(source, problems) from None


# YAML anchors and aliases (`&name`, `*name`) share one value in several places: a chain of them (the
# "billion laughs") is a few hundred bytes that expand to more values than any check can walk (issue 44.6).
# A spec never needs them, so a spec file may hold none.
ALIAS_RULE = "uses a YAML anchor or alias (&name, *name), which spec files may not"
DUPLICATE_RULE = "is given twice in one mapping (YAML duplicate key)"
_MAX_FILE_PROBLEMS = 20


def _yaml_problems(text: str, limit: int = MAX_NESTING) -> list[SpecProblem]:
    """What breaks the file rules in the YAML text, from the parser's events (the parser keeps a stack, it does not
    recurse, and nothing is built): nesting past `limit`, any anchor or alias, a key given twice in one mapping.

    libyaml (CSafeLoader) refuses very deep flow collections with a parse error of its own; the pure-Python
    parser then reads them, stopping one level past `limit`, so such a file still gets the nesting rule.
    """
    try:
        return _events_problems(yaml.parse(text, Loader=_YAML_LOADER), limit)
    except yaml.YAMLError:
        if _YAML_LOADER is yaml.SafeLoader:
            raise
        return _events_problems(yaml.parse(text, Loader=yaml.SafeLoader), limit)


class _Frame:
    """A mapping or list the event walk is inside: its field path, keys seen (a mapping), the next key or index."""

    __slots__ = ("expect_key", "index", "is_map", "key", "keys", "path")

    def __init__(self, is_map: bool, path: tuple[str, ...]) -> None:
        self.is_map, self.path = is_map, path
        self.keys: set[str] = set()
        self.expect_key, self.key, self.index = True, "", 0

    def child_path(self) -> tuple[str, ...]:
        return (*self.path, self.key if self.is_map else str(self.index))

    def done(self) -> None:
        """A node in this frame ended: a key's value comes next, or the next key, or the next item."""
        if self.is_map:
            self.expect_key = not self.expect_key
        else:
            self.index += 1


def _events_problems(events: Any, limit: int) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    stack: list[_Frame] = []
    for event in events:
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            return [SpecProblem(field="<file>", rule=f"{ALIAS_RULE} (line {event.start_mark.line + 1})")]
        parent = stack[-1] if stack else None
        if isinstance(event, yaml.ScalarEvent):
            if parent is not None and parent.is_map and parent.expect_key:
                parent.key = event.value
                if event.value in parent.keys and len(problems) < _MAX_FILE_PROBLEMS:
                    field = ".".join(parent.child_path())
                    problems.append(SpecProblem(field=field, rule=f"{DUPLICATE_RULE} (line {event.start_mark.line + 1})"))
                parent.keys.add(event.value)
            if parent is not None:
                parent.done()
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) >= limit:
                return [SpecProblem(field="<file>", rule=NESTING_RULE)]
            if parent is not None and parent.is_map and parent.expect_key:
                parent.key = "<key>"  # a mapping or list as a key: its fields are named under <key>
            path = parent.child_path() if parent is not None else ()
            stack.append(_Frame(isinstance(event, yaml.MappingStartEvent), path))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
            if stack:
                stack[-1].done()
    return problems


def read_yaml_file(path: str | Path) -> Any:
    """A YAML file's data; a file that cannot be read or parsed, nests too deeply, holds an anchor or alias or a
    duplicate key, is a SpecError on `<file>` (or on the duplicated field)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        problems = _yaml_problems(text)
        if problems:
            raise SpecError(str(path), problems)
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader: CSafeLoader or SafeLoader
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [SpecProblem(field="<file>", rule=f"cannot be read: {exc}")]) from None
    except RecursionError:  # one bad file stays one error
        raise SpecError(str(path), [SpecProblem(field="<file>", rule=NESTING_RULE)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(str(path), [SpecProblem(field="<file>", rule=f"is not valid YAML{where}")]) from None


def load_spec(path: str | Path) -> TrainingJob:
    """Read and validate one YAML spec file."""
    return parse_spec(read_yaml_file(path), source=str(path))


# path -> (the file's stamp, its TrainingJob or its problems): what `load_spec_cached` read last.
_SPEC_CACHE: dict[str, tuple[tuple[int, ...], TrainingJob | list[SpecProblem]]] = {}
_SPEC_CACHE_LIMIT = 50_000


def _file_stamp(path: Path) -> tuple[int, ...] | None:
    """What tells one version of a file from the next without reading it: mtime, ctime, size, inode."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def load_spec_cached(path: str | Path) -> TrainingJob:
    """`load_spec`, once per version of the file in this process (keyed by path, mtime, ctime, size, inode).

    The DAG files, the list page and the job page all read the same specs: each file is
    read and validated once per change, and a bad one raises the same SpecError each time.
    The TrainingJob returned is shared (the model is frozen). A file that cannot be stat'ed
    is read without the cache (and fails as `load_spec` does).
    """
    path = Path(path)
    stamp = _file_stamp(path)
    if stamp is None:
        return load_spec(path)
    key = os.fspath(path)
    hit = _SPEC_CACHE.get(key)
    if hit is None or hit[0] != stamp:
        try:
            result: TrainingJob | list[SpecProblem] = load_spec(path)
        except SpecError as exc:
            result = exc.problems
        if len(_SPEC_CACHE) >= _SPEC_CACHE_LIMIT:
            _SPEC_CACHE.clear()
        _SPEC_CACHE[key] = hit = (stamp, result)
    if isinstance(hit[1], list):
        raise SpecError(key, hit[1])
    return hit[1]


@functools.cache
def _rules_stamp() -> list:
    """What tells this process's spec rules from another's: `sat_tasks.spec`'s module stamps, the backends."""
    from sat_tasks.spec.model import BackendKind

    modules = sorted(Path(__file__).parent.glob("*.py"))
    return [[module.name, *(_file_stamp(module) or ())] for module in modules] + [kind.value for kind in BackendKind]


def spec_verdicts(paths: list[Path]) -> dict[str, Any]:
    """What `load_spec_cached` found of those `paths` it read in this process, for another process to reuse.

    `{"rules": ..., "specs": {path: [stamp, dag_id]}}` for a valid spec, `[stamp, None, [[field, rule], ...]]`
    for a bad one: JSON, so a DAG file can hand its pass's verdicts to the next DAG file's process.
    """
    specs: dict[str, list] = {}
    for path in paths:
        hit = _SPEC_CACHE.get(os.fspath(path))
        if hit is not None:
            stamp, result = hit
            specs[os.fspath(path)] = ([list(stamp), None, [[p.field, p.rule] for p in result]]
                                      if isinstance(result, list) else [list(stamp), dag_id_for(result)])
    return {"rules": _rules_stamp(), "specs": specs}


def spec_dag_id(path: str | Path, verdicts: dict[str, Any]) -> str:
    """The DAG id of the spec file `path`, or its SpecError, as `load_spec_cached` would give them.

    Taken from `verdicts` (`spec_verdicts` of another process) when they hold this very version
    of the file under the same rules; the file is read and validated otherwise.
    """
    path = Path(path)
    known = verdicts.get("specs", {}).get(os.fspath(path)) if verdicts.get("rules") == _rules_stamp() else None
    problems = None
    try:
        if known is not None and tuple(known[0]) == _file_stamp(path):
            if known[1] is not None:
                return str(known[1])
            problems = [SpecProblem(field=str(field), rule=str(rule)) for field, rule in known[2]]
    except (TypeError, ValueError, IndexError):
        problems = None  # not a verdict `spec_verdicts` wrote: validate the file
    if problems:
        raise SpecError(os.fspath(path), problems)
    return dag_id_for(load_spec_cached(path))


def clear_spec_cache() -> None:
    """Forget every spec `load_spec_cached` read (tests; a process that wants a fresh read)."""
    _SPEC_CACHE.clear()


def dag_id_for(job: TrainingJob) -> str:
    """The DAG id of a job spec: its name (valid job names are valid DAG ids)."""
    return job.name


def job_schema() -> dict[str, Any]:
    """The Training Job's JSON Schema (draft 2020-12), with each field's rule; what `sat schema` prints."""
    schema = TrainingJob.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema.setdefault("title", "TrainingJob")
    return schema
