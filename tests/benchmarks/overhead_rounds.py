"""Which rounds of ``ckpt_overhead.py`` can carry a ratio, and the checkpoint-interval figures (no torch here).

A ratio ``ours' overhead / a baseline's overhead`` is only a figure when the baseline's
overhead in that round stands clearly above the noise of the loop itself. Where it is zero
or negative (the round's no-checkpoint run happened to be slow), the ratio is meaningless
or infinite: one such run printed ``spread=-0.636-inf``. So:

* the noise is measured from the repeated no-checkpoint runs (one per round): a robust
  standard deviation (1.4826 x the median absolute deviation), at least ``floor`` of their
  median (timer and scheduler jitter never measure as zero);
* a round is valid for a baseline when that baseline's overhead in the round exceeds
  ``k`` (3) times the noise; only valid rounds enter the median and the spread, so both
  are finite;
* fewer than ``MIN_VALID`` (3) valid rounds is a failed run (:class:`TooFewValidRounds`),
  not a figure.

The interval figures (``--interval``) turn a measured per-checkpoint cost into the number
people choose by (issue 47 item 4): see :func:`shortest_interval`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_VALID = 3
NOISE_K = 3.0
NOISE_FLOOR = 0.005  # of the no-checkpoint median: 0.5%


class TooFewValidRounds(RuntimeError):
    """Fewer than MIN_VALID rounds had a baseline overhead clearly above noise."""


def noise_s(baseline_totals: Sequence[float], floor: float = NOISE_FLOOR) -> float:
    """The no-checkpoint loop's noise in seconds: 1.4826 x MAD of its totals, at least ``floor`` x their median."""
    if not baseline_totals:
        raise ValueError("no no-checkpoint rounds to measure the noise from")
    median = statistics.median(baseline_totals)
    mad = statistics.median(abs(total - median) for total in baseline_totals)
    return max(1.4826 * mad, floor * median)


def valid_rounds(baseline_overheads: Sequence[float], noise: float, k: float = NOISE_K) -> list[bool]:
    """Per round: the baseline's overhead is clearly above noise (``> k * noise``, and positive)."""
    threshold = max(k * noise, 0.0)
    return [math.isfinite(overhead) and overhead > threshold and overhead > 0 for overhead in baseline_overheads]


@dataclass(frozen=True)
class ValidRatio:
    """Median and range of a ratio over the valid rounds, and how many rounds were valid."""

    median: float
    lo: float
    hi: float
    valid: int
    rounds: int
    values: tuple[float, ...]

    def spread(self, digits: int = 3) -> str:
        """``lo-hi``, finite by construction."""
        return f"{self.lo:.{digits}f}-{self.hi:.{digits}f}"


def valid_ratio(overheads: Sequence[float], baseline_overheads: Sequence[float], noise: float, *,
                k: float = NOISE_K, min_valid: int = MIN_VALID, label: str = "ratio") -> ValidRatio:
    """``overheads / baseline_overheads`` round by round, over the rounds valid for the baseline only.

    Raises TooFewValidRounds (its message names the label, the counts, the noise and each
    round's baseline overhead) when fewer than ``min_valid`` rounds are valid.
    """
    if len(overheads) != len(baseline_overheads):
        raise ValueError(f"{len(overheads)} overheads for {len(baseline_overheads)} baseline overheads: rounds must pair")
    keep = valid_rounds(baseline_overheads, noise, k)
    values = tuple(o / b for o, b, ok in zip(overheads, baseline_overheads, keep) if ok)
    if len(values) < min_valid:
        shown = ", ".join(f"{b:+.3f}" for b in baseline_overheads)
        raise TooFewValidRounds(
            f"{label}: only {len(values)} of {len(keep)} rounds valid (need {min_valid}): the baseline's overhead "
            f"per round was [{shown}] s against a noise of {noise:.3f} s (valid above {k:g} x noise). The "
            "checkpoint cost is lost in the loop's noise on this machine now: run more --pairs, more --steps "
            "per round, a larger state, or on a quieter machine")
    return ValidRatio(statistics.median(values), min(values), max(values), len(values), len(keep), values)


# ---- the checkpoint interval (issue 47 item 4) -------------------------------------------------------

@dataclass(frozen=True)
class IntervalFigures:
    """What one way of checkpointing allows: the shortest interval under the slowdown bound, and its price."""

    interval_steps: int
    slowdown: float
    lost_s_per_fault: float
    goodput: float


def slowdown_at(interval_steps: int, step_s: float, cost_s: float, persist_s: float) -> float:
    """End-to-end slowdown of checkpointing every ``interval_steps`` steps.

    ``cost_s``: what one checkpoint costs the training loop when the previous one has finished
    (its stall plus its interference); ``persist_s``: how long one takes to become durable in
    the background (0 for a synchronous save, whose cost holds it). A checkpoint due before the
    previous is durable waits for it, so the cost grows by what is left of ``persist_s``.
    """
    if interval_steps < 1 or step_s <= 0:
        raise ValueError("interval_steps must be >= 1 and step_s > 0")
    span = interval_steps * step_s
    return (max(cost_s, 0.0) + max(persist_s - span, 0.0)) / span


def shortest_interval(step_s: float, cost_s: float, persist_s: float, *, bound: float = 0.01,
                      fault_every_s: float = 3600.0) -> IntervalFigures:
    """The shortest interval (steps) whose slowdown stays under ``bound``, the work a fault loses at it
    and the goodput at one fault per ``fault_every_s``.

    Work lost per fault: half an interval on average (faults come at any time), plus
    ``persist_s`` (the newest checkpoint is not durable until then). Goodput: the share of
    wall time that ends as kept training, ``(1 - lost/fault_every) / (1 + slowdown)``.
    """
    cost = max(cost_s, 0.0)
    if cost >= bound * persist_s:  # the bound is met only where the interval outlasts the persist
        steps = math.floor(cost / (bound * step_s)) + 1
    else:  # cost + persist - span < bound * span
        steps = math.floor((cost + persist_s) / ((1 + bound) * step_s)) + 1
    steps = max(steps, 1)
    while slowdown_at(steps, step_s, cost, persist_s) >= bound:  # floating-point edges
        steps += 1
    slowdown = slowdown_at(steps, step_s, cost, persist_s)
    lost = steps * step_s / 2 + persist_s
    goodput = max(1.0 - lost / fault_every_s, 0.0) / (1.0 + slowdown)
    return IntervalFigures(steps, slowdown, lost, goodput)
