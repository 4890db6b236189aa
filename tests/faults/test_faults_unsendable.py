"""A request soakd's client refuses to build is `not sent`, never an outcome.

The config refuses such values first (``tests/unit/test_config_wire.py``); these tests
bypass it (``model_copy`` skips validation, as a library caller or a value read at run
time could) to show the last line holds: a header with CR/LF, a body json cannot encode,
a proxy URL aiohttp refuses. Before: a header with CRLF made 2,992 ``client_error``
outcomes in 3 s (4,113 in the issue's run) that never reached the server, and a proxy
URL aiohttp refused made a closed loop spin without ever yielding, deaf to SIGTERM.
Now: the server sees nothing, the run has no outcome, the send ledger counts each try
under ``invalid_request`` (exported), and the log names the cause once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from soakd.config import Config, config_from_dict
from soakd.model import RequestSpec
from soakd.run.app import RunOptions, Soak
from soakd.targets.openai import open_target
from soakd.types import NotSent
from tests.faults.conftest import figure, samples
from tests.hostile_server import HostileServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def config(url: str) -> Config:
    return config_from_dict(
        {
            "run": {"name": "unsendable", "drain_timeout": "2s"},
            "targets": [{"name": "t", "base_url": url, "model": "m", "scrape": False}],
            "workload": {"max_tokens": 8},
            "gpu": {"source": "none"},
            "phases": [
                {"name": "p", "duration": "2s", "load": {"mode": "closed", "concurrency": 2}}
            ],
        }
    )


def bypassing_validation(cfg: Config, **target: Any) -> Config:
    bad = cfg.targets[0].model_copy(update=target)
    return cfg.model_copy(update={"targets": [bad]})


async def test_a_header_with_crlf_is_counted_not_sent(
    hostile: HostileServer, tmp_path: Path
) -> None:
    # (in run.workers processes the target's config is validated again: it never starts)
    cfg = bypassing_validation(config(hostile.url("ok")), headers={"X-Bad": "a\r\nInjected: 1"})
    before = hostile.stats.requests["ok"], hostile.stats.connections
    soak = Soak(cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0"))
    result = await soak.run()

    assert result.completed
    assert (hostile.stats.requests["ok"], hostile.stats.connections) == before  # nothing arrived
    assert soak.stats.total["t"].requests == 0  # no outcome invented
    not_sent = soak.ledger.counts.get(("t", "p", "invalid_request"), 0)
    assert not_sent >= 2  # each stream tried, and tries again after a back-off
    assert not_sent < 200  # ... a few times a second, not thousands
    text = generate_latest(soak.metrics.registry).decode()
    exported = samples(text, "soakd_sends_missed_total", reason="invalid_request")
    assert exported == not_sent
    log = (tmp_path / "run" / "soakd.log").read_text()
    assert log.count("request_not_buildable") == 1  # once per target
    assert "header X-Bad: its value holds a carriage return (CR) at position 2" in log
    assert "Injected" not in log
    figure("unsendable_header.not_sent", not_sent)


async def test_a_body_json_cannot_encode_is_not_sent(hostile: HostileServer) -> None:
    cfg = bypassing_validation(config(hostile.url("ok")), extra_body={"x": {1, 2}})
    target = await open_target(cfg.targets[0])
    before = hostile.stats.connections
    try:
        with pytest.raises(NotSent) as info:
            await target.send(RequestSpec("t", "p", 0, "hi", 1, 8, 0.0, 0, 0))
    finally:
        await target.aclose()
    assert info.value.reason == "invalid_request"
    assert hostile.stats.connections == before


async def test_a_proxy_url_aiohttp_refuses_is_not_sent_and_yields(
    hostile: HostileServer,
) -> None:
    cfg = bypassing_validation(config(hostile.url("ok")), proxy="notaurl")
    target = await open_target(cfg.targets[0])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    try:
        for seq in range(3):
            with pytest.raises(NotSent):
                await target.send(RequestSpec("t", "p", seq, "hi", 1, 8, 0.0, 0, 0))
            await asyncio.sleep(0)
    finally:
        tick.cancel()
        await target.aclose()
    assert ticks >= 3
