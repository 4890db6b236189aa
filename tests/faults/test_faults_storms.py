"""429 and 503 storms, with and without Retry-After: every answer is counted under its
kind, the neighbours are untouched, and soakd keeps sending."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from soakd.app import RunOptions, Soak
from soakd.config import config_from_dict
from tests.faults.conftest import figure, samples
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STORMS = {"s429": "http_429", "s429ra": "http_429", "s503": "http_5xx", "s503ra": "http_5xx"}
RATE, SECONDS = 40.0, 4.0


async def test_storms_are_counted_one_by_one(hostile: HostileServer, tmp_path: Path) -> None:
    before = {m: hostile.stats.requests[m] for m in [*STORMS, "ok"]}
    targets = [{"name": m, "base_url": hostile.url(m), "model": "m", "scrape": False,
                "timeouts": {"connect": "1s", "ttft": "2s", "total": "3s"}}
               for m in [*STORMS, "ok"]]  # fmt: skip
    cfg = config_from_dict({
        "run": {"name": "storm", "drain_timeout": "5s"},
        "targets": targets,
        "workload": {"max_tokens": 8},
        "gpu": {"source": "none"},
        "phases": [
            {"name": "open", "duration": f"{SECONDS}s",
             "load": {"mode": "constant", "rate": RATE}},
            {"name": "closed", "duration": "2s", "load": {"mode": "closed", "concurrency": 4}},
        ],
    })  # fmt: skip
    soak = Soak(cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0",
                                console_logs=False))  # fmt: skip
    result = await soak.run()
    assert result.completed
    text = generate_latest(soak.metrics.registry).decode()
    for mode, kind in STORMS.items():
        answered = hostile.stats.requests[mode] - before[mode]
        counted = samples(text, "soakd_requests_total", target=mode, outcome=kind)
        assert counted == answered, (mode, counted, answered)  # every single one
        assert samples(text, "soakd_requests_total", target=mode) == counted  # nothing else
        stats = soak.stats.total[mode]
        assert stats.errors == {kind: answered}
        # failures stay out of the latency histograms
        assert samples(text, "soakd_request_duration_seconds_count", target=mode) == 0
        open_phase = samples(text, "soakd_requests_total", target=mode, phase="open")
        closed_phase = samples(text, "soakd_requests_total", target=mode, phase="closed")
        assert closed_phase > 0  # the storm did not stop the plan
        if not mode.endswith("ra"):
            # without Retry-After nothing slows down: the open loop sent every planned one
            assert open_phase == RATE * SECONDS, (mode, open_phase)
        figure(f"storms.{mode}.counted", counted)
        figure(f"storms.{mode}.answered", answered)
    ok = soak.stats.total["ok"]
    assert ok.errors == {}
    assert ok.ok == hostile.stats.requests["ok"] - before["ok"]
    for mode in STORMS:
        assert samples(text, "soakd_target_up", target=mode) in (0.0, 1.0)
