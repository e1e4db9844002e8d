"""Issue 47.3 and 47.4: ``ckpt_overhead.py``'s round validity and interval figures, fed synthetic timings.

The benchmark itself is not a test (tests/benchmarks/*.py are not collected); its pure
helpers in ``tests/benchmarks/overhead_rounds.py`` are, so a figure that can be infinite or
a run that should fail loudly cannot come back unseen.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "overhead_rounds.py"
_SPEC = importlib.util.spec_from_file_location("overhead_rounds", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
rounds = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("overhead_rounds", rounds)
_SPEC.loader.exec_module(rounds)


def test_noise_is_a_robust_spread_of_the_no_checkpoint_runs_with_a_floor() -> None:
    # median 10.0, absolute deviations 0, .2, .2, .4, 3.0 -> MAD .2 -> 0.2965; one outlier does not inflate it
    assert rounds.noise_s([10.0, 10.2, 9.8, 10.4, 13.0]) == pytest.approx(1.4826 * 0.2)
    assert rounds.noise_s([10.0, 10.0, 10.0]) == pytest.approx(0.05)  # never zero: 0.5% of the median
    with pytest.raises(ValueError, match="no no-checkpoint rounds"):
        rounds.noise_s([])


def test_the_run_that_printed_an_infinite_spread_now_leaves_those_rounds_out() -> None:
    """Baseline overheads of 0 and below (the loop's noise) made ratios of inf and below -0.6."""
    ours = [0.10, 0.12, -0.05, 0.11, 0.09]
    sync = [0.50, 0.48, 0.0, -0.02, 0.52]
    result = rounds.valid_ratio(ours, sync, noise=0.05)
    assert (result.valid, result.rounds) == (3, 5)
    assert result.values == pytest.approx((0.2, 0.25, 0.09 / 0.52))
    assert math.isfinite(result.lo) and math.isfinite(result.hi) and result.spread() == "0.173-0.250"
    assert result.median == pytest.approx(0.2)


def test_a_baseline_overhead_within_k_times_the_noise_is_not_clearly_above_it() -> None:
    assert rounds.valid_rounds([0.151, 0.15, 0.149, 1.0, float("inf"), float("nan")], noise=0.05) == [
        True, False, False, True, False, False]
    assert rounds.valid_rounds([0.001], noise=0.0) == [True]  # no noise: any positive overhead counts
    assert rounds.valid_rounds([0.0, -0.1], noise=0.0) == [False, False]


def test_fewer_than_three_valid_rounds_fail_loudly_naming_what_was_measured() -> None:
    with pytest.raises(rounds.TooFewValidRounds) as failed:
        rounds.valid_ratio([0.1, 0.1, 0.1, 0.1], [0.5, 0.4, 0.01, -0.2], noise=0.05, label="overhead_ratio")
    message = str(failed.value)
    assert "overhead_ratio: only 2 of 4 rounds valid (need 3)" in message
    assert "+0.010" in message and "-0.200" in message and "0.050 s" in message and "--pairs" in message
    with pytest.raises(ValueError, match="rounds must pair"):
        rounds.valid_ratio([0.1], [0.5, 0.5], noise=0.0)


def test_the_shortest_interval_under_one_percent_and_what_it_costs() -> None:
    # 0.1 s steps; a sync save holding the loop 2 s: 1% needs more than 200 s between saves -> 2001 steps
    sync = rounds.shortest_interval(step_s=0.1, cost_s=2.0, persist_s=0.0)
    assert sync.interval_steps == 2001 and sync.slowdown < 0.01
    assert rounds.slowdown_at(2000, 0.1, 2.0, 0.0) == pytest.approx(0.01)  # one fewer is not under 1%
    assert sync.lost_s_per_fault == pytest.approx(100.05)
    assert sync.goodput == pytest.approx((1 - 100.05 / 3600) / (1 + 2.0 / 200.1))
    # an async save costing 0.01 s whose write takes 3 s: the interval must outlast the write
    fast = rounds.shortest_interval(step_s=0.1, cost_s=0.01, persist_s=3.0)
    assert fast.interval_steps == 30 and fast.slowdown < 0.01
    assert rounds.slowdown_at(29, 0.1, 0.01, 3.0) >= 0.01
    assert fast.lost_s_per_fault == pytest.approx(30 * 0.1 / 2 + 3.0) and fast.goodput > sync.goodput
    # a checkpoint that costs nothing measurable: every step, bounded by the write only
    free = rounds.shortest_interval(step_s=1.0, cost_s=-0.2, persist_s=0.0)
    assert free.interval_steps == 1 and free.slowdown == 0.0
    with pytest.raises(ValueError):
        rounds.slowdown_at(0, 0.1, 1.0, 0.0)
