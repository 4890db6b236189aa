"""Journal metrics room: the journal's own Prometheus families (its health, the run's
downtime and resumes), fed the writer process's ``Stats``. The journal's own, beside it:
the rest of soakd's families are in ``soakd/metrics/`` below, which knows no journal
type. soakd's side only: the writer process never imports prometheus_client.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from soakd.journal.counts import COUNTERS, GAUGES, LABELLED
from soakd.journal.messages import Stats
from soakd.metrics import names as mn

JOURNAL_KINDS = ("request", "sample", "event")


class JournalMetrics:
    """The journal's own health (soakd/journal/), and the run's downtime across resumes."""

    def __init__(
        self, registry: CollectorRegistry, continued: CollectorRegistry | None = None
    ) -> None:
        r = registry
        c = continued if continued is not None else r  # what a resume continues (Continued)
        self.records = Counter(
            mn.JOURNAL_RECORDS_TOTAL, "Records committed to the journal.", ["kind"], registry=r
        )
        self.dropped = Counter(
            mn.JOURNAL_DROPPED_RECORDS_TOTAL,
            "Records not journaled: the writer's queue was full, or its writes kept failing "
            "past journal.queue_size rows (the requests stay in the counters and totals).",
            ["kind"],
            registry=r,
        )
        self.write_errors = Counter(
            mn.JOURNAL_WRITE_ERRORS_TOTAL,
            "Failed journal commits (disk full, read-only, I/O error); the batch is retried.",
            registry=r,
        )
        self.queue_depth = Gauge(
            mn.JOURNAL_QUEUE_DEPTH, "Records waiting for the journal writer.", registry=r
        )
        self.commit = Histogram(
            mn.JOURNAL_COMMIT_SECONDS,
            "Time to write and commit one batch.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.last_commit = Gauge(
            mn.JOURNAL_LAST_COMMIT_TIME_SECONDS,
            "Unix time of the last successful commit.",
            registry=r,
        )
        self.size = Gauge(
            mn.JOURNAL_SIZE_BYTES, "journal.db and its write-ahead log on disk.", registry=r
        )
        self.downtime = Counter(
            mn.RUN_DOWNTIME_SECONDS_TOTAL,
            "Time the run was down between a stop or crash and its resume.",
            registry=c,
        )
        self.resumes = Counter(mn.RUN_RESUMES_TOTAL, "Times this run was resumed.", registry=c)
        # the disk budget (journal.max_bytes, soakd/journal/budget.py)
        self.max_bytes = Gauge(mn.JOURNAL_MAX_BYTES, "The journal's disk budget.", registry=r)
        self.disk_free = Gauge(
            mn.JOURNAL_DISK_FREE_BYTES, "Free space of the journal's file system.", registry=r
        )
        self.rows_kept = Gauge(
            mn.JOURNAL_ROWS_KEPT,
            "1 while per-request rows are written, 0 once near the budget (rollups only).",
            registry=r,
        )
        self.rows_dropped = Counter(
            mn.JOURNAL_ROWS_DROPPED_TOTAL,
            "Requests kept only in the rollups and totals (no row): "
            "the journal was near its budget.",
            registry=r,
        )
        self.writer_restarts = Counter(
            mn.JOURNAL_WRITER_RESTARTS_TOTAL,
            "The journal's writer process started again after it died.",
            registry=r,
        )
        for kind in JOURNAL_KINDS:
            self.records.labels(kind)
            self.dropped.labels(kind)

    def add(self, stats: Stats) -> None:
        """The journal writer's own counts since it last sent them (soakd/journal/counts.py)."""
        for name in COUNTERS:
            if n := getattr(stats, name):
                getattr(self, name).inc(n)
        for name in GAUGES:
            if (value := getattr(stats, name)) is not None:
                getattr(self, name).set(value)
        for name in LABELLED:
            for kind, n in getattr(stats, name).items():
                getattr(self, name).labels(kind).inc(n)
        for seconds in stats.commit:
            self.commit.observe(seconds)
