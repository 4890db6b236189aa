"""Leak slopes: known answers on synthetic series (linear, noisy, a step, flat, spikes)."""

from __future__ import annotations

import random

import pytest

from soakd.measure.analysis import theil_sen
from soakd.probes.leak import LeakSlope

MB = 1e6
WINDOW = 3600.0


def feed(est: LeakSlope, values: list[tuple[float, float]]) -> float | None:
    for t, v in values:
        est.add(t, v)
    return est.slope_per_hour()


def series(fn, seconds: float = WINDOW, step: float = 1.0) -> list[tuple[float, float]]:
    n = int(seconds / step)
    return [(i * step, fn(i * step)) for i in range(n + 1)]


def test_theil_sen_exact_line() -> None:
    assert theil_sen([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert theil_sen([0], [5]) is None


def test_linear_growth_is_its_slope() -> None:
    # 50 MB/h on a 4 GB card's baseline
    slope = feed(LeakSlope(WINDOW), series(lambda t: 3e9 + 50 * MB * t / 3600))
    assert slope == pytest.approx(50 * MB, rel=1e-6)


def test_flat_is_zero() -> None:
    assert feed(LeakSlope(WINDOW), series(lambda t: 3.2e9)) == pytest.approx(0.0, abs=1e-6)


def test_noise_does_not_hide_or_fake_a_leak() -> None:
    rng = random.Random(7)
    # +-20 MB noise (an allocator breathing) around 10 MB/h of real growth
    noisy = series(lambda t: 3e9 + 10 * MB * t / 3600 + rng.gauss(0, 20 * MB))
    assert feed(LeakSlope(WINDOW), noisy) == pytest.approx(10 * MB, abs=2 * MB)
    flat = series(lambda t: 3e9 + rng.gauss(0, 20 * MB))
    assert feed(LeakSlope(WINDOW), flat) == pytest.approx(0.0, abs=2 * MB)


def test_spikes_are_ignored() -> None:
    rng = random.Random(1)

    def value(t: float) -> float:
        return 3e9 + (2e9 if rng.random() < 0.05 else 0.0)  # 5 % of readings spike by 2 GB

    assert feed(LeakSlope(WINDOW), series(value)) == pytest.approx(0.0, abs=1 * MB)


@pytest.mark.parametrize("at", [0.1, 0.25, 0.75, 0.9])
def test_step_away_from_the_middle_is_ignored(at: float) -> None:
    step = 500 * MB
    slope = feed(LeakSlope(WINDOW), series(lambda t: 3e9 + (step if t >= at * WINDOW else 0)))
    assert slope == pytest.approx(0.0, abs=1e-3)


def test_step_in_the_middle_is_bounded_by_its_spread() -> None:
    step = 500 * MB
    slope = feed(LeakSlope(WINDOW), series(lambda t: 3e9 + (step if t >= WINDOW / 2 else 0)))
    assert slope is not None
    assert 0 <= slope <= 1.1 * step / (WINDOW / 3600)


def test_staircase_reads_as_its_average_rise() -> None:
    # a caching allocator leaking 64 MB every 5 minutes: 768 MB/h
    slope = feed(LeakSlope(WINDOW), series(lambda t: 3e9 + 64 * MB * (t // 300)))
    assert slope == pytest.approx(768 * MB, rel=0.1)


def test_window_slides_and_memory_is_bounded() -> None:
    est = LeakSlope(600.0, points=60)
    # an hour of growth, then 10 minutes flat: only the last window counts
    feed(est, series(lambda t: 1e9 + 100 * MB * t / 3600, seconds=3600))
    slope = feed(est, [(3600 + t, 1e9 + 100 * MB) for t in range(1, 601)])
    assert slope == pytest.approx(0.0, abs=1e-3)
    assert est.points <= 60


def test_needs_a_few_points_then_resets() -> None:
    est = LeakSlope(60.0, points=60, min_points=6)
    assert feed(est, [(0, 1.0), (1, 2.0), (2, 3.0)]) is None
    assert feed(est, [(t, float(t + 1)) for t in range(3, 10)]) == pytest.approx(3600.0)
    est.reset()
    assert est.slope_per_hour() is None
    assert est.points == 0


def test_fill_ratio_says_how_much_of_the_window_the_readings_span() -> None:
    est = LeakSlope(window_s=3600.0)  # 120 buckets of 30 s
    assert est.fill_ratio == 0.0
    for t in range(0, 3 * 60 + 1):  # 3 minutes of readings, one a second
        est.add(float(t), 1e9)
    assert est.fill_ratio == pytest.approx(180 / 3600, abs=0.01)  # VramLeak waits for 0.8
    for t in range(181, 2 * 3600):
        est.add(float(t), 1e9)
    assert est.fill_ratio == 1.0  # a full window (older buckets dropped)
