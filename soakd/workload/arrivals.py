"""Workload, arrivals: when to send. Pure, lazy iterators of send offsets (ns from a phase's start).

Lazy because a phase can be 72 h at 1000 req/s (2.6e8 instants): nothing is ever
listed. Offsets are absolute (not gaps), so the runner sleeps until ``start +
offset`` and a late wake-up never shifts the instants that follow it.

- ``constant``: evenly spaced, the first at 0.
- ``poisson``: exponential gaps (a homogeneous Poisson process), the first after one gap.
- ``ramp``: a Poisson process whose rate changes linearly from ``rate`` to
  ``rate_end`` over the phase. Built by time-rescaling: unit-rate Poisson points
  in "expected requests so far" space, mapped back through the exact inverse of
  the cumulative rate, so the instantaneous rate is right at every instant (not
  a staircase of constant steps). Random like ``poisson`` on purpose: a ramp
  looks for the rate where the server gives out, and real traffic bursts.

``closed`` (a fixed number of workers) and ``idle`` have no schedule: the runner
handles them, and asking for their arrivals is a bug (ValueError).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from soakd.model import LoadShape

NS = 1_000_000_000


def arrivals(shape: LoadShape, duration_ns: int, rng: random.Random) -> Iterator[int]:
    """Send offsets in ns from the phase start, increasing, all below ``duration_ns``."""
    if shape.mode == "constant":
        return _constant(shape.rate, duration_ns)
    if shape.mode == "poisson":
        return _poisson(shape.rate, duration_ns, rng)
    if shape.mode == "ramp":
        return _ramp(shape.rate, shape.rate_end, duration_ns, rng)
    raise ValueError(f"load mode {shape.mode!r} has no arrival schedule")


def expected_count(shape: LoadShape, duration_ns: int) -> float:
    """How many arrivals a phase should hold on average (for plan summaries and tests)."""
    seconds = max(0, duration_ns) / NS
    if shape.mode in ("constant", "poisson"):
        return shape.rate * seconds
    if shape.mode == "ramp":
        return (shape.rate + shape.rate_end) / 2 * seconds
    return 0.0


def _constant(rate: float, duration_ns: int) -> Iterator[int]:
    if rate <= 0:
        return
    gap = NS / rate
    k = 0
    # k * gap, not a running sum: no drift over 2.6e8 steps
    while (offset := int(k * gap)) < duration_ns:
        yield offset
        k += 1


def _poisson(rate: float, duration_ns: int, rng: random.Random) -> Iterator[int]:
    if rate <= 0:
        return
    expo = rng.expovariate
    lam = rate / NS  # per ns
    t = 0.0
    while True:
        t += expo(lam)
        if t >= duration_ns:
            return
        yield int(t)


def _ramp(rate: float, rate_end: float, duration_ns: int, rng: random.Random) -> Iterator[int]:
    """Time-rescaled Poisson. With rates r0 -> r1 over T seconds, the expected count
    by time t is L(t) = r0*t + a*t^2 with a = (r1 - r0) / (2T); a unit-rate Poisson
    point s maps to t = L^-1(s) = 2s / (r0 + sqrt(r0^2 + 4as)) (the root written so
    that it stays exact when a is 0 or negative)."""
    r0, r1 = max(0.0, rate), max(0.0, rate_end)
    total_s = duration_ns / NS
    if duration_ns <= 0 or (r0 <= 0 and r1 <= 0):
        return
    a4 = 4 * (r1 - r0) / (2 * total_s)
    r0_sq = r0 * r0
    expected = (r0 + r1) / 2 * total_s
    expo = rng.expovariate
    sqrt = math.sqrt
    s = 0.0
    while True:
        s += expo(1.0)
        if s >= expected:
            return
        offset = int(2 * s / (r0 + sqrt(max(0.0, r0_sq + a4 * s))) * NS)
        if offset >= duration_ns:  # float rounding at the very end
            return
        yield offset
