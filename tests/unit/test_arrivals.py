"""Arrival schedules: right rate, right randomness, inside the phase, reproducible."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from soakd.shapes import Constant, LoadShape, Poisson, Ramp, shape_of
from soakd.workload.arrivals import arrivals

NS = 1_000_000_000


def offsets(shape: LoadShape, seconds: float, seed: int = 1) -> list[int]:
    return list(arrivals(shape, int(seconds * NS), random.Random(seed)))


def gaps(times: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(times)]


def cv(values: list[int]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


@pytest.mark.parametrize(
    "shape",
    [
        Constant(rate=50),
        Poisson(rate=50),
        Ramp(rate=10, rate_end=90),
        Ramp(rate=90, rate_end=10),
        Ramp(rate=0, rate_end=100),
    ],
    ids=lambda s: s.describe(),
)
def test_achieved_rate_matches_target(shape: LoadShape) -> None:
    seconds = 2000.0
    expected = shape.expected(int(seconds * NS))  # 100,000
    got = len(offsets(shape, seconds))
    # Poisson counts: stddev is sqrt(expected), ~316 here; 1.5% is ~5 sigma
    assert got == pytest.approx(expected, rel=0.015)


@pytest.mark.parametrize(
    "shape",
    [Constant(rate=7), Poisson(rate=7), Ramp(rate=0, rate_end=7)],
    ids=lambda s: s.mode,
)
def test_increasing_and_inside_the_phase(shape: LoadShape) -> None:
    duration_ns = 100 * NS + 123
    for seed in range(20):
        times = list(arrivals(shape, duration_ns, random.Random(seed)))
        assert times, seed
        assert times == sorted(times)
        assert times[0] >= 0
        assert times[-1] < duration_ns


def test_constant_is_evenly_spaced() -> None:
    times = offsets(Constant(rate=1000), 10)
    assert times[0] == 0
    assert len(times) == 10_000
    assert set(gaps(times)) <= {999_999, 1_000_000, 1_000_001}
    assert cv(gaps(times)) < 1e-3


def test_constant_does_not_drift_over_a_long_phase() -> None:
    # 3 req/s has a gap that is not a whole number of ns; the 1,000,000th instant
    # must still sit where k / rate says, not where a running sum wandered to
    shape = Constant(rate=3)
    times = arrivals(shape, 400_000 * NS, random.Random(0))
    millionth = next(itertools.islice(times, 1_000_000, None))
    assert abs(millionth - 1_000_000 * NS / 3) <= 1


def test_poisson_gaps_are_exponential() -> None:
    times = offsets(Poisson(rate=100), 1000)
    g = gaps(times)
    assert cv(g) == pytest.approx(1.0, abs=0.02)
    assert statistics.fmean(g) == pytest.approx(NS / 100, rel=0.02)
    # memoryless: P(gap > mean) = 1/e
    above = sum(x > NS / 100 for x in g) / len(g)
    assert above == pytest.approx(math.exp(-1), abs=0.01)


@pytest.mark.parametrize(("r0", "r1"), [(10, 90), (90, 10), (0, 100), (40, 40)])
def test_ramp_follows_the_rate_integral(r0: float, r1: float) -> None:
    seconds = 2000.0
    times = offsets(Ramp(rate=r0, rate_end=r1), seconds)
    half_ns = seconds / 2 * NS
    first = sum(t < half_ns for t in times)
    second = len(times) - first
    mid = (r0 + r1) / 2
    assert first == pytest.approx((r0 + mid) / 2 * seconds / 2, rel=0.03)
    assert second == pytest.approx((mid + r1) / 2 * seconds / 2, rel=0.03)
    # the instantaneous rate in ten slices, not just the halves
    for k in range(10):
        lo, hi = k * seconds / 10, (k + 1) * seconds / 10
        in_slice = sum(lo * NS <= t < hi * NS for t in times)
        centre = r0 + (r1 - r0) * (k + 0.5) / 10
        assert in_slice == pytest.approx(centre * seconds / 10, rel=0.1, abs=40)


def test_ramp_gaps_are_poisson_like() -> None:
    # locally a ramp is a Poisson process: over a short window its CV is about 1
    times = offsets(Ramp(rate=200, rate_end=210), 500)
    assert cv(gaps(times)) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize(
    "shape",
    [Poisson(rate=20), Ramp(rate=5, rate_end=50)],
    ids=lambda s: s.mode,
)
def test_same_seed_same_schedule(shape: LoadShape) -> None:
    assert offsets(shape, 100, seed=42) == offsets(shape, 100, seed=42)
    assert offsets(shape, 100, seed=42) != offsets(shape, 100, seed=43)


def test_lazy_for_a_72h_phase() -> None:
    # 1000 req/s for 72 h is 2.6e8 instants: taking a few must not build them all
    for mode in ("constant", "poisson"):
        it = arrivals(shape_of(mode, rate=1000), 72 * 3600 * NS, random.Random(0))
        assert len(list(itertools.islice(it, 5))) == 5
    it = arrivals(Ramp(rate=1, rate_end=1000), 72 * 3600 * NS, random.Random(0))
    assert len(list(itertools.islice(it, 5))) == 5


def test_empty_cases() -> None:
    assert offsets(Constant(rate=10), 0) == []
    assert offsets(Poisson(rate=10), 0) == []
    assert offsets(Ramp(rate=0, rate_end=0), 10) == []
    assert offsets(Ramp(rate=10, rate_end=20), 0) == []


@pytest.mark.parametrize("mode", ["closed", "idle"])
def test_modes_without_a_schedule_refuse(mode: str) -> None:
    with pytest.raises(TypeError, match="no arrival schedule"):
        arrivals(shape_of(mode, concurrency=2), NS, random.Random(0))
