"""429 and 503 storms, with and without Retry-After: every answer is counted under its kind,
every planned open-loop send is either made (and counted) or counted as skipped while the
target is paused (soakd/workload/guard.py honours Retry-After), the neighbours are
untouched, and the plan goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from tests.faults.conftest import figure, samples
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STORMS = {"s429": "http_429", "s429ra": "http_429", "s503": "http_5xx", "s503ra": "http_5xx"}
RATE, SECONDS = 40.0, 4.0


@pytest.mark.parametrize(
    ("honour", "workers"),
    [(False, 1), (True, 1), (True, 2)],
    ids=["ignore-retry-after", "honour", "honour-2-workers"],
)
async def test_storms_are_counted_one_by_one(
    hostile: HostileServer, tmp_path: Path, honour: bool, workers: int
) -> None:
    """With sender workers too: the pauses are the parent's, so a Retry-After one worker
    received holds every worker's sends to that target."""
    before = {m: hostile.stats.requests[m] for m in [*STORMS, "ok"]}
    targets = [
        {
            "name": m,
            "base_url": hostile.url(m),
            "model": "m",
            "scrape": False,
            "timeouts": {"connect": "1s", "ttft": "2s", "total": "3s"},
            "rate_limit": {"honour_retry_after": honour},
        }
        for m in [*STORMS, "ok"]
    ]
    cfg = config_from_dict(
        {
            "run": {"name": "storm", "drain_timeout": "5s", "workers": workers},
            "targets": targets,
            "workload": {"max_tokens": 8},
            "gpu": {"source": "none"},
            "phases": [
                {
                    "name": "open",
                    "duration": f"{SECONDS}s",
                    "load": {"mode": "constant", "rate": RATE},
                },
                {"name": "closed", "duration": "2s", "load": {"mode": "closed", "concurrency": 4}},
            ],
        }
    )
    soak = Soak(
        cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )
    result = await soak.run()
    assert result.completed
    text = generate_latest(soak.metrics.registry).decode()
    planned = RATE * SECONDS
    for mode, kind in STORMS.items():
        answered = hostile.stats.requests[mode] - before[mode]
        counted = samples(text, "soakd_requests_total", target=mode, outcome=kind)
        assert counted == answered, (mode, counted, answered)  # every single one
        assert samples(text, "soakd_requests_total", target=mode) == counted  # nothing else
        assert soak.stats.total[mode].errors == {kind: answered}
        # failures stay out of the latency histograms
        assert samples(text, "soakd_request_duration_seconds_count", target=mode) == 0
        sent = samples(text, "soakd_requests_total", target=mode, phase="open")
        skipped = samples(text, "soakd_sends_missed_total", target=mode)
        # no planned send vanishes: made and counted, or skipped and counted
        assert sent + skipped == planned, (mode, sent, skipped)
        paused = honour and (mode.startswith("s429") or mode.endswith("ra"))
        if paused:
            assert samples(text, "soakd_target_pauses_total", target=mode) >= 1
        else:
            assert sent == planned, (mode, sent)  # nothing slows an unhonoured storm
        assert samples(text, "soakd_requests_total", target=mode, phase="closed") > 0
        figure(f"storms.{'honour' if honour else 'ignore'}.{mode}.sent", sent)
        figure(f"storms.{'honour' if honour else 'ignore'}.{mode}.skipped", skipped)
    ok = soak.stats.total["ok"]
    assert ok.errors == {}
    assert ok.ok == hostile.stats.requests["ok"] - before["ok"]
    assert samples(text, "soakd_requests_total", target="ok", phase="open") == planned
