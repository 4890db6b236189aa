"""Curves: the rate arithmetic of the open loops, once. A ramp's linear rate (``Curve``), a
daily cycle's (``Cycle``, over 24 h, and ``DayCurve``, a phase's stretch of it): each the
expected requests from a phase's start, L(t), its rate and its inverse, which
``workload/arrivals.py`` walks and ``shapes.py`` asks for the gauge and the counts.

Pure; knows no other room.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

DAY_S = 86_400.0
"""A daily cycle's period, in seconds of configured time."""


class Cumulative(Protocol):
    """What ``arrivals`` walks: the expected requests from a phase's start, L(t), its rate
    and its inverse (``Curve``, ``DayCurve``)."""

    @property
    def total(self) -> float: ...  # L(duration)

    def at(self, t_s: float) -> float: ...

    def rate(self, t_s: float) -> float: ...

    def inverse(self, s: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Curve:
    """The expected requests from a phase's start over one phase: L(t) = r0 t + a t^2, the
    integral of a rate that changes linearly from r0 (r0 + 2at). Constant and poisson have
    a = 0; a ramp's a takes it from its start rate to its end rate over the phase."""

    r0: float  # req/s at the phase start
    a: float  # half the rate's slope
    total: float  # L(duration): requests expected over the whole phase

    def at(self, t_s: float) -> float:
        """L(t): requests expected in the first ``t_s`` seconds."""
        return self.r0 * t_s + self.a * t_s * t_s

    def rate(self, t_s: float) -> float:
        """The rate at ``t_s`` seconds from the phase start."""
        return self.r0 + 2 * self.a * t_s

    def inverse(self, s: float) -> float:
        """L^-1(s) = 2s / (r0 + sqrt(r0^2 + 4as)): exact when a is 0 or negative."""
        if self.a == 0.0:
            return s / self.r0
        r0 = self.r0
        return 2 * s / (r0 + math.sqrt(max(0.0, r0 * r0 + 4 * self.a * s)))


@dataclass(frozen=True, slots=True, eq=False)
class Cycle:
    """A rate that repeats every day: linear between knots (seconds into the day, req/s),
    wrapping at midnight; its integral from midnight (``at``) and the inverse of that."""

    xs: tuple[float, ...]  # 0, the knots, DAY_S
    rs: tuple[float, ...]  # the rate at each
    cs: tuple[float, ...]  # the requests expected from midnight to each

    @classmethod
    def of(cls, knots: Sequence[tuple[float, float]]) -> Cycle:
        pts = sorted((x % DAY_S, r) for x, r in knots)
        (x0, r0), (xn, rn) = pts[0], pts[-1]
        midnight = rn + (r0 - rn) * (DAY_S - xn) / (x0 + DAY_S - xn)
        xs = (0.0, *(x for x, _ in pts), DAY_S)
        rs = (midnight, *(r for _, r in pts), midnight)
        cs = [0.0]
        for i in range(len(xs) - 1):
            cs.append(cs[-1] + (rs[i] + rs[i + 1]) / 2 * (xs[i + 1] - xs[i]))
        return cls(xs, rs, tuple(cs))

    @property
    def total(self) -> float:
        """The requests expected in one day."""
        return self.cs[-1]

    def _segment(self, y: float) -> tuple[int, float]:
        """The knot at or before ``y`` (seconds into a day) and half the slope after it."""
        i = min(bisect_right(self.xs, y) - 1, len(self.xs) - 2)
        width = self.xs[i + 1] - self.xs[i]
        return i, (self.rs[i + 1] - self.rs[i]) / (2 * width) if width else 0.0

    def rate(self, x: float) -> float:
        y = x % DAY_S
        i, a = self._segment(y)
        return self.rs[i] + 2 * a * (y - self.xs[i])

    def at(self, x: float) -> float:
        days, y = divmod(x, DAY_S)
        i, a = self._segment(y)
        dy = y - self.xs[i]
        return days * self.total + self.cs[i] + self.rs[i] * dy + a * dy * dy

    def inverse(self, s: float) -> float:
        days, v = divmod(s, self.total)
        i = min(bisect_right(self.cs, v) - 1, len(self.cs) - 2)
        _, a = self._segment(self.xs[i])
        w, r0 = v - self.cs[i], self.rs[i]
        root = r0 + math.sqrt(max(0.0, r0 * r0 + 4 * a * w))
        dy = 2 * w / root if w > 0 and root > 0 else 0.0
        return days * DAY_S + self.xs[i] + min(dy, self.xs[i + 1] - self.xs[i])


@dataclass(frozen=True, slots=True)
class DayCurve:
    """A phase's stretch of a ``Cycle``: the phase starts ``anchor`` seconds into the
    day, and runs ``scale`` seconds per configured second (a rehearsal's cycle is compressed,
    its rates kept)."""

    cycle: Cycle
    anchor: float
    scale: float
    total: float
    base: float  # cycle.at(anchor)

    @classmethod
    def of(cls, cycle: Cycle, anchor: float, scale: float, seconds: float) -> DayCurve:
        base = cycle.at(anchor)
        return cls(cycle, anchor, scale, scale * (cycle.at(anchor + seconds / scale) - base), base)

    def at(self, t_s: float) -> float:
        return self.scale * (self.cycle.at(self.anchor + t_s / self.scale) - self.base)

    def rate(self, t_s: float) -> float:
        return self.cycle.rate(self.anchor + t_s / self.scale)

    def inverse(self, s: float) -> float:
        return (self.cycle.inverse(s / self.scale + self.base) - self.anchor) * self.scale
