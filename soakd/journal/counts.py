"""Journal counts room: the writer's own health figures, counted in the writer process and
sent to soakd with every commit, where ``JournalMetrics.add`` puts them into Prometheus.

``WriterCounts`` has the shape of the ``JournalMetrics`` attributes the writer touches
(``records.labels(kind).inc(n)``, ``commit.observe(s)``, ``size.set(b)``...), so the writer's
code reads as it did when it shared soakd's registry; ``drain`` returns what changed since
the last call, as the link's ``Stats`` message (messages.py).
"""

from __future__ import annotations

from soakd.journal.messages import Stats


class Count:
    """A counter's increments since the last drain."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, n: float = 1.0) -> None:
        self.value += n


class Gauge:
    """A gauge's last value (None: not set since the last drain)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float | None = None

    def set(self, v: float) -> None:
        self.value = v


class Observed:
    """A histogram's observations since the last drain."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, v: float) -> None:
        self.values.append(v)


class ByKind:
    """A labelled counter: ``labels(kind)`` -> its ``Count``."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, Count] = {}

    def labels(self, kind: str) -> Count:
        c = self.counts.get(kind)
        if c is None:
            c = self.counts[kind] = Count()
        return c


COUNTERS = ("write_errors", "downtime", "rows_dropped")
GAUGES = ("last_commit", "size", "max_bytes", "disk_free", "rows_kept")
LABELLED = ("records", "dropped")


class WriterCounts:
    """What the writer counts of itself (the names of ``JournalMetrics``' attributes)."""

    def __init__(self) -> None:
        self.records, self.dropped = ByKind(), ByKind()
        self.write_errors, self.downtime, self.rows_dropped = Count(), Count(), Count()
        self.last_commit, self.size, self.max_bytes = Gauge(), Gauge(), Gauge()
        self.disk_free, self.rows_kept = Gauge(), Gauge()
        self.commit = Observed()

    def drain(self) -> Stats:
        """What changed since the last call (and reset): only the figures that moved."""
        doc: dict[str, object] = {}
        for name in COUNTERS:
            c: Count = getattr(self, name)
            if c.value:
                doc[name], c.value = c.value, 0.0
        for name in GAUGES:
            g: Gauge = getattr(self, name)
            if g.value is not None:
                doc[name], g.value = g.value, None
        for name in LABELLED:
            by: ByKind = getattr(self, name)
            moved = {k: c.value for k, c in by.counts.items() if c.value}
            if moved:
                doc[name] = moved
                by.counts.clear()
        if self.commit.values:
            doc["commit"], self.commit.values = tuple(self.commit.values), []
        return Stats(**doc)  # type: ignore[arg-type]
