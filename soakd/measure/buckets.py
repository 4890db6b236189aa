"""Buckets room: soakd's latency histograms, counted here rather than in prometheus_client,
and exported with the same exposition (``_bucket`` with ``le``, ``_count``, ``_sum``, and
exemplars in OpenMetrics).

Every latency histogram is a ``BucketHistogram``. Its counts arrive in bulk: the journal's
writer folds each committed batch into bucket counts (soakd/measure/fold.py) and ``Metrics.apply``
adds them with ``BucketChild.add`` (a list add a bucket, no lock, not a Python walk over the
buckets per value as ``Histogram.observe`` does). A resumed run adds the journal's stored
counts the same way, once: no private field of prometheus_client is touched and no
collector has to add a base at scrape time. The exemplar of a bucket (a request's trace id)
is replaced at most once a second (``ExemplarClock``).
"""

from __future__ import annotations

import itertools
import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import Exemplar, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

EXEMPLAR_EVERY_NS = 1_000_000_000
"""A histogram bucket's exemplar is replaced at most this often."""


class ExemplarClock:
    """When a histogram bucket's exemplar is due: at most once a second per bucket.

    client_python keeps the latest exemplar of each bucket and Prometheus reads it once per
    scrape (1 s in the shipped config): replacing it more often is never seen. Building
    one per observation (the trace id's hash, the label checks) cost the hot path about a
    tenth of its time. A bucket that is rarely hit, the slow requests' one, still gets the
    exemplar of every request that lands in it more than a second apart."""

    __slots__ = ("_last",)

    def __init__(self, buckets: int) -> None:
        self._last = [-EXEMPLAR_EVERY_NS] * buckets

    def due(self, bucket: int, now_ns: int) -> bool:
        """True (and the bucket's clock restarted) when ``bucket`` may take a new exemplar
        at ``now_ns`` (monotonic)."""
        if now_ns - self._last[bucket] < EXEMPLAR_EVERY_NS:
            return False
        self._last[bucket] = now_ns
        return True


Shown = tuple[tuple[int, ...], float, tuple[Exemplar | None, ...]]
"""A child as a scrape reads it: counts per bucket, their sum, an exemplar per bucket."""


class BucketChild:
    """One label set of a ``BucketHistogram``: counts per bucket, the sum, and an exemplar
    per bucket. No lock: the run loop is the only writer, and after each change it
    publishes a frozen copy (``shown``, swapped whole); a scrape (the exporter's thread)
    reads only that: counts, sum and exemplars of one moment, never a batch half added."""

    __slots__ = ("_bounds", "counts", "exemplars", "shown", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; +Inf last
        self.total = 0.0
        self.exemplars: list[Exemplar | None] = [None] * len(self.counts)
        self.shown: Shown = (tuple(self.counts), 0.0, tuple(self.exemplars))

    def add(self, counts: Sequence[int], total: float) -> None:
        """Bulk: per-bucket counts (+Inf last) and their sum."""
        mine = self.counts
        for i, n in enumerate(counts):
            if n:
                mine[i] += n
        self.total += total
        self._publish()

    def observe(self, value: float) -> None:
        """One value (the first bucket whose bound is >= it, as Prometheus' ``le``): for a
        reading outside the journal's batches, such as a test driving the exporter."""
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value
        self._publish()

    def set_exemplar(self, bucket: int, labels: dict[str, str], value: float) -> None:
        self.exemplars[bucket] = Exemplar(labels, value, time.time())
        self._publish()

    def _publish(self) -> None:
        self.shown = (tuple(self.counts), self.total, tuple(self.exemplars))


class BucketHistogram(Collector):
    """A Prometheus histogram counted here (see the module's doc). Exposition is the same
    as a client_python ``Histogram``'s."""

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
            counts, total, exemplars = child.shown  # one frozen value the loop published
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for le, n, ex in zip(self._les, itertools.accumulate(counts), exemplars, strict=True):
                buckets.append((le, n) if ex is None else (le, n, ex))
            family.add_metric(list(values), buckets, total)
        return [family]
