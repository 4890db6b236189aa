"""soakd re-exports the gateways it runs: a real gateway registry's exposition in, soakd's
/metrics out, every sample with its target."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.gateway.metrics import GatewayMetrics
from soakd.probes.gateways import export_gateways


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_gateways_are_re_exported_with_their_target() -> None:
    edge, cloud = GatewayMetrics(), GatewayMetrics()
    edge.set_breaker("vram", "open")
    edge.rejections.labels("vram_breaker_open").inc(7)
    edge.limit.set(4)
    edge.queue_wait.observe(0.2)
    cloud.set_breaker("error_rate", "half_open")
    registry = CollectorRegistry()
    export = export_gateways(
        {"edge": "http://127.0.0.1:1", "cloud": "http://127.0.0.1:2/", "down": "http://x:3"},
        1.0,
        registry,
    )
    assert export.urls["cloud"] == "http://127.0.0.1:2/metrics"
    export.ingest("edge", generate_latest(edge.registry).decode())
    export.ingest("cloud", generate_latest(cloud.registry).decode())
    export.ingest("down", None)
    got = samples(registry)

    def value(name: str, **labels: str) -> float | None:
        return got.get((name, frozenset(labels.items())))

    assert value("soakd_gateway_breaker_state", target="edge", breaker="vram") == 2
    assert value("soakd_gateway_breaker_state", target="cloud", breaker="error_rate") == 1
    assert value("soakd_gateway_rejections_total", target="edge", reason="vram_breaker_open") == 7
    assert value("soakd_gateway_concurrency_limit", target="edge") == 4
    assert value("soakd_gateway_queue_wait_seconds_count", target="edge") == 1
    assert value("soakd_gateway_queue_wait_seconds_bucket", target="edge", le="0.25") == 1
    assert value("soakd_gateway_up", target="edge") == 1
    assert value("soakd_gateway_up", target="down") == 0
    assert not [n for n, _ in got if n.endswith("_created")]
    # every re-exported sample says which gateway it came from
    assert all(dict(labels).get("target") for _, labels in got)

    export.ingest("edge", None)  # the gateway stopped answering: its series drop out
    got = samples(registry)
    assert value("soakd_gateway_breaker_state", target="edge", breaker="vram") is None
    assert value("soakd_gateway_up", target="edge") == 0
