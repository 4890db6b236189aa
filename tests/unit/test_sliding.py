"""The one sliding-window counter: sums over the last span, bounded, and when a cap frees up."""

from __future__ import annotations

import pytest

from soakd.measure.sliding import SlidingCount


def test_sums_over_the_span_never_less() -> None:
    c = SlidingCount(span_s=60.0, buckets=6)  # 10 s buckets
    c.add(0.0, 1.0, 10.0)
    c.add(35.0, 2.0, 0.0)
    assert c.totals(59.0) == (3.0, 10.0)
    assert c.totals(69.9) == (3.0, 10.0)  # the first bucket still counts, up to 10 s more
    assert c.totals(70.0) == (2.0, 0.0)  # then it leaves whole
    assert c.peek(70.0) == (2.0, 0.0)
    assert c.totals(200.0) == (0.0, 0.0)
    assert len(c) == 0


def test_below_at_says_when_old_buckets_free_a_cap() -> None:
    c = SlidingCount(span_s=100.0, buckets=10)
    c.add(5.0, 3.0, 0.0)  # bucket [0, 10): leaves the window at 110
    c.add(25.0, 2.0, 7.0)  # bucket [20, 30): leaves at 130
    assert c.below_at(50.0, 10.0, 0) == 50.0  # 5 < 10 already
    assert c.below_at(50.0, 4.0, 0) == pytest.approx(110.0)  # 5 -> 2 when the first leaves
    assert c.below_at(50.0, 2.0, 0) == pytest.approx(130.0)
    assert c.below_at(50.0, 7.0, 1) == pytest.approx(130.0)  # the second sum


def test_clear_forgets_everything() -> None:
    c = SlidingCount(span_s=10.0, buckets=5)
    c.add(1.0, 4.0, 4.0)
    c.clear()
    assert c.sums == [0.0, 0.0]
    assert c.totals(1.0) == (0.0, 0.0)
