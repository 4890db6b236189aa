"""Analysis: pure statistics over outcomes and samples. No IO.

Percentiles over days without keeping per-request lists: a log-bucketed histogram
(``Digest``) with 1 % relative precision and a fixed footprint, in the spirit of
HdrHistogram/DDSketch. Windowed views keep a ring of short digests. Beside them, the
figures the report derives (docs/journal.md has the definitions): P99 jitter, the leak
slope of a memory series, which target is best on a metric, and whose energy a GPU's
joules are. The live view, ``/status`` and ``summary.json`` share one typed row
(``SummaryRow``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter as CounterDict
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict, cast

from soakd.measure.goodput import classify, error_counts
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


def itl_keys(o: Outcome) -> dict[int, int]:
    """``o``'s ITL gaps by ``Digest`` bucket, computed once per outcome (every reader that
    keeps a digest of ITL, the journal's compact codec among them, shares it)."""
    keys = o.itl_keys
    if keys is None:
        keys = o.itl_keys = digest_counts(o.itl_ns)
    return keys


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

    def add_counts(self, counts: Mapping[int, int], values: Sequence[int]) -> None:
        """Add ``values`` (one request's ITL gaps) whose buckets are already counted
        (``itl_keys``): no logarithm per value here."""
        if not values:
            return
        buckets = self._buckets
        for key, n in counts.items():
            buckets[key] = buckets.get(key, 0) + n
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
        self.output_tokens += o.output_tokens or 0  # None: unknown, not counted
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
        if o.itl_ns:
            self.itl.add_counts(itl_keys(o), o.itl_ns)

    def merge(self, other: TargetStats) -> None:
        self.requests += other.requests
        self.ok += other.ok
        self.errors.update(other.errors)
        self.output_tokens += other.output_tokens
        self.prompt_tokens += other.prompt_tokens
        for name in DIGESTS:
            getattr(self, name).merge(getattr(other, name))

    def to_state(self) -> dict[str, object]:
        """Plain JSON (the journal's rollups, the writer process's folds)."""
        return {
            "requests": self.requests,
            "ok": self.ok,
            "errors": dict(self.errors),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "digests": {name: getattr(self, name).to_state() for name in DIGESTS},
        }

    @classmethod
    def from_state(cls, doc: Mapping[str, object]) -> TargetStats:
        stats = cls(
            requests=cast("int", doc["requests"]),
            ok=cast("int", doc["ok"]),
            output_tokens=cast("int", doc["output_tokens"]),
            prompt_tokens=cast("int", doc["prompt_tokens"]),
        )
        stats.errors.update(cast("dict[str, int]", doc["errors"]))
        for name, state in cast("dict[str, list[int]]", doc["digests"]).items():
            setattr(stats, name, Digest.from_state(state))
        return stats


DIGESTS = ("ttft", "e2e", "itl", "tpot", "lag")
"""The digests of a ``TargetStats``."""


class Window:
    """Stats over the last ``span_s`` seconds, as a ring of one-second TargetStats.

    Memory is bounded by ``span_s`` slots whatever the request rate."""

    def __init__(self, span_s: int = 60) -> None:
        self.span_s = span_s
        self._slots: deque[tuple[int, TargetStats]] = deque()

    def add(self, o: Outcome, now_s: int) -> None:
        self._slot(now_s).add(o)

    def add_stats(self, stats: TargetStats, now_s: int) -> None:
        """Many outcomes at once (a batch's fold), counted in the second ``now_s``."""
        self._slot(now_s).merge(stats)

    def _slot(self, now_s: int) -> TargetStats:
        if not self._slots or self._slots[-1][0] != now_s:
            self._slots.append((now_s, TargetStats()))
            self._trim(now_s)
        return self._slots[-1][1]

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


class Quantiles(TypedDict, total=False):
    """One latency's percentiles in ms (None: no successful request): a report row's
    ``latency_ms[kind]``."""

    p50: float | None
    p95: float | None
    p99: float | None


def quantile_of(q: Quantiles, name: str) -> float | None:
    """``q``'s percentile ``name`` ("p50", "p95", "p99"; None when absent), for a name read
    from a key ("e2e.p99", "ttft_p99")."""
    return cast("Mapping[str, float | None]", q).get(name)


class SummaryRow(TypedDict):
    """One target's headline numbers (``summary_row``): the live view, ``/status``'s
    ``targets`` and ``summary.json``'s ``targets``; latencies in ms, None: no success.
    ``errors`` and the ratios count as the report does (soakd/measure/goodput.py): requests =
    ok + errors + shed + not_judged; ``rps`` counts successes, ``attempt_rps`` every send."""

    requests: int
    ok: int
    errors: int
    error_ratio: float | None
    rps: float
    output_tps: float
    output_tokens: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_p50_ms: float | None
    lag_p99_ms: float | None
    server_error_ratio: float | None
    not_judged: int
    attempt_rps: float
    top_error: str | None  # the most frequent error kind (None: no error)


class RecentRow(SummaryRow):
    """``/status`` and the live view: the last minute, with its goodput (goodput.py)."""

    goodput: float | None
    goodput_rps: float | None


class SessionRow(SummaryRow):
    """``summary.json`` and the end of ``soakd run``: the session, what was offered against
    sent (``missed``: sends not made, by reason) and, once the run is over, its goodput."""

    offered: int
    missed: int
    missed_by_reason: dict[str, int]
    shed: int
    errors_by_kind: dict[str, int]
    goodput: NotRequired[float | None]
    goodput_rps: NotRequired[float]
    # started, finished, ended early by reason (workload.conversations: soakd/workload/talks.py)
    conversations: NotRequired[dict[str, object]]


def summary_row(stats: TargetStats, seconds: float) -> SummaryRow:
    """One target's headline numbers, as the live view, /status and the summary show them."""
    counted = error_counts(stats.requests, stats.errors)
    failures = {k: n for k, n in stats.errors.items() if classify(k) == "error" and n}
    return {
        "requests": stats.requests,
        "ok": stats.ok,
        "errors": counted.failed,
        "error_ratio": counted.error_ratio,
        "rps": stats.ok / seconds if seconds > 0 else 0.0,
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
        "server_error_ratio": counted.server_error_ratio,
        "not_judged": counted.excluded,
        "attempt_rps": stats.requests / seconds if seconds > 0 else 0.0,
        "top_error": max(failures, key=lambda k: (failures[k], k)) if failures else None,
    }


# --- leak slope: a memory series' growth over plan time -------------------------------------

HOUR_S = 3600.0
LEAK_POINTS = 120
"""A series is averaged into at most this many time bins before the slope is taken."""
LEAK_MIN_SPAN_S = 1800.0
"""A memory slope over less than this is no finding: a load step in a 3-minute rehearsal
extrapolates to gigabytes an hour. Shorter series say "too short to tell"."""
TOO_SHORT = "too short to tell"


def theil_sen(ts: Sequence[float], vs: Sequence[float]) -> float | None:
    """Median of the pairwise slopes (value units per time unit); None with < 2 points."""
    n = len(ts)
    slopes = [
        (vs[j] - vs[i]) / (ts[j] - ts[i])
        for i in range(n)
        for j in range(i + 1, n)
        if ts[j] != ts[i]
    ]
    return statistics.median(slopes) if slopes else None


def leak_note(points: Sequence[tuple[float, float]]) -> str | None:
    """Why a series gives no slope although it has samples (None: it gives one, or has none)."""
    if len(points) < 2:
        return None
    span = max(t for t, _ in points) - min(t for t, _ in points)
    return TOO_SHORT if span < LEAK_MIN_SPAN_S else None


def leak_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Theil-Sen slope in units per hour of ``(seconds, value)`` points, on at most
    ``LEAK_POINTS`` bin means; None under six samples or under ``LEAK_MIN_SPAN_S``."""
    if len(points) < 6:
        return None
    pts = sorted(points)
    span = pts[-1][0] - pts[0][0]
    if span < LEAK_MIN_SPAN_S:
        return None
    width = span / LEAK_POINTS
    bins: dict[int, list[tuple[float, float]]] = {}
    for t, v in pts:
        bins.setdefault(min(LEAK_POINTS - 1, int((t - pts[0][0]) / width)), []).append((t, v))
    ts = [statistics.fmean(t for t, _ in b) for b in bins.values()]
    vs = [statistics.fmean(v for _, v in b) for b in bins.values()]
    slope = theil_sen(ts, vs)
    return None if slope is None else slope * HOUR_S


# --- best: which target wins a metric ---------------------------------------------------------

LATENCY_TIE = 0.02
"""Percentiles closer than this (relative) are a tie: each digest is within ~1 %."""


def best_of(
    values: Mapping[str, float], better: Literal["min", "max"], tie: float = 0.0
) -> list[str]:
    """The names holding the better value; none when fewer than two differ, or when the
    runner-up is within ``tie`` (relative) of it."""
    if len(values) < 2 or len(set(values.values())) < 2:
        return []
    ranked = sorted(values.values(), reverse=better == "max")
    pick, runner_up = ranked[0], ranked[1]
    if tie and abs(runner_up - pick) <= tie * max(abs(pick), 1e-12):
        return []
    return [name for name, v in values.items() if v == pick]


# --- energy: whose joules a GPU's are ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuEnergy:
    """One GPU's energy: the targets charged with it, in all and per phase (joules)."""

    gpu: str
    targets: Sequence[str]
    joules: float | None  # None: not measured
    by_phase: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class EnergyShare:
    joules: float
    shared: bool  # the GPUs also serve other targets: tokens per joule is theirs together
    tokens_per_joule: float | None


def energy_share(
    target: str, gpus: Sequence[GpuEnergy], output_tokens: Mapping[str, int], phase: str | None
) -> EnergyShare | None:
    """The energy of the measured GPUs charged to ``target`` over the run (``phase`` None)
    or one phase, against the output tokens (by target, same span) of every target those
    GPUs serve. None: no measured GPU is charged to it."""
    mine = [g for g in gpus if target in g.targets and g.joules is not None]
    if not mine:
        return None
    sharers = sorted({t for g in mine for t in g.targets})
    if phase is None:
        joules = sum(g.joules or 0.0 for g in mine)
    else:
        joules = sum(g.by_phase.get(phase, 0.0) for g in mine)
    tokens = sum(output_tokens[t] for t in sharers)
    return EnergyShare(joules, len(sharers) > 1, tokens / joules if joules > 0 else None)


__all__ = [
    "JITTER_MIN_OK",
    "JITTER_MIN_SLICES",
    "JITTER_SLICES",
    "JITTER_WINDOW_S",
    "LATENCY_TIE",
    "LEAK_MIN_SPAN_S",
    "LEAK_POINTS",
    "OK",
    "TOO_SHORT",
    "Digest",
    "EnergyShare",
    "GpuEnergy",
    "Quantiles",
    "RecentRow",
    "SessionRow",
    "SummaryRow",
    "TargetStats",
    "Window",
    "best_of",
    "energy_share",
    "fmt_ms",
    "jitter",
    "leak_note",
    "leak_slope",
    "ms",
    "quantile_of",
    "slice_p99",
    "summary_row",
    "theil_sen",
    "worst_window_jitter",
]
