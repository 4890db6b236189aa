"""Buckets room: Prometheus histogram buckets counted outside prometheus_client, and added
back to a live histogram on resume, through its public ``collect()`` only.

The journal counts every latency it commits into the same buckets as ``Metrics``'
histograms (``observe``, ``add_hist``); a resumed run continues from those counts with
``WithBase``, a collector that yields the live histogram's families with the journal's
base added to each bucket, the count and the sum, as client_python's own custom collectors
build families at scrape time. prometheus_client has no public way to set a histogram,
and writing its private ``_buckets``/``_sum`` would break quietly with a library upgrade.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Hist = tuple[list[int], float]
"""Count per bucket (not cumulative; +Inf last) and the sum of the observed values."""
LabelKey = tuple[tuple[str, str], ...]
"""A child's labels, sorted, without ``le``."""


class Family(Protocol):
    """What ``WithBase`` wraps: a ``Histogram`` or a ``BucketHistogram``."""

    def describe(self) -> Iterable[Metric]: ...
    def collect(self) -> Iterable[Metric]: ...


def observe(
    hists: dict[tuple[str, str], Hist],
    key: tuple[str, str],
    bounds: Sequence[float],
    values: list[float],
) -> None:
    """Count ``values`` (sorted when more than one) into ``hists[key]``, as prometheus_client
    does: into the first bucket whose bound is >= the value."""
    entry = hists.get(key)
    counts, total = entry if entry is not None else ([0] * (len(bounds) + 1), 0.0)
    if len(values) == 1:
        counts[bisect.bisect_left(bounds, values[0])] += 1
    else:
        count_sorted(counts, bounds, values)
    hists[key] = (counts, total + sum(values))


def count_sorted(counts: list[int], bounds: Sequence[float], values: Sequence[float]) -> None:
    """Add sorted ``values`` to per-bucket ``counts`` (+Inf last): one bisect a bucket, each
    value in the first bucket whose bound is >= it, as prometheus_client counts."""
    below = 0
    for i, bound in enumerate(bounds):
        upto = bisect.bisect_right(values, bound, below)
        counts[i] += upto - below
        below = upto
    counts[-1] += len(values) - below


def add_hist(base: Hist | None, counts: list[int], total: float) -> Hist:
    """``base`` plus more counts and sum (a new value; ``base`` is not changed)."""
    if base is None:
        return list(counts), total
    return [a + b for a, b in zip(base[0], counts, strict=True)], base[1] + total


def _label_key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


EXEMPLAR_EVERY_NS = 1_000_000_000
"""A histogram bucket's exemplar is replaced at most this often."""


class ExemplarClock:
    """When a histogram bucket's exemplar is due: at most once a second per bucket.

    client_python keeps the latest exemplar of each bucket and Prometheus reads it once per
    scrape (1 s in the shipped config): replacing it more often is never seen. Building
    one per observation (the trace id's hash, client_python's label checks) cost the hot
    path about a tenth of its time. A bucket that is rarely hit, the slow requests' one,
    still gets the exemplar of every request that lands in it more than a second apart."""

    __slots__ = ("_bounds", "_last")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = tuple(bounds)
        self._last = [-EXEMPLAR_EVERY_NS] * (len(self._bounds) + 1)

    def due(self, value: float, now_ns: int) -> bool:
        """True (and the bucket's clock restarted) when ``value``'s bucket may take a new
        exemplar at ``now_ns`` (monotonic); its bucket as client_python picks it."""
        i = bisect.bisect_left(self._bounds, value)
        if now_ns - self._last[i] < EXEMPLAR_EVERY_NS:
            return False
        self._last[i] = now_ns
        return True


class BucketChild:
    """One label set of a ``BucketHistogram``: counts per bucket and the sum, no lock."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; +Inf last
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.total += value

    def observe_ns(self, values_ns: Sequence[int]) -> None:
        """Many values in nanoseconds, counted in seconds (the journal's rounding:
        ``ns * 1e-9``, then the first bucket whose bound is >= it). A long answer's gaps
        are sorted once (in C) and counted with one bisect a bucket, not one a gap."""
        counts, bounds, where = self.counts, self._bounds, bisect.bisect_left
        n = len(values_ns)
        if n > 2 * len(bounds):
            values = [ns * 1e-9 for ns in values_ns]
            self.total += sum(values)
            values.sort()
            count_sorted(counts, bounds, values)
            return
        total = 0.0
        for ns in values_ns:
            v = ns * 1e-9
            counts[where(bounds, v)] += 1
            total += v
        self.total += total


class BucketHistogram(Collector):
    """A Prometheus histogram counted here, for a series observed once per streamed token.

    prometheus_client's ``Histogram.observe`` takes a lock and walks the buckets in Python:
    ~3 µs a value, 1.5 ms of event-loop time for one 512-token answer's gaps, every token
    read meanwhile stamped late. Here a value is one ``bisect`` and an add (~0.2 µs), with
    no lock: the run loop is the only writer; a scrape (the exporter's thread) copies the
    counts, so it may miss a value being added, never see counts go down. Exposition is
    the same as a ``Histogram``'s (``_bucket`` with ``le``, ``_count``, ``_sum``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        # the `le` strings prometheus_client's Histogram writes ("0.001", "1.0", "+Inf")
        self._les = [floatToGoString(b) for b in (*self.bounds, math.inf)]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], BucketChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> BucketChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {self.labelnames}, got {values}")
            child = self._children[values] = BucketChild(self.bounds)
        return child

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            total, counts = child.total, list(child.counts)
            cumulative = list(zip(self._les, itertools.accumulate(counts), strict=True))
            family.add_metric(list(values), cumulative, total)
        return [family]


class WithBase:
    """Collector: a live Histogram's families with a base added per child.

    Each ``_bucket`` sample gains the base's cumulative count up to its ``le``, ``_count``
    the base's count and ``_sum`` its sum; ``_created`` and children with no base pass
    unchanged. The Histogram goes on observing as before; only its registration moves
    (``restore_histogram``). The bases are fitted before the collector is registered and
    never change after, so a scrape on the exporter's thread reads them without a lock."""

    def __init__(self, hist: Family, bases: Mapping[LabelKey, Hist]) -> None:
        self._hist = hist
        self._raw = dict(bases)
        self._bases: dict[LabelKey, tuple[dict[float, int], int, float]] = {}

    def describe(self) -> Iterable[Metric]:
        return self._hist.describe()

    def fit(self) -> list[LabelKey]:
        """Match each base to the bounds its live child exports (read through
        ``collect()``); returns the keys whose bases do not fit (left out)."""
        misfits = []
        for key, (counts, total) in self._raw.items():
            bounds = [
                float(s.labels["le"])
                for family in self._hist.collect()
                for s in family.samples
                if s.name.endswith("_bucket") and _label_key(s.labels) == key
            ]
            if not bounds or len(bounds) != len(counts) or not math.isinf(bounds[-1]):
                misfits.append(key)
                continue
            cumulative = dict(zip(bounds, itertools.accumulate(counts), strict=True))
            self._bases[key] = (cumulative, sum(counts), total)
        return misfits

    def collect(self) -> Iterator[Metric]:
        bases = self._bases
        for family in self._hist.collect():
            samples = []
            for s in family.samples:
                base = bases.get(_label_key(s.labels))
                if base is not None:
                    cumulative, count, total = base
                    if s.name.endswith("_bucket"):
                        s = s._replace(value=s.value + cumulative[float(s.labels["le"])])
                    elif s.name.endswith("_count"):
                        s = s._replace(value=s.value + count)
                    elif s.name.endswith("_sum"):
                        s = s._replace(value=s.value + total)
                samples.append(s)
            family.samples = samples
            yield family


def restore_histogram(
    registry: CollectorRegistry, hist: Family, bases: Mapping[LabelKey, Hist]
) -> list[LabelKey]:
    """Serve ``hist`` from now on with ``bases`` added (in its place in ``registry``); its
    children must exist already. Returns the keys not restored: no such child, or other
    buckets than the base was counted in. Call once per histogram."""
    collector = WithBase(hist, bases)
    misfits = collector.fit()
    if len(misfits) < len(bases):
        registry.unregister(hist)
        registry.register(collector)
    return misfits
