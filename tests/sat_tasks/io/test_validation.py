"""Tests for sat_tasks.validation: real Great Expectations suites over small corpora in tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sat_tasks.io.validation import (
    FILE_COLUMNS,
    DataValidationError,
    ExpectationSuiteError,
    ValidationReport,
    expectations_dir,
    profile_file,
    resolve_suite_path,
    validate_dataset,
)
from tests.support.paths import REPO

CORPUS = REPO / "include" / "corpus"
PARAGRAPH = "The quick brown fox jumps over the lazy dog.\nIt was not amused.\n\n"


@pytest.fixture(scope="module", autouse=True)
def warm_gx(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Pay the Great Expectations import and first-run cost once for the module."""
    data = tmp_path_factory.mktemp("warm")
    (data / "a.txt").write_text(PARAGRAPH, encoding="utf-8")
    validate_dataset(data, log=lambda _: None)


def write_good_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "part-00.txt").write_text(PARAGRAPH * 20, encoding="utf-8")
    (root / "sub").mkdir()
    (root / "sub" / "part-01.txt").write_text("Grüße aus Köln — ünïcödé text.\n" * 5, encoding="utf-8")
    (root / "notes.md").write_text("# Title\n\nSome text.\n", encoding="utf-8")
    records = [{"text": f"record {i}"} for i in range(5)]
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return root


def write_suite(path: Path, expectations: list[dict], name: str = "my_suite") -> Path:
    path.write_text(json.dumps({"name": name, "expectations": expectations}), encoding="utf-8")
    return path


def failed_types(report: ValidationReport) -> list[str]:
    return [o.expectation_type for o in report.failed]


def failed_columns(report: ValidationReport) -> set[str | None]:
    return {o.column for o in report.failed}


def test_default_suite_passes_on_good_corpus(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    (data / ".sat-stage.json").write_text("{}", encoding="utf-8")  # hidden: skipped
    lines: list[str] = []

    report = validate_dataset(data, log=lines.append)

    assert report.success, report.summary_lines()
    assert report.suite_name == "text_corpus"
    assert report.failed == [] and report.summary_lines() == []
    assert len(report.results) >= 5 and all(o.success for o in report.results)
    assert report.statistics["files"] == 4
    assert report.statistics["skipped_hidden_entries"] == 1
    assert report.statistics["unsuccessful_expectations"] == 0
    assert any("Validating 4 file(s)" in line for line in lines)
    assert "passed" in lines[-1]


def test_report_to_dict_is_small_json(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    (data / "bad.bin").write_bytes(b"\x00\xff" * 10)

    as_dict = validate_dataset(data, log=lambda _: None).to_dict()

    encoded = json.dumps(as_dict)  # plain JSON types only (no numpy scalars)
    assert json.loads(encoded) == as_dict
    assert len(encoded) < 16_000
    assert as_dict["success"] is False
    assert {"success", "suite_name", "results", "statistics"} <= set(as_dict)
    assert all("batch_id" not in r["kwargs"] for r in as_dict["results"])


@pytest.mark.parametrize(
    ("make_bad", "expected_type", "expected_column", "expected_file"),
    [
        pytest.param(lambda d: None, "expect_table_row_count_to_be_between", None, None, id="empty-directory"),
        pytest.param(
            lambda d: (d / "broken.txt").write_bytes(b"good start\n\xff\xfe\xfa not utf-8\n"),
            "expect_column_values_to_be_in_set",
            "utf8_ok",
            "broken.txt",
            id="invalid-utf8",
        ),
        pytest.param(
            lambda d: (d / "blank.txt").write_text("\n   \n\t\n\n", encoding="utf-8"),
            "expect_column_values_to_be_between",
            "nonempty_ratio",
            "blank.txt",
            id="only-blank-lines",
        ),
        pytest.param(
            lambda d: (d / "table.csv").write_text("a,b\n1,2\n", encoding="utf-8"),
            "expect_column_values_to_be_in_set",
            "extension",
            "table.csv",
            id="disallowed-extension",
        ),
        pytest.param(
            lambda d: (d / "zeros.txt").write_bytes(b"text\x00\x00\x00\n"),
            "expect_column_values_to_be_between",
            "nul_bytes",
            "zeros.txt",
            id="nul-bytes",
        ),
        pytest.param(
            lambda d: (d / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n', encoding="utf-8"),
            "expect_column_values_to_be_in_set",
            "records_ok",
            "bad.jsonl",
            id="jsonl-without-text",
        ),
    ],
)
def test_default_suite_fails_and_lists_the_failing_expectation(
    tmp_path: Path, make_bad, expected_type: str, expected_column: str | None, expected_file: str | None
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    if expected_file is not None:  # a good file next to the bad one: only the bad one is named
        (data / "good.txt").write_text(PARAGRAPH, encoding="utf-8")
    make_bad(data)
    lines: list[str] = []

    report = validate_dataset(data, log=lines.append)

    assert not report.success
    assert len(report.failed) == 1, report.summary_lines()
    failed = report.failed[0]
    assert failed.expectation_type == expected_type
    assert failed.column == expected_column
    summary = report.summary_lines()
    assert len(summary) == 1 and expected_type in summary[0]
    if expected_file is not None:
        assert failed.unexpected_files == [expected_file]
        assert expected_file in summary[0] and "good.txt" not in summary[0]
        assert "1 of 2 file(s)" in failed.observed
    else:
        assert failed.observed == "observed 0"
    assert any(line.startswith("FAILED ") and expected_type in line for line in lines)
    assert "FAILED" in lines[-1]
    assert report.statistics["unsuccessful_expectations"] == 1


def test_zero_byte_file_fails_size_and_line_checks(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    (data / "empty.txt").write_bytes(b"")

    report = validate_dataset(data, log=lambda _: None)

    assert failed_columns(report) == {"size_bytes", "nonempty_ratio"}
    assert all(o.unexpected_files == ["empty.txt"] for o in report.failed)


def test_several_bad_files_are_all_reported(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    (data / "broken.txt").write_bytes(b"\xc3\x28 invalid\n")
    (data / "blank.txt").write_text("\n\n\n", encoding="utf-8")
    (data / "image.png").write_text("x\n", encoding="utf-8")

    report = validate_dataset(data, log=lambda _: None)

    assert failed_columns(report) == {"utf8_ok", "nonempty_ratio", "extension"}
    assert len(report.summary_lines()) == 3


def test_user_suite_from_json_file_passes_and_fails(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    suite = write_suite(
        tmp_path / "corpus_rules.json",
        [
            {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 4, "max_value": 10}},
            {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "path", "regex": r"\.(?:txt|md|jsonl)$"}},
            {"type": "expect_column_sum_to_be_between", "kwargs": {"column": "n_nonempty_lines", "min_value": 10}},
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "max_line_chars", "max_value": 1000},
                "description": "no minified blobs",
            },
        ],
    )

    passed = validate_dataset(data, suite, log=lambda _: None)
    assert passed.success, passed.summary_lines()
    assert passed.suite_name == "my_suite"
    assert len(passed.results) == 4

    (data / "long.txt").write_text("x" * 5000 + "\n", encoding="utf-8")
    failed = validate_dataset(data, str(suite), log=lambda _: None)
    assert not failed.success
    assert failed_types(failed) == ["expect_column_values_to_be_between"]
    assert failed.failed[0].unexpected_files == ["long.txt"]
    assert "no minified blobs" in failed.summary_lines()[0]
    assert "5000" in failed.summary_lines()[0]


def test_table_level_failure_reports_observed_value(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    suite = write_suite(
        tmp_path / "s.json",
        [{"type": "expect_column_sum_to_be_between", "kwargs": {"column": "size_bytes", "max_value": 10}}],
    )

    report = validate_dataset(data, suite, log=lambda _: None)

    assert not report.success
    total = report.statistics["total_bytes"]
    assert report.failed[0].observed == f"observed {total}"
    assert "size_bytes" in report.summary_lines()[0]


def test_expectation_that_errors_at_run_time_is_a_failed_outcome(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    suite = write_suite(
        tmp_path / "s.json",
        [{"type": "expect_column_mean_to_be_between", "kwargs": {"column": "path", "min_value": 1}}],
    )

    report = validate_dataset(data, suite, log=lambda _: None)

    assert not report.success
    assert report.failed[0].observed.startswith("error: ")


def test_readme_example_suite_builds(tmp_path: Path) -> None:
    readme = (REPO / "include" / "expectations" / "README.md").read_text(encoding="utf-8")
    example = readme.split("```json\n", 1)[1].split("```", 1)[0]
    suite = tmp_path / "example.json"
    suite.write_text(example, encoding="utf-8")

    report = validate_dataset(write_good_corpus(tmp_path / "data"), suite, log=lambda _: None)

    assert report.suite_name == "my_corpus" and len(report.results) == 4


def test_legacy_suite_spelling_is_accepted(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    suite = tmp_path / "legacy.json"
    suite.write_text(
        json.dumps(
            {
                "expectation_suite_name": "legacy",
                "expectations": [
                    {"expectation_type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 100}}
                ],
            }
        ),
        encoding="utf-8",
    )

    report = validate_dataset(data, suite, log=lambda _: None)

    assert report.suite_name == "legacy"
    assert failed_types(report) == ["expect_table_row_count_to_be_between"]


def test_relative_suite_resolves_under_include_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    include = tmp_path / "include"
    (include / "expectations").mkdir(parents=True)
    write_suite(
        include / "expectations" / "tiny.json",
        [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}}],
        name="tiny",
    )
    monkeypatch.setenv("SAT_INCLUDE_DIR", str(include))

    assert expectations_dir() == include.resolve() / "expectations"
    assert resolve_suite_path("tiny.json") == include.resolve() / "expectations" / "tiny.json"
    assert resolve_suite_path("tiny") == include.resolve() / "expectations" / "tiny.json"
    report = validate_dataset(write_good_corpus(tmp_path / "data"), "tiny", log=lambda _: None)
    assert report.success and report.suite_name == "tiny"


def test_default_suite_ships_in_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAT_INCLUDE_DIR", raising=False)
    path = resolve_suite_path(None)
    assert path == REPO / "include" / "expectations" / "text_corpus.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["name"] == "text_corpus"
    assert all({"type", "kwargs"} <= set(e) for e in raw["expectations"])


@pytest.mark.parametrize(
    ("suite_text", "expected"),
    [
        pytest.param(None, "not found", id="missing-file"),
        pytest.param('{"name": "x", "expectations": [', "not valid JSON", id="invalid-json"),
        pytest.param("[1, 2]", "must be a JSON object", id="not-an-object"),
        pytest.param('{"name": "x"}', "needs an 'expectations' list", id="no-expectations"),
        pytest.param(
            '{"name": "x", "expectations": [{"type": "expect_data_to_be_lovely", "kwargs": {}}]}',
            "unknown expectation type",
            id="unknown-expectation",
        ),
        pytest.param(
            '{"name": "x", "expectations": [{"type": "expect_column_values_to_be_in_set", '
            '"kwargs": {"column": "utf8_ok"}}]}',
            "invalid kwargs",
            id="missing-kwarg",
        ),
        pytest.param(
            '{"name": "x", "expectations": [{"type": "expect_column_values_to_be_in_set", '
            '"kwargs": {"column": "encoding", "value_set": ["utf-8"]}}]}',
            "unknown column(s) 'encoding'",
            id="unknown-column",
        ),
    ],
)
def test_bad_suite_is_a_clear_error_naming_the_file(tmp_path: Path, suite_text: str | None, expected: str) -> None:
    data = write_good_corpus(tmp_path / "data")
    suite = tmp_path / "bad_suite.json"
    if suite_text is not None:
        suite.write_text(suite_text, encoding="utf-8")

    with pytest.raises(ExpectationSuiteError, match="bad_suite") as caught:
        validate_dataset(data, suite, log=lambda _: None)

    assert expected in str(caught.value)
    assert isinstance(caught.value, DataValidationError)


def test_missing_relative_suite_names_every_path_tried(tmp_path: Path) -> None:
    with pytest.raises(ExpectationSuiteError, match=r"'no_such_suite' not found \(tried .*no_such_suite\.json\)"):
        validate_dataset(write_good_corpus(tmp_path / "data"), "no_such_suite", log=lambda _: None)


def test_missing_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match="does not exist"):
        validate_dataset(tmp_path / "never-staged", log=lambda _: None)
    (tmp_path / "file.txt").write_text("x\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match="is not a directory"):
        validate_dataset(tmp_path / "file.txt", log=lambda _: None)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"a\nb\n", {"n_lines": 2, "n_nonempty_lines": 2, "utf8_ok": True}, id="final-newline"),
        pytest.param(b"a\n\nb", {"n_lines": 3, "n_nonempty_lines": 2, "max_line_chars": 1}, id="no-final-newline"),
        pytest.param(b"", {"n_lines": 0, "nonempty_ratio": 0.0, "size_bytes": 0}, id="empty"),
        pytest.param(b"\xef\xbb\xbfhi\r\n", {"utf8_ok": True, "max_line_chars": 3}, id="bom-crlf"),
        pytest.param("é".encode() * 3 + b"\xc3", {"utf8_ok": False}, id="truncated-multibyte"),
        pytest.param(b"x\x00y\n", {"nul_bytes": 1, "utf8_ok": True}, id="nul"),
    ],
)
def test_profile_file_measures(tmp_path: Path, content: bytes, expected: dict) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(content)

    row = profile_file(path, "f.txt")

    assert set(row) == set(FILE_COLUMNS)
    assert {k: row[k] for k in expected} == expected


def test_profile_file_handles_multibyte_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sat_tasks.io import validation

    monkeypatch.setattr(validation, "_READ_CHUNK", 3)
    path = tmp_path / "f.txt"
    path.write_text("ää\nöö\n\nü\n", encoding="utf-8")

    row = profile_file(path, "f.txt")

    assert row["utf8_ok"] and row["n_lines"] == 4 and row["n_nonempty_lines"] == 3 and row["max_line_chars"] == 2


def test_module_import_stays_light() -> None:
    code = (
        "import sys, sat_tasks.io.validation; "
        "heavy = [m for m in ('great_expectations', 'pandas', 'airflow') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


def test_runs_offline_and_writes_nothing(tmp_path: Path) -> None:
    data = write_good_corpus(tmp_path / "data")
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    code = f"""
import os, socket, sys
def refuse(*args, **kwargs):
    raise OSError("network access during validation")
socket.socket.connect = socket.create_connection = socket.getaddrinfo = refuse
sys.path.insert(0, {str(REPO)!r})
from sat_tasks.io.validation import validate_dataset
report = validate_dataset({str(data)!r}, log=lambda _: None)
print(report.success, os.environ.get("GX_ANALYTICS_ENABLED"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=workdir, timeout=120)

    assert out.returncode == 0, out.stderr
    success, analytics = out.stdout.split()
    assert success == "True" and analytics.lower() == "false"
    assert list(workdir.iterdir()) == []  # no gx/ project, no great_expectations.yml


def test_shipped_corpus_passes_default_suite() -> None:
    if not CORPUS.is_dir() or not any(p.is_file() for p in CORPUS.rglob("*")):
        pytest.skip("include/corpus/ is not in this checkout yet")

    report = validate_dataset(CORPUS, log=lambda _: None)

    assert report.success, report.summary_lines()
    assert report.statistics["files"] >= 1
