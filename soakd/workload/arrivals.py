"""Workload, arrivals: when to send. Pure, lazy iterators of send offsets (ns from a phase's start).

Lazy because a phase can be 72 h at 1000 req/s (2.6e8 instants): nothing is ever
listed. Offsets are absolute (not gaps), so the runner sleeps until ``start +
offset`` and a late wake-up never shifts the instants that follow it.

- ``constant``: evenly spaced, the first at 0.
- ``poisson``: exponential gaps (a homogeneous Poisson process), the first after one gap.
- ``ramp``: a Poisson process whose rate changes linearly from ``rate`` to
  ``rate_end`` over the phase. Built by time-rescaling: unit-rate Poisson points
  in "expected requests so far" space, mapped back through the exact inverse of
  the cumulative rate (``curves.Curve``), so the instantaneous rate is right at
  every instant (not a staircase of constant steps).
- ``daily``: the same, through a daily cycle's cumulative rate (``curves.DayCurve``); with
  ``arrival: constant`` the points are 0, 1, 2... in that space (evenly spaced in expected
  requests, so closer together where the rate is high).
- ``trace``: the trace's own instants, scaled and looped (``TraceArrivals``).

``closed`` (a fixed number of workers) and ``idle`` have no schedule: the runner
handles them, and asking for their arrivals is a bug (TypeError).
"""

from __future__ import annotations

import math
import random

from soakd.model import NS_PER_S
from soakd.shapes import Curve, LoadShape, OpenLoad, Trace


def arrivals(shape: LoadShape, duration_ns: int, rng: random.Random) -> Arrivals | TraceArrivals:
    """Send offsets in ns from the phase start, increasing, all below ``duration_ns``."""
    if isinstance(shape, Trace):
        return TraceArrivals(shape, duration_ns)
    if not isinstance(shape, OpenLoad):
        raise TypeError(f"load mode {shape.mode!r} has no arrival schedule")
    return Arrivals(shape, duration_ns, rng)


class Arrivals:
    """The instants of one phase, lazily; ``skip_to`` drops those before an offset.

    Every shape is a sequence of points in "expected requests so far" space, s = L(t),
    mapped back through the inverse of the cumulative rate L (the shape's ``Curve``):
    constant is s = 0, 1, 2...; poisson and ramp add an Exp(1) gap each time. Skipping is
    what lets a driver that fell far behind (a rate soakd cannot send) jump to the present
    in one step instead of walking through the instants it can no longer make: for
    constant the count is exact, for the random shapes it is drawn (the count of a Poisson
    process in an interval is Poisson(L(b) - L(a)), and the process is memoryless after
    it)."""

    __slots__ = (
        "_curve",
        "_done",
        "_duration",
        "_expected",
        "_gap",
        "_k",
        "_k_end",
        "_rng",
        "_s",
        "_spaced",
    )

    def __init__(self, shape: OpenLoad, duration_ns: int, rng: random.Random) -> None:
        self._duration = duration_ns
        self._rng = rng
        self._s = 0.0  # the last point (random shapes)
        self._k = 0  # the next index (constant)
        self._curve = curve = shape.curve(max(0, duration_ns) / NS_PER_S)
        self._expected = curve.total
        self._done = duration_ns <= 0 or self._expected <= 0
        flat = isinstance(curve, Curve) and curve.a == 0.0 and curve.r0 > 0
        self._gap = NS_PER_S / curve.rate(0.0) if shape.spaced and flat else 0.0
        self._spaced = shape.spaced  # and not flat: points 0, 1, 2... through the inverse
        self._k_end = self._first_k(duration_ns) if self._spaced and not self._done else 0

    def __iter__(self) -> Arrivals:
        return self

    def __next__(self) -> int:
        if self._done:
            raise StopIteration
        if self._spaced:
            # k * gap, not a running sum: no drift over 2.6e8 steps
            if self._k >= self._k_end:
                self._done = True
                raise StopIteration
            offset = self._instant(self._k)
            self._k += 1
            return offset
        self._s += self._rng.expovariate(1.0)
        if self._s >= self._expected:
            self._done = True
            raise StopIteration
        offset = int(self._curve.inverse(self._s) * NS_PER_S)
        if offset >= self._duration:  # float rounding at the very end
            self._done = True
            raise StopIteration
        return offset

    def skip_to(self, offset_ns: int) -> int:
        """Drop the instants before ``offset_ns``; how many there were (for the random
        shapes, a draw with the right distribution)."""
        if self._done:
            return 0
        if self._spaced:
            k = min(self._k_end, max(self._k, self._first_k(offset_ns)))
            skipped, self._k = k - self._k, k
            return skipped
        target = min(self._expected, self._curve.at(min(offset_ns, self._duration) / NS_PER_S))
        if target <= self._s:
            return 0
        skipped = poisson_count(target - self._s, self._rng)
        self._s = target
        if target >= self._expected:
            self._done = True
        return skipped

    def _instant(self, k: int) -> int:
        """Point k of an evenly spaced schedule: k * gap, or the inverse of s = k."""
        if self._gap:
            return int(k * self._gap)
        return int(self._curve.inverse(float(k)) * NS_PER_S)

    def _first_k(self, offset_ns: int) -> int:
        """The smallest k whose instant is at or after ``offset_ns`` (an evenly spaced
        schedule: the instants of k below ``_k_end``)."""
        if self._gap:
            k = max(0, math.ceil(offset_ns / self._gap) - 1)
        else:
            k = max(0, math.ceil(self._curve.at(offset_ns / NS_PER_S)) - 1)
        while self._instant(k) < offset_ns:
            k += 1
        while k > 0 and self._instant(k - 1) >= offset_ns:
            k -= 1
        return k


class TraceArrivals:
    """A trace's instants in one phase (``Trace.instant``), lazily; ``skip_to`` is exact
    (``Trace.count_before``: a bisection)."""

    __slots__ = ("_end", "_k", "_shape")

    def __init__(self, shape: Trace, duration_ns: int) -> None:
        self._shape = shape
        self._k = 0
        self._end = shape.count_before(duration_ns)  # the instants below the phase's end

    def __iter__(self) -> TraceArrivals:
        return self

    def __next__(self) -> int:
        if self._k >= self._end:
            raise StopIteration
        self._k += 1
        return self._shape.instant(self._k - 1)

    def skip_to(self, offset_ns: int) -> int:
        """Drop the instants before ``offset_ns``; how many there were."""
        k = min(self._end, max(self._k, self._shape.count_before(offset_ns)))
        skipped, self._k = k - self._k, k
        return skipped


def poisson_count(mean: float, rng: random.Random) -> int:
    """A Poisson(mean) draw: Knuth's product of uniforms for small means, the normal
    approximation above 30 (its error there is far below the count's own spread)."""
    if mean <= 0:
        return 0
    if mean < 30:
        limit, k, p = math.exp(-mean), 0, rng.random()
        while p > limit:
            k += 1
            p *= rng.random()
        return k
    return max(0, round(rng.gauss(mean, math.sqrt(mean))))
