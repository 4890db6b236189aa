"""Sliding window room: two running sums over the last ``span_s`` seconds, in fixed buckets.

Used by the send guard (requests and tokens in the last hour, for spend caps) and the
gateway's error-rate breaker (requests and failures in the last ``window``). Memory is
bounded by the bucket count, whatever the rate; a bucket leaves the window whole, so a sum
may count up to one bucket width too much, never less. Pure: the caller passes ``now``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal


class SlidingCount:
    """Two sums (``sums[0]``, ``sums[1]``) over the last ``span_s`` seconds, in ``buckets``
    buckets of ``span_s / buckets`` seconds; ``add``, ``totals`` and ``below_at`` prune."""

    def __init__(self, span_s: float, buckets: int) -> None:
        self.span_s = span_s
        self.width_s = span_s / buckets
        self._buckets: deque[list[float]] = deque()  # [start, first, second]
        self.sums = [0.0, 0.0]
        """As of the last prune (``add``, ``totals``, ``below_at``)."""

    def add(self, now: float, first: float = 0.0, second: float = 0.0) -> None:
        self._prune(now)
        start = math.floor(now / self.width_s) * self.width_s
        buckets = self._buckets
        if not buckets or buckets[-1][0] != start:
            buckets.append([start, 0.0, 0.0])
        bucket = buckets[-1]
        bucket[1] += first
        bucket[2] += second
        self.sums[0] += first
        self.sums[1] += second

    def totals(self, now: float) -> tuple[float, float]:
        self._prune(now)
        return self.sums[0], self.sums[1]

    def peek(self, now: float) -> tuple[float, float]:
        """``totals`` without pruning: safe to call from another thread (the exporter's)."""
        live = [b for b in list(self._buckets) if b[0] + self.width_s + self.span_s > now]
        return sum(b[1] for b in live), sum(b[2] for b in live)

    def below_at(self, now: float, cap: float, which: Literal[0, 1]) -> float:
        """The earliest instant at which sum ``which`` is below ``cap``, as old buckets leave
        the window (``now`` when it already is)."""
        self._prune(now)
        total = self.sums[which]
        for bucket in self._buckets:
            if total < cap:
                break
            total -= bucket[which + 1]
            now = max(now, bucket[0] + self.width_s + self.span_s)
        return now

    def clear(self) -> None:
        self._buckets.clear()
        self.sums = [0.0, 0.0]

    def __len__(self) -> int:
        """Buckets held (bounded by ``buckets`` + 1)."""
        return len(self._buckets)

    def _prune(self, now: float) -> None:
        buckets = self._buckets
        while buckets and buckets[0][0] + self.width_s + self.span_s <= now:
            _, first, second = buckets.popleft()
            self.sums[0] -= first
            self.sums[1] -= second
        if not buckets:
            self.sums = [0.0, 0.0]  # no float residue
