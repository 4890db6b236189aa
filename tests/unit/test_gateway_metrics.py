"""Guard and gateway metric names: documented in docs/metrics.md, prefixed, series pre-made."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from soakd.gateway.metrics import GATEWAY_REJECTIONS, GatewayMetrics
from soakd.metrics.run import GuardMetrics

DOCS = Path(__file__).parents[2] / "docs" / "metrics.md"


def test_guard_and_gateway_families_are_documented() -> None:
    documented = set(re.findall(r"`(soakd_[a-z0-9_]+)`", DOCS.read_text()))
    registry = CollectorRegistry()
    GuardMetrics(registry)
    gateway = GatewayMetrics()
    names = {f.name for r in (registry, gateway.registry) for f in r.collect()}
    assert {n for n in names if n.startswith("soakd_gateway_")}
    missing = {n for n in names if not {n, n + "_total", n + "_info"} & documented}
    assert not missing, f"docs/metrics.md does not list: {sorted(missing)}"


def test_gateway_series_start_at_zero() -> None:
    m = GatewayMetrics()
    get = m.registry.get_sample_value
    for reason in GATEWAY_REJECTIONS:
        assert get("soakd_gateway_rejections_total", {"reason": reason}) == 0
    for breaker in ("vram", "error_rate"):
        assert get("soakd_gateway_breaker_state", {"breaker": breaker}) == 0
    m.set_breaker("vram", "open")
    assert get("soakd_gateway_breaker_state", {"breaker": "vram"}) == 2
    assert get("soakd_gateway_breaker_transitions_total", {"breaker": "vram", "to": "open"}) == 1
