"""Each INTERNAL fixture is decided by recognising its error, not by the exit-status fallback alone (issue 43
item 6). A fixture whose point is the exit status itself says so (`decided_by: exit-status`)."""

from __future__ import annotations

import json

import pytest

from sat_tasks.classify import VerdictKind, explain
from tests.sat_tasks.classify.test_classifier import CASES as RECORDED
from tests.sat_tasks.classify.test_classifier import FIXTURES
from tests.sat_tasks.classify.test_classifier import load_case as load_recorded
from tests.sat_tasks.classify.test_real_world import CASES as REAL_WORLD
from tests.sat_tasks.classify.test_real_world import load_case, record_of

FALLBACK = "6 exit status"


def _internal_real_world():
    for path in REAL_WORLD:
        case = load_case(path)
        if case["expected"]["kind"] == "INTERNAL":
            yield pytest.param(case, id=path.stem)


def _internal_recorded():
    for name in RECORDED:
        expected = json.loads((FIXTURES / name / "expected.json").read_text())
        if expected["kind"] == "INTERNAL":
            yield pytest.param(name, expected, id=name)


def _recognised(why) -> None:
    assert why.verdict.kind is VerdictKind.INTERNAL
    assert why.steps[-1][0] != FALLBACK, why.steps
    assert any(f.kind is VerdictKind.INTERNAL for f in why.findings), why.findings


@pytest.mark.parametrize("case", list(_internal_real_world()))
def test_each_internal_real_world_case_is_recognised(case):
    if case.get("decided_by") == "exit-status":
        pytest.fail("a public thread's failure has an error to recognise")
    _recognised(explain(record_of(case)))


@pytest.mark.parametrize(("name", "expected"), list(_internal_recorded()))
def test_each_internal_recorded_case_is_recognised_or_says_it_is_the_exit_status(name, expected):
    why = explain(load_recorded(name))
    if expected.get("decided_by") == "exit-status":
        assert why.steps[-1][0] == FALLBACK and not why.findings, why.steps
        return
    _recognised(why)


def test_at_most_a_few_recorded_cases_are_the_exit_status_alone():
    exempt = [name for name in RECORDED
              if json.loads((FIXTURES / name / "expected.json").read_text()).get("decided_by") == "exit-status"]
    assert len(exempt) <= 2, exempt
