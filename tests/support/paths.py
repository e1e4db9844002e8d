"""Paths the tests share: the repository root and the recorded fixtures of tests/sat_tasks."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAT_FIXTURES = REPO / "tests" / "sat_tasks" / "fixtures"
