"""Streaming percentiles: within 1 % of the exact value, bounded memory."""

from __future__ import annotations

import random

import pytest

from soakd.measure.analysis import Digest, TargetStats, Window, jitter, worst_window_jitter
from soakd.model import ErrorKind, Outcome


def exact(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_digest_quantiles_within_one_percent(seed: int) -> None:
    rng = random.Random(seed)
    values = [int(rng.lognormvariate(18, 1.2)) for _ in range(20_000)]  # ~65 ms median
    digest = Digest()
    for v in values:
        digest.add(v)
    for q in (0.5, 0.9, 0.99, 0.999):
        got = digest.quantile(q)
        assert got is not None
        assert got == pytest.approx(exact(values, q), rel=0.011)
    assert digest.quantile(0.0) == min(values)
    assert digest.quantile(1.0) == max(values)
    assert digest.count == len(values)


def test_digest_memory_is_bounded() -> None:
    digest = Digest()
    for v in range(1, 2_000_000, 7):
        digest.add(v * 1000)
    assert len(digest._buckets) < 1000


def test_digest_merge_equals_single() -> None:
    a, b, both = Digest(), Digest(), Digest()
    for i in range(1, 5000):
        (a if i % 2 else b).add(i * 10_000)
        both.add(i * 10_000)
    a.merge(b)
    assert a.count == both.count
    assert a.quantile(0.99) == both.quantile(0.99)
    assert Digest().quantile(0.5) is None


def outcome(e2e_ms: int, error: ErrorKind | None = None) -> Outcome:
    o = Outcome(
        "t",
        "p",
        0,
        scheduled_ns=0,
        sent_ns=1_000_000,
        end_ns=1_000_000 + e2e_ms * 10**6,
        first_token_ns=2_000_000,
        output_tokens=10,
        error=error,
    )
    return o


def test_target_stats_counts_errors_apart() -> None:
    stats = TargetStats()
    for _ in range(9):
        stats.add(outcome(100))
    stats.add(outcome(5, ErrorKind.HTTP_5XX))
    assert stats.requests == 10
    assert stats.ok == 9
    assert stats.errors == {"http_5xx": 1}
    assert stats.e2e.count == 9


def test_window_forgets_old_seconds() -> None:
    window = Window(span_s=10)
    for second in range(100):
        window.add(outcome(100), second)
    stats, seconds = window.snapshot(99)
    assert stats.requests == 10
    assert seconds == 10
    stats, _ = window.snapshot(200)
    assert stats.requests == 0


# --- P99 jitter: the same numbers as prometheus/tests/jitter.yml -----------------------------


def test_jitter_is_the_coefficient_of_variation_of_the_hours_twelve_p99s() -> None:
    # six 5-minute P99s at 1 s and six at 1.36 s: the hour promtool's test feeds the rule
    assert jitter([1.0] * 6 + [1.36] * 6) == pytest.approx(0.1525, abs=5e-5)  # above 0.15
    assert jitter([1.0] * 6 + [1.35] * 6) == pytest.approx(0.1489, abs=5e-5)  # just below
    assert jitter([1.0, 2.0]) is None  # fewer than 3 slices: no jitter
    assert jitter([0.0, 0.0, 0.0]) is None


def test_the_report_shows_the_worst_hour() -> None:
    steady = {i: 1.0 for i in range(12)}  # hour 0: flat
    wobbly = {12 + i: (1.0 if i < 6 else 1.36) for i in range(12)}  # hour 1: 15.25 %
    sparse = {24: 1.0, 25: 5.0}  # hour 2: two slices only, no jitter
    value, used = worst_window_jitter({**steady, **wobbly, **sparse})
    assert value == pytest.approx(0.1525, abs=5e-5)
    assert used == 26
    assert worst_window_jitter({}) == (None, 0)
