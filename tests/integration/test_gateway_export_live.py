"""``soakd run`` with a target behind a gateway it starts itself: the gateway's breaker,
rejections and concurrency limit show on soakd's own /metrics, with the target's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from soakd.sim.spawn import spawn_sim

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def metric(text: str, name: str, **labels: str) -> float | None:
    found = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                found = (found or 0.0) + s.value
    return found


async def test_soakd_re_exports_the_gateway_it_runs(tmp_path: Path) -> None:
    sim = await spawn_sim("edge-4gb-surge", "soakd-sim", tmp_path / "sim.log")
    try:
        cfg = config_from_dict({
            "run": {"name": "gw-export", "drain_timeout": "10s"},
            "targets": [{
                "name": "edge", "base_url": sim.base_url, "model": "soakd-sim",
                "gateway": {
                    "vram_breaker": {"hold": "1s", "close_hold": "1s", "retry_after": "1s"},
                    "gpu": {"source": "dcgm", "interval": "0.25s"},
                },
            }],
            "workload": {"max_tokens": 32, "prompts": {"input_tokens": {"mean": 16}}},
            "phases": [{"name": "load", "duration": "8s",
                        "load": {"mode": "closed", "concurrency": 8}}],
            "gpu": {"source": "none"},
            "probes": {"scrape_interval": "0.5s", "health_interval": "1s"},
        })  # fmt: skip
        run = Soak(
            cfg,
            RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False),
        )
        result = await run.run()
    finally:
        await sim.aclose()
    assert result.completed
    text = generate_latest(run.metrics.registry).decode()
    n429 = result.summary["edge"]["errors_by_kind"].get("shed_vram_breaker", 0)  # the guard's
    assert n429 > 0, result.summary["edge"]
    assert metric(text, "soakd_gateway_up", target="edge") is not None
    assert metric(text, "soakd_gateway_feature_enabled", target="edge", feature="vram_breaker") == 1
    assert metric(text, "soakd_gateway_breaker_state", target="edge", breaker="vram") is not None
    opened = metric(text, "soakd_gateway_breaker_transitions_total", target="edge", to="open")
    assert opened is not None
    assert opened >= 1
    # the last read is at most one scrape interval old: most of soakd's 429s are in it
    rejected = metric(
        text, "soakd_gateway_rejections_total", target="edge", reason="vram_breaker_open"
    )
    assert rejected is not None
    assert 0 < rejected <= n429
    assert metric(text, "soakd_gateway_concurrency_limit", target="edge") is not None
    assert metric(text, "soakd_gateway_queue_depth", target="edge") is not None
