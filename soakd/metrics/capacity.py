"""Metrics room, ``soakd capacity``'s families: where the sweep is, per target
(docs/capacity.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from soakd.metrics import names as mn


class CapacityMetrics:
    """The sweep's step, its load, the last step's verdict and the knee found so far."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.step = Gauge(
            mn.CAPACITY_STEP, "The capacity sweep's step now (1 the first).", ["target"], registry=r
        )
        self.rate = Gauge(
            mn.CAPACITY_RATE,
            "The capacity step's load: its open-loop rate (req/s) or its concurrency (by).",
            ["target", "by"],
            registry=r,
        )
        self.verdict = Gauge(
            mn.CAPACITY_VERDICT,
            "The last capacity step's verdict: 1 held, 0 failed.",
            ["target"],
            registry=r,
        )
        self.knee = Gauge(
            mn.CAPACITY_KNEE,
            "The highest load that held so far in the capacity sweep (absent: none yet).",
            ["target", "by"],
            registry=r,
        )
