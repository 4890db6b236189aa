"""Gateway room, metrics: what ``soakd gateway`` exports on its own /metrics (its own
registry, its own process): admission, breakers, concurrency, the upstream.

The names are ``soakd/metrics/names.py``'s; ``soakd run`` re-exports the families of the
gateways it starts with a ``target`` label (``soakd/probes/gateways.py``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from soakd import __version__
from soakd.metrics import names as mn

GATEWAY_BREAKERS = ("vram", "error_rate")
GATEWAY_BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
GATEWAY_REJECTIONS = (
    "vram_breaker_open",
    "error_breaker_open",
    "queue_full",
    "queue_timeout",
    "body_too_large",
    "headers_too_large",
)
GATEWAY_UPSTREAM_ERRORS = ("connect", "timeout", "truncated", "protocol")
GATEWAY_FEATURES = ("vram_breaker", "error_breaker", "adaptive")
# fmt: off
GATEWAY_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
# fmt: on


class GatewayMetrics:
    """``soakd gateway`` (soakd/gateway/): admission, breakers, concurrency, the upstream."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.build_info = Info(  # Info adds the "_info" to its name
            mn.GATEWAY_BUILD_INFO.removesuffix("_info"), "soakd gateway version.", registry=r
        )
        self.build_info.info({"version": __version__})
        self.responses = Counter(
            mn.GATEWAY_UPSTREAM_RESPONSES_TOTAL,
            "Upstream answers passed on, by status class.",
            ["status_class"],
            registry=r,
        )
        self.upstream_errors = Counter(
            mn.GATEWAY_UPSTREAM_ERRORS_TOTAL,
            "Upstream failures with no (whole) answer: connect, timeout, truncated, protocol.",
            ["kind"],
            registry=r,
        )
        self.rejections = Counter(
            mn.GATEWAY_REJECTIONS_TOTAL,
            "Requests the gateway answered itself, by reason.",
            ["reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            mn.GATEWAY_IN_FLIGHT_REQUESTS, "Requests in flight to the upstream.", registry=r
        )
        self.queue_depth = Gauge(
            mn.GATEWAY_QUEUE_DEPTH, "Requests waiting for a concurrency slot.", registry=r
        )
        self.limit = Gauge(
            mn.GATEWAY_CONCURRENCY_LIMIT,
            "Requests allowed in flight to the upstream now.",
            registry=r,
        )
        self.limit_changes = Counter(
            mn.GATEWAY_CONCURRENCY_LIMIT_CHANGES_TOTAL,
            "Adaptive limit changes, by direction (up, down).",
            ["direction"],
            registry=r,
        )
        self.ttfb_p95 = Gauge(
            mn.GATEWAY_UPSTREAM_TTFB_P95_SECONDS,
            "The adaptive controller's last P95 of upstream time to first byte.",
            registry=r,
        )
        self.latency_target = Gauge(
            mn.GATEWAY_LATENCY_TARGET_SECONDS,
            "Configured P95 upstream time-to-first-byte target.",
            registry=r,
        )
        self.breaker_state = Gauge(
            mn.GATEWAY_BREAKER_STATE, "0 closed, 1 half-open, 2 open.", ["breaker"], registry=r
        )
        self.transitions = Counter(
            mn.GATEWAY_BREAKER_TRANSITIONS_TOTAL,
            "Breaker state changes, by the state entered.",
            ["breaker", "to"],
            registry=r,
        )
        self.feature = Gauge(
            mn.GATEWAY_FEATURE_ENABLED, "1 when the feature is on.", ["feature"], registry=r
        )
        self.vram_used = Gauge(
            mn.GATEWAY_VRAM_USED_BYTES, "The VRAM reading the breaker compares.", registry=r
        )
        self.vram_limit = Gauge(
            mn.GATEWAY_VRAM_LIMIT_BYTES, "VRAM breaker: open above this (for hold).", registry=r
        )
        self.vram_lower = Gauge(
            mn.GATEWAY_VRAM_LOWER_MARK_BYTES, "VRAM breaker: close below this.", registry=r
        )
        self.vram_up = Gauge(
            mn.GATEWAY_VRAM_PROBE_UP, "1 when the VRAM source answers.", registry=r
        )
        self.ttfb = Histogram(
            mn.GATEWAY_UPSTREAM_TTFB_SECONDS,
            "Upstream time to first response byte (headers and the first body chunk).",
            buckets=GATEWAY_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            mn.GATEWAY_UPSTREAM_DURATION_SECONDS,
            "Upstream request duration, send to last byte passed on.",
            buckets=GATEWAY_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            mn.GATEWAY_QUEUE_WAIT_SECONDS,
            "Time admitted requests waited for a slot.",
            buckets=GATEWAY_LATENCY_BUCKETS,
            registry=r,
        )
        for sc in ("2xx", "3xx", "4xx", "5xx"):
            self.responses.labels(sc)
        for kind in GATEWAY_UPSTREAM_ERRORS:
            self.upstream_errors.labels(kind)
        for reason in GATEWAY_REJECTIONS:
            self.rejections.labels(reason)
        for direction in ("up", "down"):
            self.limit_changes.labels(direction)
        for breaker in GATEWAY_BREAKERS:
            self.breaker_state.labels(breaker).set(0)
            for state in GATEWAY_BREAKER_STATES:
                self.transitions.labels(breaker, state)

    def set_breaker(self, breaker: str, state: str, transition: bool = True) -> None:
        self.breaker_state.labels(breaker).set(GATEWAY_BREAKER_STATES[state])
        if transition:
            self.transitions.labels(breaker, state).inc()
