"""Analysis: pure statistics over outcomes (percentiles, windows, jitter, summaries). No IO.

Percentiles over days without keeping per-request lists: a log-bucketed histogram
(``Digest``) with 1 % relative precision and a fixed footprint, in the spirit of
HdrHistogram/DDSketch. Windowed views keep a ring of short digests.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter as CounterDict
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from soakd.model import OK, Outcome

_GAMMA = 1.02  # bucket width ratio: values are reported within +-1 % of the truth
_LOG_GAMMA = math.log(_GAMMA)
_MIN_NS = 1_000  # 1 us: anything faster is recorded as 1 us


def digest_key(value_ns: int) -> int:
    """The ``Digest`` bucket a duration falls in (the journal stores ITL gaps as these)."""
    return 0 if value_ns <= _MIN_NS else int(math.log(value_ns / _MIN_NS) / _LOG_GAMMA) + 1


def digest_counts(values: Iterable[int]) -> dict[int, int]:
    """How many of ``values`` fall in each ``Digest`` bucket (``digest_key``, inlined)."""
    counts: dict[int, int] = {}
    log, lg, lo = math.log, _LOG_GAMMA, _MIN_NS
    for v in values:
        k = 0 if v <= lo else int(log(v / lo) / lg) + 1
        counts[k] = counts.get(k, 0) + 1
    return counts


def digest_value(key: int) -> int:
    """A duration in the middle of bucket ``key``: ``digest_key(digest_value(k)) == k``."""
    return _MIN_NS if key == 0 else round(_MIN_NS * _GAMMA ** (key - 0.5))


class Digest:
    """Quantiles of nanosecond durations, +-1 % relative error, O(buckets) memory."""

    __slots__ = ("_buckets", "count", "max", "min", "total")

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0

    def add(self, value_ns: int) -> None:
        key = 0 if value_ns <= _MIN_NS else int(math.log(value_ns / _MIN_NS) / _LOG_GAMMA) + 1
        self._buckets[key] = self._buckets.get(key, 0) + 1
        if self.count == 0 or value_ns < self.min:
            self.min = value_ns
        if value_ns > self.max:
            self.max = value_ns
        self.count += 1
        self.total += value_ns

    def add_many(self, values: Sequence[int]) -> None:
        """``add`` for each value (one request's ITL gaps), without a call per value."""
        if not values:
            return
        buckets, log, lg = self._buckets, math.log, _LOG_GAMMA
        for v in values:
            key = 0 if v <= _MIN_NS else int(log(v / _MIN_NS) / lg) + 1
            buckets[key] = buckets.get(key, 0) + 1
        lo, hi = min(values), max(values)
        if self.count == 0 or lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi
        self.count += len(values)
        self.total += sum(values)

    def merge(self, other: Digest) -> None:
        for key, n in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + n
        if other.count:
            self.min = other.min if self.count == 0 else min(self.min, other.min)
            self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """The q-quantile in nanoseconds (None when empty); exact at min and max."""
        if self.count == 0:
            return None
        if q <= 0:
            return float(self.min)
        if q >= 1:
            return float(self.max)
        rank = q * (self.count - 1)
        seen = 0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen > rank:
                # the geometric middle of the bucket (lo, hi]
                value = float(_MIN_NS) if key == 0 else _MIN_NS * _GAMMA ** (key - 0.5)
                return min(max(value, float(self.min)), float(self.max))
        return float(self.max)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def to_state(self) -> list[int]:
        """``[count, total, min, max, key, n, key, n, ...]``: the journal stores digests."""
        flat = [self.count, self.total, self.min, self.max]
        for key in sorted(self._buckets):
            flat += (key, self._buckets[key])
        return flat

    @classmethod
    def from_state(cls, state: list[int]) -> Digest:
        d = cls()
        d.count, d.total, d.min, d.max = state[:4]
        d._buckets = dict(zip(state[4::2], state[5::2], strict=True))
        return d


@dataclass(slots=True)
class TargetStats:
    """Everything soakd keeps about one target: counts and digests, never lists."""

    requests: int = 0
    ok: int = 0
    errors: CounterDict[str] = field(default_factory=CounterDict)
    output_tokens: int = 0
    prompt_tokens: int = 0
    ttft: Digest = field(default_factory=Digest)
    e2e: Digest = field(default_factory=Digest)
    itl: Digest = field(default_factory=Digest)
    tpot: Digest = field(default_factory=Digest)
    lag: Digest = field(default_factory=Digest)

    def add(self, o: Outcome) -> None:
        self.requests += 1
        self.output_tokens += o.output_tokens
        self.prompt_tokens += o.prompt_tokens or 0
        if o.sent_ns:
            self.lag.add(o.dispatch_lag_ns)
        if o.error is not None:
            self.errors[o.error.value] += 1
            return
        self.ok += 1
        self.e2e.add(o.e2e_ns)
        ttft = o.ttft_ns
        if ttft is not None:
            self.ttft.add(ttft)
        tpot = o.tpot_ns
        if tpot is not None:
            self.tpot.add(tpot)
        self.itl.add_many(o.itl_ns)

    def merge(self, other: TargetStats) -> None:
        self.requests += other.requests
        self.ok += other.ok
        self.errors.update(other.errors)
        self.output_tokens += other.output_tokens
        self.prompt_tokens += other.prompt_tokens
        for name in ("ttft", "e2e", "itl", "tpot", "lag"):
            getattr(self, name).merge(getattr(other, name))

    @property
    def error_ratio(self) -> float:
        return (self.requests - self.ok) / self.requests if self.requests else 0.0


class Window:
    """Stats over the last ``span_s`` seconds, as a ring of one-second TargetStats.

    Memory is bounded by ``span_s`` slots whatever the request rate."""

    def __init__(self, span_s: int = 60) -> None:
        self.span_s = span_s
        self._slots: deque[tuple[int, TargetStats]] = deque()

    def add(self, o: Outcome, now_s: int) -> None:
        if not self._slots or self._slots[-1][0] != now_s:
            self._slots.append((now_s, TargetStats()))
            self._trim(now_s)
        self._slots[-1][1].add(o)

    def _trim(self, now_s: int) -> None:
        while self._slots and self._slots[0][0] <= now_s - self.span_s:
            self._slots.popleft()

    def snapshot(self, now_s: int) -> tuple[TargetStats, float]:
        """Merged stats of the window and the seconds it covers."""
        self._trim(now_s)
        merged = TargetStats()
        for _, stats in self._slots:
            merged.merge(stats)
        covered = (now_s - self._slots[0][0] + 1) if self._slots else 0
        return merged, float(max(1, min(covered, self.span_s)))


# --- P99 jitter: the one definition (docs/metrics.md; prometheus/rules/soakd-recording.yml) ---

JITTER_WINDOW_S = 3600.0
"""One jitter is measured over an hour ..."""
JITTER_SLICES = 12
"""... of twelve consecutive slices (5 minutes), one P99 each."""
JITTER_MIN_OK = 20
"""A slice's P99 counts only with this many successful requests in it."""
JITTER_MIN_SLICES = 3
"""Fewer counted slices in a window: no jitter."""


def slice_p99(stats: TargetStats) -> float | None:
    """The end-to-end P99 (ns) of one slice, or None below ``JITTER_MIN_OK`` successes."""
    return stats.e2e.quantile(0.99) if stats.e2e.count >= JITTER_MIN_OK else None


def jitter(p99s: Sequence[float]) -> float | None:
    """P99 jitter: the coefficient of variation (population standard deviation / mean) of
    the P99s of consecutive slices, normally the twelve 5-minute P99s of one hour. None
    with fewer than ``JITTER_MIN_SLICES`` P99s or a zero mean. The alert computes the same
    thing in PromQL (``stddev_over_time / avg_over_time`` of ``p99_5m[59m59s:5m]``)."""
    if len(p99s) < JITTER_MIN_SLICES:
        return None
    mean = statistics.fmean(p99s)
    return statistics.pstdev(p99s) / mean if mean > 0 else None


def worst_window_jitter(
    p99_by_slice: Mapping[int, float], slices_per_window: int = JITTER_SLICES
) -> tuple[float | None, int]:
    """The highest ``jitter`` of any window of ``slices_per_window`` consecutive slices
    (slice index // slices_per_window: whole hours of plan time for 5-minute slices), and
    the number of slice P99s used in all. The alert would have fired on that window."""
    windows: dict[int, list[float]] = {}
    for index in sorted(p99_by_slice):
        windows.setdefault(index // slices_per_window, []).append(p99_by_slice[index])
    values = [j for p99s in windows.values() if (j := jitter(p99s)) is not None]
    return (max(values) if values else None), len(p99_by_slice)


def ms(value_ns: float | None) -> float | None:
    return None if value_ns is None else value_ns / 1e6


def fmt_ms(value: float | None) -> str:
    """A duration given in ms, written the one way soakd writes latencies everywhere (live
    view, summary, reports): ms below a second with 3 significant digits, s above."""
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def summary_row(stats: TargetStats, seconds: float) -> dict[str, float | int | None]:
    """One target's headline numbers, as the live view, /status and the summary show them."""
    return {
        "requests": stats.requests,
        "ok": stats.ok,
        "errors": stats.requests - stats.ok,
        "error_ratio": stats.error_ratio,
        "rps": stats.requests / seconds if seconds > 0 else 0.0,
        "output_tps": stats.output_tokens / seconds if seconds > 0 else 0.0,
        "output_tokens": stats.output_tokens,
        "ttft_p50_ms": ms(stats.ttft.quantile(0.5)),
        "ttft_p99_ms": ms(stats.ttft.quantile(0.99)),
        "e2e_p50_ms": ms(stats.e2e.quantile(0.5)),
        "e2e_p99_ms": ms(stats.e2e.quantile(0.99)),
        "itl_p50_ms": ms(stats.itl.quantile(0.5)),
        "itl_p99_ms": ms(stats.itl.quantile(0.99)),
        "tpot_p50_ms": ms(stats.tpot.quantile(0.5)),
        "lag_p99_ms": ms(stats.lag.quantile(0.99)),
    }


__all__ = [
    "JITTER_MIN_OK",
    "JITTER_MIN_SLICES",
    "JITTER_SLICES",
    "JITTER_WINDOW_S",
    "OK",
    "Digest",
    "TargetStats",
    "Window",
    "fmt_ms",
    "jitter",
    "ms",
    "slice_p99",
    "summary_row",
    "worst_window_jitter",
]
