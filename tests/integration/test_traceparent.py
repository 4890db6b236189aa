"""Trace context on the wire: the traceparent a real local server receives from soakd's
client, and the exemplars soakd's own /metrics serves to a scraper that asks for
OpenMetrics (and not to one that does not)."""

from __future__ import annotations

import json
from array import array
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from soakd.config import TargetConfig
from soakd.http import Board, start_http
from soakd.measure.fold import fold
from soakd.metrics.run import Metrics
from soakd.model import Outcome, RequestSpec
from soakd.targets import open_target
from soakd.tracing import trace_id, traceparent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A streaming chat server on 127.0.0.1:0 that keeps each request's headers."""
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for text in ("a", "b"):
            body = {"choices": [{"index": 0, "delta": {"content": text}}]}
            await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


class Idle:
    """The exporter's view of a run that publishes nothing: ready, an empty /status."""

    ready = True

    def status_doc(self) -> dict[str, Any]:
        return {}

    def stalled(self) -> str | None:
        return None


def spec(seq: int) -> RequestSpec:
    return RequestSpec("local", "steady", seq, "hello", 1, 4, 0.0, 0)


@pytest.mark.parametrize(("setting", "sent"), [(None, True), (True, True), (False, False)])
async def test_the_server_receives_the_traceparent(
    server: tuple[str, list[dict[str, str]]], setting: bool | None, sent: bool
) -> None:
    url, seen = server
    cfg = TargetConfig(name="local", base_url=url, traceparent=setting)
    target = await open_target(cfg, run_id="run-7")
    try:
        for seq in (3, 4):
            out = await target.send(spec(seq))
            assert out.ok, out.error_detail
    finally:
        await target.aclose()
    got = [h.get("traceparent") for h in seen]
    if sent:
        assert got == [traceparent("run-7", "local", 3), traceparent("run-7", "local", 4)]
    else:
        assert got == [None, None]


async def test_metrics_serve_exemplars_when_the_scraper_asks_for_openmetrics() -> None:
    m = Metrics(CollectorRegistry())
    m.add_target("local", ["steady"])
    m.trace_exemplars("run-7", ["local"])
    o = Outcome("local", "steady", 12, 0)
    o.sent_ns, o.first_token_ns, o.last_token_ns, o.end_ns = (
        1,
        200_000_001,
        2_500_000_001,
        2_500_000_001,
    )
    o.status, o.output_tokens, o.content_chunks, o.itl_ns = 200, 2, 2, array("q", [1])
    m.apply(fold([o]))

    http = await start_http("127.0.0.1", 0, m.registry, Board(Idle()))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(http.url + "/metrics", headers={"Accept": OPENMETRICS}) as resp:
                assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
                om = await resp.text()
            async with session.get(http.url + "/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain")
                plain = await resp.text()
    finally:
        await http.aclose()
    tid = trace_id("run-7", "local", 12)
    assert (
        'soakd_request_duration_seconds_bucket{le="3.0",target="local"} 1.0 '
        f'# {{trace_id="{tid}"}} 2.5'
    ) in om
    assert f'# {{trace_id="{tid}"}} 0.2' in om  # on the TTFT histogram
    assert "trace_id" not in plain
