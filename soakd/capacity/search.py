"""Capacity room, the search and the steady state: pure, no clock, no IO (docs/capacity.md).

``Search`` says which load to try next: a geometric ramp (``start``, ``start * factor``,
...) up to the ceiling until a step fails, then bisection between the highest passing and
the lowest failing load until they are within ``precision`` of each other. A first step
that fails steps down by the same factor (three times at most). ``steady`` judges whether
a step's queue depth stopped rising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

STEPS_DOWN = 3
"""A first step that fails: this many steps down by ``factor`` before the knee is
declared below the lowest load tried."""

STEADY_SLACK = 1.0
"""Requests a queue may grow by between the middle and the last third of a step and still
count as steady (a queue of 0 or 1 wobbles by one)."""


@dataclass
class Search:
    """Which load to try next, from the verdicts so far."""

    start: float
    factor: float
    ceiling: float
    precision: float
    whole: bool = False  # concurrency: whole numbers only
    passed: float | None = None  # the highest load that held
    failed: float | None = None  # the lowest load that did not
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def record(self, load: float, ok: bool) -> None:
        self.tried.append((load, ok))
        if ok:
            self.passed = load if self.passed is None else max(self.passed, load)
        else:
            self.failed = load if self.failed is None else min(self.failed, load)

    def _round(self, load: float) -> float:
        return float(max(1, round(load))) if self.whole else load

    def next(self) -> float | None:
        """The next load to try; None: the search is over (``knee`` holds the answer)."""
        if self.failed is None:  # still ramping up
            if self.passed is None:
                return self._round(min(self.start, self.ceiling))
            if self.passed >= self.ceiling:
                return None  # held up to the ceiling: the knee is at least there
            return self._round(min(self.passed * self.factor, self.ceiling))
        if self.passed is None:  # the first steps failed: step down
            if len(self.tried) > STEPS_DOWN:
                return None
            load = self._round(self.failed / self.factor)
            return None if load >= self.failed else load
        if self.failed - self.passed <= self.precision * self.passed:
            return None
        mid = self._round((self.passed + self.failed) / 2)
        if mid <= self.passed or mid >= self.failed:
            return None  # whole numbers next to each other
        return mid

    @property
    def knee(self) -> float | None:
        """The highest load that held (None: none did)."""
        return self.passed

    @property
    def at_ceiling(self) -> bool:
        return self.failed is None and self.passed is not None and self.passed >= self.ceiling


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def steady(samples: Sequence[tuple[float, float]], tolerance: float) -> bool | None:
    """Did the queue stop rising? ``samples``: (seconds into the step, queue depth). The
    first third is the warm-up (the batch filling); steady when the last third's mean depth
    is at most the middle third's times (1 + ``tolerance``), plus ``STEADY_SLACK``. None:
    too few samples in either third to tell."""
    if not samples:
        return None
    span = samples[-1][0]
    middle = [d for t, d in samples if span / 3 <= t < 2 * span / 3]
    last = [d for t, d in samples if t >= 2 * span / 3]
    if len(middle) < 2 or len(last) < 2:
        return None
    base = _mean(middle)
    return _mean(last) <= base * (1 + tolerance) + STEADY_SLACK
