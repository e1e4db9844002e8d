"""Validate staged training data with a Great Expectations suite before any GPU time is spent."""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sat_tasks.config import include_dir
from sat_tasks.errors import SatError

if TYPE_CHECKING:  # pragma: no cover - typing only; pandas and GX load inside validate_dataset
    import pandas as pd

DEFAULT_SUITE = "text_corpus.json"

# The per-file table every suite runs against: one row per data file.
FILE_COLUMNS: dict[str, str] = {
    "path": "path relative to the data directory, '/'-separated",
    "size_bytes": "file size in bytes",
    "extension": "lower-case suffix with its dot ('.txt'); '' when the name has none",
    "utf8_ok": "the whole file decodes as UTF-8 (a leading BOM is allowed)",
    "nul_bytes": "number of NUL (0x00) bytes: binary data hiding behind a text extension",
    "n_lines": "number of lines ('\\n'-separated; a final newline does not start a new line)",
    "n_nonempty_lines": "lines with at least one non-whitespace character",
    "nonempty_ratio": "n_nonempty_lines / n_lines (0.0 for an empty file)",
    "max_line_chars": "length of the longest line, in characters",
    "records_ok": "for .jsonl: every non-empty line is a JSON object with a string 'text' field; "
    "True for other files",
}
# kwargs that name a column of the table; checked before GX runs so a typo is a clear error.
_COLUMN_KWARGS = ("column", "column_A", "column_B")
_COLUMN_LIST_KWARGS = ("column_list",)
# kwargs that are GX bookkeeping, left out of an outcome.
_NOISE_KWARGS = frozenset({"batch_id", "result_format", "include_config", "catch_exceptions"})
_READ_CHUNK = 1 << 20
_MAX_LISTED_FILES = 10
_MAX_LISTED_VALUES = 8


class DataValidationError(SatError):
    """The data or the suite could not be validated at all (missing directory, bad suite)."""


class ExpectationSuiteError(DataValidationError):
    """A suite file is missing, is not valid JSON, or holds an expectation GX cannot build."""


@dataclass(frozen=True)
class ExpectationOutcome:
    """The result of one expectation, reduced to what a person (and an XCom) needs.

    Parameters:
        expectation_type: GX expectation type, e.g. ``expect_column_values_to_be_in_set``.
        column: the column it checks, or None for table-level expectations.
        kwargs: the expectation's arguments, without GX bookkeeping (``batch_id``).
        success: whether the expectation held.
        observed: a short summary of what GX observed.
        message: one human line: the expectation, its description and what was observed.
        unexpected_files: up to ten files (relative paths) that broke a per-file expectation.
    """

    expectation_type: str
    column: str | None
    kwargs: dict[str, Any]
    success: bool
    observed: str
    message: str
    unexpected_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ValidationReport:
    """What `validate_dataset` found: overall success and one outcome per expectation.

    Parameters:
        success: every expectation held.
        suite_name: the suite's name (from its JSON file).
        results: one `ExpectationOutcome` per expectation, in suite order.
        statistics: counts of files, bytes, lines and expectations (JSON-able).
        suite_path: the suite file that was run.
        data_dir: the directory that was validated.
    """

    success: bool
    suite_name: str
    results: list[ExpectationOutcome]
    statistics: dict[str, Any]
    suite_path: str = ""
    data_dir: str = ""

    @property
    def failed(self) -> list[ExpectationOutcome]:
        """The outcomes whose expectation did not hold."""
        return [r for r in self.results if not r.success]

    def summary_lines(self) -> list[str]:
        """One line per failing expectation, naming it and what was observed."""
        return [r.message for r in self.failed]

    def to_dict(self) -> dict[str, Any]:
        """A small JSON-able dict (safe to push to XCom)."""
        return asdict(self)


def expectations_dir() -> Path:
    """The directory relative suite paths resolve against (``$SAT_INCLUDE_DIR/expectations``)."""
    return include_dir().expanduser().resolve() / "expectations"


def resolve_suite_path(suite: str | Path | None) -> Path:
    """The suite file for `suite`: None means the default; relative paths live under `expectations_dir()`.

    A bare name without a suffix also finds ``<name>.json``. A relative name must stay inside
    `expectations_dir()` (a job spec's `data.expectation_suite` is one: the spec refuses
    absolute ones); absolute paths are for callers inside SAT. Raises `ExpectationSuiteError`
    naming every path tried when no file exists, or the rule when a name leaves the directory.
    """
    name = Path(suite) if suite is not None else Path(DEFAULT_SUITE)
    if name.is_absolute():
        base = name
    else:
        root = expectations_dir()
        base = root / name
        if ".." in name.parts or not base.resolve().is_relative_to(root.resolve()):
            raise ExpectationSuiteError(f"expectation suite {str(suite)!r}: a suite name must be a relative path "
                                        f"inside {root} (no '..')")
    candidates = [base] if base.suffix else [base, base.with_suffix(".json")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    shown = str(suite or DEFAULT_SUITE)
    raise ExpectationSuiteError(f"expectation suite {shown!r} not found (tried {tried})")


def load_suite_file(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """Read a GX JSON suite file into (suite name, expectation configs).

    Accepts GX 1.x (``name``, ``type``) and 0.x (``expectation_suite_name``,
    ``expectation_type``) spellings. Raises `ExpectationSuiteError` naming the file.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExpectationSuiteError(f"cannot read expectation suite {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExpectationSuiteError(f"expectation suite {path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        got = type(raw).__name__
        raise ExpectationSuiteError(f"expectation suite {path} must be a JSON object, got {got}")
    name = raw.get("name") or raw.get("expectation_suite_name") or path.stem
    expectations = raw.get("expectations")
    if not isinstance(expectations, list):
        raise ExpectationSuiteError(f"expectation suite {path} needs an 'expectations' list")
    configs = []
    for index, item in enumerate(expectations):
        where = f"expectation suite {path}, expectation #{index}"
        if not isinstance(item, dict):
            raise ExpectationSuiteError(f"{where} must be a JSON object")
        exp_type = item.get("type") or item.get("expectation_type")
        if not isinstance(exp_type, str) or not exp_type:
            raise ExpectationSuiteError(f"{where} has no 'type'")
        kwargs = item.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise ExpectationSuiteError(f"{where} ({exp_type}): 'kwargs' must be a JSON object")
        config: dict[str, Any] = {"type": exp_type, "kwargs": kwargs, "meta": item.get("meta") or {}}
        for optional in ("description", "notes"):
            if item.get(optional) is not None:
                config[optional] = item[optional]
        configs.append(config)
    return str(name), configs


def validate_dataset(
    data_dir: str | Path,
    suite: str | Path | None = None,
    *,
    log: Callable[[str], None] = print,
) -> ValidationReport:
    """Run a Great Expectations suite over the files in `data_dir` and report every outcome.

    Call order: resolve, read and build the suite (so a bad suite fails before any file is
    read), profile every data file into one row of the per-file table (`FILE_COLUMNS`),
    then run the suite on that table in a fresh ephemeral, offline GX context. A failing
    expectation is a report with ``success=False``, not an exception;
    `DataValidationError` (or its `ExpectationSuiteError`) means nothing could be validated.

    Parameters:
        data_dir: the staged data (hidden files and directories, names starting with '.',
            are skipped).
        suite: a GX JSON suite file; relative paths resolve under `expectations_dir()`;
            None runs the default text-corpus suite.
        log: receives progress lines and one line per failing expectation.
    """
    root = Path(data_dir).expanduser()
    if not root.exists():
        raise DataValidationError(f"data directory {root} does not exist (was the data staged?)")
    if not root.is_dir():
        raise DataValidationError(f"data directory {root} is not a directory")
    suite_path = resolve_suite_path(suite)
    suite_name, configs = load_suite_file(suite_path)
    _check_columns(suite_path, configs, list(FILE_COLUMNS))
    _set_gx_offline()
    expectations = _build_expectations(suite_path, configs)

    log(f"Reading the files in {root} for suite {suite_name!r}")
    rows, skipped = profile_files(root)
    total_bytes = sum(r["size_bytes"] for r in rows)
    log(
        f"Validating {len(rows)} file(s), {total_bytes} bytes, "
        f"against {len(configs)} expectation(s) from {suite_path}"
    )
    if skipped:
        log(f"Skipped hidden entries ({len(skipped)}): {', '.join(skipped[:_MAX_LISTED_FILES])}")
    gx_results = _run_suite(suite_name, expectations, _file_table(rows))

    outcomes = [_outcome(config, result) for config, result in zip(configs, gx_results, strict=True)]
    statistics = {
        "files": len(rows),
        "skipped_hidden_entries": len(skipped),
        "total_bytes": total_bytes,
        "total_lines": sum(r["n_lines"] for r in rows),
        "evaluated_expectations": len(outcomes),
        "successful_expectations": sum(o.success for o in outcomes),
        "unsuccessful_expectations": sum(not o.success for o in outcomes),
    }
    report = ValidationReport(
        success=all(o.success for o in outcomes),
        suite_name=suite_name,
        results=outcomes,
        statistics=statistics,
        suite_path=str(suite_path),
        data_dir=str(root),
    )
    for line in report.summary_lines():
        log(f"FAILED {line}")
    verdict = "passed" if report.success else "FAILED"
    log(
        f"Data validation {verdict}: {statistics['successful_expectations']}/"
        f"{statistics['evaluated_expectations']} expectations of suite {suite_name!r} held"
    )
    return report


def profile_files(root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """One row of `FILE_COLUMNS` per file under `root`, plus the hidden entries skipped.

    Hidden entries (names starting with '.') are skipped, and hidden directories are not
    entered; a skipped directory is listed with a trailing '/'.
    """
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        hidden = [d for d in sorted(dirnames) if d.startswith(".")]
        skipped.extend(f"{(here / d).relative_to(root).as_posix()}/" for d in hidden)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if name.startswith("."):
                skipped.append(rel)
            elif path.is_file():
                rows.append(profile_file(path, rel))
    return rows, skipped


def profile_file(path: Path, rel: str) -> dict[str, Any]:
    """Read `path` once, in chunks, and measure it for the per-file table."""
    extension = path.suffix.lower()
    check_records = extension == ".jsonl"
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
    utf8_ok = True
    size = nul_bytes = n_lines = n_nonempty = max_chars = 0
    records_ok = True
    carry = ""

    def take(line: str) -> None:
        nonlocal n_lines, n_nonempty, max_chars, records_ok
        n_lines += 1
        max_chars = max(max_chars, len(line))
        if line.strip():
            n_nonempty += 1
            if check_records and records_ok:
                records_ok = _is_text_record(line)

    with path.open("rb") as fh:
        while chunk := fh.read(_READ_CHUNK):
            size += len(chunk)
            nul_bytes += chunk.count(b"\x00")
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError:
                utf8_ok = False
                decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
                text = decoder.decode(chunk)
            *complete, carry = (carry + text).split("\n")
            for line in complete:
                take(line)
        try:
            carry += decoder.decode(b"", final=True)
        except UnicodeDecodeError:  # the file ends inside a multi-byte sequence
            utf8_ok = False
        if carry:
            take(carry)
    return {
        "path": rel,
        "size_bytes": size,
        "extension": extension,
        "utf8_ok": utf8_ok,
        "nul_bytes": nul_bytes,
        "n_lines": n_lines,
        "n_nonempty_lines": n_nonempty,
        "nonempty_ratio": n_nonempty / n_lines if n_lines else 0.0,
        "max_line_chars": max_chars,
        "records_ok": records_ok if check_records else True,
    }


def _is_text_record(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("text"), str)


def _file_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    table = pd.DataFrame(rows, columns=list(FILE_COLUMNS))
    dtypes = {
        "path": "object",
        "extension": "object",
        "utf8_ok": "bool",
        "records_ok": "bool",
        "nonempty_ratio": "float64",
    }
    ints = {c: "int64" for c in ("size_bytes", "nul_bytes", "n_lines", "n_nonempty_lines", "max_line_chars")}
    return table.astype({**dtypes, **ints})


def _check_columns(suite_path: Path, configs: list[dict[str, Any]], columns: list[str]) -> None:
    for index, config in enumerate(configs):
        kwargs = config["kwargs"]
        named = [kwargs[k] for k in _COLUMN_KWARGS if isinstance(kwargs.get(k), str)]
        for key in _COLUMN_LIST_KWARGS:
            if isinstance(kwargs.get(key), list):
                named.extend(c for c in kwargs[key] if isinstance(c, str))
        unknown = [c for c in named if c not in columns]
        if unknown:
            raise ExpectationSuiteError(
                f"expectation suite {suite_path}, expectation #{index} ({config['type']}) names unknown "
                f"column(s) {', '.join(map(repr, unknown))}; the per-file table has: {', '.join(columns)}"
            )


def _set_gx_offline() -> None:
    """Keep GX from phoning home; must run before great_expectations is first imported."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


def _build_expectations(suite_path: Path, configs: list[dict[str, Any]]) -> list[Any]:
    """GX Expectation objects for `configs`; a bad type or kwargs is an `ExpectationSuiteError`."""
    from great_expectations import exceptions as gx_exceptions
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    expectations = []
    for index, config in enumerate(configs):
        where = f"expectation suite {suite_path}, expectation #{index} ({config['type']})"
        try:
            expectations.append(ExpectationConfiguration(**config).to_domain_obj())
        except gx_exceptions.ExpectationNotFoundError as exc:
            raise ExpectationSuiteError(
                f"{where}: unknown expectation type (Great Expectations has no {config['type']!r})"
            ) from exc
        except (gx_exceptions.GreatExpectationsError, ValueError, TypeError) as exc:
            detail = " ".join(str(exc).split())
            raise ExpectationSuiteError(f"{where}: invalid kwargs: {detail}") from exc
    return expectations


def _run_suite(suite_name: str, expectations: list[Any], table: pd.DataFrame) -> list[Any]:
    """Run `expectations` on `table` in a fresh ephemeral GX context; results in suite order."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
        ),
    )
    gx_suite = context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=expectations))
    batch = (
        context.data_sources.add_pandas("sat_staged_data")
        .add_dataframe_asset("files")
        .add_batch_definition_whole_dataframe("all_files")
        .get_batch(batch_parameters={"dataframe": table})
    )
    result = batch.validate(
        gx_suite,
        result_format={
            "result_format": "SUMMARY",
            "unexpected_index_column_names": ["path"],
            "partial_unexpected_count": _MAX_LISTED_FILES,
        },
    )
    by_id = {r.expectation_config.id: r for r in result.results}
    return [by_id[exp.id] for exp in gx_suite.expectations]


def _outcome(config: dict[str, Any], result: Any) -> ExpectationOutcome:
    exp_type = config["type"]
    kwargs = {k: _jsonable(v) for k, v in config["kwargs"].items() if k not in _NOISE_KWARGS}
    details = result.result or {}
    column = kwargs.get("column") if isinstance(kwargs.get("column"), str) else None
    index_rows = details.get("partial_unexpected_index_list") or []
    unexpected_files = [str(row.get("path")) for row in index_rows if isinstance(row, Mapping)]
    exception = result.exception_info if isinstance(result.exception_info, dict) else {}
    observed = _observed(details, exception, unexpected_files)
    description = config.get("description") or (config.get("meta") or {}).get("notes")  # 0.x: meta.notes
    if not isinstance(description, str):
        description = None
    label = f"{exp_type}({_short_kwargs(kwargs)})"
    if description:
        label += f" [{description}]"
    message = f"{label}: {observed}"
    return ExpectationOutcome(
        expectation_type=exp_type,
        column=column,
        kwargs=kwargs,
        success=bool(result.success),
        observed=observed,
        message=message,
        unexpected_files=unexpected_files,
    )


def _observed(details: Mapping[str, Any], exception: Mapping[str, Any], files: list[str]) -> str:
    if exception.get("raised_exception"):
        return f"error: {exception.get('exception_message')}"
    nested = [v for v in exception.values() if isinstance(v, Mapping) and v.get("raised_exception")]
    if nested:
        return f"error: {nested[0].get('exception_message')}"
    if "observed_value" in details:
        return f"observed {_short(_jsonable(details['observed_value']))}"
    if "unexpected_count" in details:
        count, total = details.get("unexpected_count") or 0, details.get("element_count") or 0
        text = f"{count} of {total} file(s) unexpected"
        if files:
            values = [_short(_jsonable(v)) for v in details.get("partial_unexpected_list") or []]
            pairs = [f"{f} ({v})" for f, v in zip(files, values, strict=False)] or files
            more = ", ..." if count > len(pairs) else ""
            text += f": {', '.join(pairs)}{more}"
        return text
    return "no observed value"


def _short_kwargs(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > _MAX_LISTED_VALUES:
        shown = ", ".join(json.dumps(v) for v in value[:_MAX_LISTED_VALUES])
        return f"[{shown}, ... {len(value) - _MAX_LISTED_VALUES} more]"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _jsonable(value: Any) -> Any:
    """Plain JSON types for numpy scalars, tuples, sets and nested containers."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)
