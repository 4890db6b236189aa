"""Streaming percentiles: within 1 % of the exact value, bounded memory."""

from __future__ import annotations

import random

import pytest

from soakd.analysis import Digest, TargetStats, Window
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
    o = Outcome("t", "p", 0, scheduled_ns=0, sent_ns=1_000_000, end_ns=1_000_000 + e2e_ms * 10**6,
                first_token_ns=2_000_000, output_tokens=10, error=error)
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
    assert stats.error_ratio == pytest.approx(0.1)


def test_window_forgets_old_seconds() -> None:
    window = Window(span_s=10)
    for second in range(100):
        window.add(outcome(100), second)
    stats, seconds = window.snapshot(99)
    assert stats.requests == 10
    assert seconds == 10
    stats, _ = window.snapshot(200)
    assert stats.requests == 0
