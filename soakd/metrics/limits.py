"""Metrics room, limits: the run-wide SLO and alert-only limits as gauges (no labels), so
that the alert rules compare with the run's own limits, not numbers written into them. A
key not set is not exported: no limit, no alert. Per-target overrides are not here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from soakd.config import AlertLimits, Slo
from soakd.metrics.names import (
    LIMIT_DRIFT,
    LIMIT_E2E,
    LIMIT_ERROR_RATIO,
    LIMIT_JITTER,
    LIMIT_LAG,
    LIMIT_LEAK,
    LIMIT_SERVER_ERROR_RATIO,
    LIMIT_TPOT,
    LIMIT_TTFT,
    LIMIT_VRAM,
)

LIMIT_HELP = {
    LIMIT_VRAM: "VRAM limit (slo.vram_peak).",
    LIMIT_ERROR_RATIO: "Error ratio limit (slo.error_ratio): every failure / judged requests.",
    LIMIT_SERVER_ERROR_RATIO: "5xx ratio limit (slo.server_error_ratio).",
    LIMIT_E2E: "P99 end-to-end latency SLO (slo.e2e_p99).",
    LIMIT_TTFT: "P99 TTFT SLO (slo.ttft_p99).",
    LIMIT_TPOT: "P99 TPOT SLO (slo.tpot_p99).",
    LIMIT_JITTER: "Limit on P99 jitter (slo.jitter).",
    LIMIT_LEAK: "VRAM leak slope limit (alert_limits.vram_leak_per_hour).",
    LIMIT_LAG: "Dispatch lag limit (alert_limits.dispatch_lag).",
    LIMIT_DRIFT: "Limit on the drift of P99 end-to-end latency "
    "(alert_limits.e2e_p99_drift_per_hour).",
}


class Limits:
    """The limit gauges, from a snapshot: only the ones set."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def set(self, slo: Slo, alerts: AlertLimits) -> None:
        self.values = {
            name: value
            for name, value in (
                (LIMIT_VRAM, slo.vram_peak),
                (LIMIT_ERROR_RATIO, slo.error_ratio),
                (LIMIT_SERVER_ERROR_RATIO, slo.server_error_ratio),
                (LIMIT_E2E, slo.e2e_p99),
                (LIMIT_TTFT, slo.ttft_p99),
                (LIMIT_TPOT, slo.tpot_p99),
                (LIMIT_JITTER, slo.jitter),
                (LIMIT_LEAK, alerts.vram_leak_per_hour),
                (LIMIT_LAG, alerts.dispatch_lag),
                (LIMIT_DRIFT, alerts.e2e_p99_drift_per_hour),
            )
            if value is not None
        }

    def collect(self) -> Iterator[Metric]:
        for name, help_text in LIMIT_HELP.items():
            value = self.values.get(name)
            if value is not None:
                yield GaugeMetricFamily(name, help_text, value=value)
