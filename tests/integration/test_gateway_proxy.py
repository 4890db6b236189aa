"""``soakd gateway``'s proxy against a scripted local upstream: unbuffered SSE, size limits,
the error-rate breaker, the queue, the admin switch and the own endpoints."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from soakd.config import gateway_config_from_dict
from soakd.gateway import GatewayServer, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

TOKEN = "admin-token-for-tests"
CHAT = "/v1/chat/completions"


class Upstream:
    """A scripted model server: ``mode`` ok | fail | slow; counts what reached it."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0
        self.seen_headers: list[dict[str, str]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        self.seen_headers.append(dict(request.headers))
        await request.read()
        if self.mode == "fail":
            return web.json_response(
                {"error": {"message": "boom", "type": "x", "code": 500}}, status=500
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f'data: {{"i": {i}}}\n\n'.encode())
            await asyncio.sleep(0.2 if self.mode == "slow" else 0.05)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    up = Upstream()
    app = web.Application()
    app.router.add_post(CHAT, up.chat)
    app.router.add_get("/v1/models", up.models)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield up, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def gateway(url: str, **cfg: Any) -> GatewayServer:
    base = {"upstream": url, "listen": "127.0.0.1:0", "gpu": {"source": "none"}}
    return await start_gateway(gateway_config_from_dict(base | cfg), admin_token=TOKEN)


async def post(session: aiohttp.ClientSession, gw: GatewayServer, body: bytes = b"{}",
               **kw: Any) -> tuple[int, dict[str, Any] | None, dict[str, str]]:  # fmt: skip
    async with session.post(gw.url + CHAT, data=body, **kw) as resp:
        await resp.read()
        doc = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, doc, dict(resp.headers)


async def test_sse_passes_through_chunk_by_chunk(upstream: tuple[Upstream, str]) -> None:
    up, url = upstream
    up.mode = "slow"
    gw = await gateway(url)
    try:
        arrivals: list[float] = []
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            async with s.post(
                gw.url + CHAT, data=b"{}", headers={"Authorization": "Bearer sk-x", "X-Team": "a"}
            ) as resp:
                assert resp.status == 200
                assert resp.content_type == "text/event-stream"
                async for chunk in resp.content.iter_any():
                    arrivals.append(time.monotonic() - t0)
                    del chunk
        # each event arrived when the upstream wrote it (0.2 s apart), none held back
        assert len(arrivals) >= 3
        assert arrivals[-1] - arrivals[0] >= 0.35
        assert up.seen_headers[0]["Authorization"] == "Bearer sk-x"  # passed on untouched
        assert up.seen_headers[0]["X-Team"] == "a"
    finally:
        await gw.aclose()


async def test_size_limits_give_clear_openai_errors(upstream: tuple[Upstream, str]) -> None:
    up, url = upstream
    gw = await gateway(url, limits={"max_body_bytes": 2048, "max_header_bytes": 4096})
    try:
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(s, gw, b"x" * 5000)
            assert status == 413
            assert doc is not None
            assert doc["error"]["code"] == "body_too_large"
            assert "2048" in doc["error"]["message"]
            status, doc, _ = await post(s, gw, headers={"X-Big": "y" * 5000})
            assert status == 431
            assert doc is not None
            assert doc["error"]["code"] == "headers_too_large"
            status, _, _ = await post(s, gw, b"x" * 2000)
            assert status == 200
        assert up.calls == 1  # the refused ones never reached the upstream
    finally:
        await gw.aclose()


async def test_error_breaker_opens_probes_and_closes(upstream: tuple[Upstream, str]) -> None:
    up, url = upstream
    up.mode = "fail"
    gw = await gateway(url, error_breaker={"threshold": 0.5, "window": "10s", "min_requests": 4,
                                           "open_for": "0.5s"})  # fmt: skip
    try:
        async with aiohttp.ClientSession() as s:
            codes = [(await post(s, gw))[0] for _ in range(6)]
            assert codes[:4] == [500] * 4  # passed on as the upstream said
            status, doc, headers = await post(s, gw)
            assert status == 503
            assert doc is not None
            assert doc["error"]["code"] == "error_breaker_open"
            assert int(headers["Retry-After"]) >= 1
            assert gw.gateway.errors.state == "open"
            calls = up.calls
            await asyncio.sleep(0.6)  # open_for passed: one probe goes through, and fails
            assert (await post(s, gw))[0] == 500
            assert up.calls == calls + 1
            assert (await post(s, gw))[0] == 503
            up.mode = "ok"
            await asyncio.sleep(0.6)
            assert (await post(s, gw))[0] == 200  # the probe succeeds: closed
            assert gw.gateway.errors.state == "closed"
            assert (await post(s, gw))[0] == 200
            async with s.get(gw.url + "/metrics") as resp:
                text = await resp.text()
        assert 'soakd_gateway_breaker_transitions_total{breaker="error_rate",to="open"} 2.0' in text
        assert 'soakd_gateway_breaker_state{breaker="error_rate"} 0.0' in text
    finally:
        await gw.aclose()


async def test_queue_bound_and_timeout(upstream: tuple[Upstream, str]) -> None:
    up, url = upstream
    up.mode = "slow"  # ~0.6 s a request
    gw = await gateway(url, concurrency={"limit": 1, "queue": 1, "queue_timeout": "0.3s"})
    try:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post(s, gw) for _ in range(3)))
        codes = sorted(r[0] for r in results)
        assert codes == [200, 429, 503]  # one runs, one waits and times out, one finds it full
        by_code = {r[0]: r[1] for r in results}
        assert by_code[429] is not None
        assert by_code[429]["error"]["code"] == "queue_full"
        assert by_code[503] is not None
        assert by_code[503]["error"]["code"] == "queue_timeout"
        assert gw.gateway.limiter.in_flight == 0
    finally:
        await gw.aclose()


async def test_own_endpoints_and_admin_modes(upstream: tuple[Upstream, str]) -> None:
    _, url = upstream
    gw = await gateway(url)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/healthz") as resp:
                assert resp.status == 200
            async with s.get(gw.url + "/v1/models") as resp:  # GETs pass through
                assert (await resp.json())["data"][0]["id"] == "m"
            async with s.put(gw.url + "/gateway/modes", json={"adaptive": True}) as resp:
                assert resp.status == 401
            async with s.put(
                gw.url + "/gateway/modes",
                json={"adaptive": True, "vram_breaker": False},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp:
                assert resp.status == 200
                assert await resp.json() == {"vram_breaker": False, "error_breaker": True,
                                             "adaptive": True}  # fmt: skip
            async with s.put(
                gw.url + "/gateway/modes",
                json={"turbo": True},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as resp:
                assert resp.status == 400
            async with s.get(gw.url + "/metrics") as resp:
                text = await resp.text()
        for name in ("soakd_gateway_in_flight_requests", "soakd_gateway_queue_depth",
                     "soakd_gateway_concurrency_limit", "soakd_gateway_breaker_state",
                     "soakd_gateway_rejections_total", "soakd_gateway_upstream_ttfb_seconds",
                     "soakd_gateway_vram_limit_bytes"):  # fmt: skip
            assert name in text
        assert 'soakd_gateway_feature_enabled{feature="adaptive"} 1.0' in text
        assert 'soakd_gateway_feature_enabled{feature="vram_breaker"} 0.0' in text
    finally:
        await gw.aclose()


async def test_dead_upstream_is_a_502_and_counts_as_failure() -> None:
    from soakd.sim.spawn import free_port

    gw = await gateway(f"http://127.0.0.1:{free_port()}", limits={"connect_timeout": "1s"})
    try:
        async with aiohttp.ClientSession() as s:
            status, doc, _ = await post(s, gw)
        assert status == 502
        assert doc is not None
        assert doc["error"]["code"] == "upstream_unreachable"
        assert gw.gateway.errors.failures == 1
    finally:
        await gw.aclose()


def test_cli_needs_an_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    from soakd.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["gateway"])
    assert exc.value.code == 2
    assert "give --config FILE or --upstream URL" in capsys.readouterr().err


async def read_stream(s: aiohttp.ClientSession, url: str, got: list[bytes]) -> None:
    async with s.post(url, data=b"{}") as resp:
        assert resp.status == 200
        async for part in resp.content.iter_any():
            got.append(part)  # noqa: PERF401  # kept one by one: the read ends in an error


async def test_an_upstream_whose_http_breaks_is_named_at_once() -> None:
    """A status line that is not HTTP's: a 502 upstream_protocol_error. A chunk size that
    is not hex after the first token: the stream is cut for the client when the bad bytes
    arrive (aiohttp's C parser left the answer's reader waiting: soakd/targets/framing.py)."""
    from tests.hostile_server import serve_hostile

    with serve_hostile() as hostile:
        bad_status = await gateway(hostile.url("bad_status"))
        bad_chunk = await gateway(hostile.url("bad_chunk_size"))
        try:
            async with aiohttp.ClientSession() as s:
                status, doc, _ = await post(s, bad_status)
                assert status == 502
                assert doc is not None
                assert doc["error"]["code"] == "upstream_protocol_error"
                t0 = time.monotonic()
                got: list[bytes] = []
                with pytest.raises(aiohttp.ClientPayloadError):
                    await read_stream(s, bad_chunk.url + CHAT, got)
                assert time.monotonic() - t0 < 5.0  # the upstream holds it open for an hour
                assert b"".join(got).count(b"data: ") == 1  # the one token before the break
                for gw in (bad_status, bad_chunk):
                    async with s.get(gw.url + "/metrics") as resp:
                        text = await resp.text()
                    assert 'soakd_gateway_upstream_errors_total{kind="protocol"} 1.0' in text
        finally:
            await bad_status.aclose()
            await bad_chunk.aclose()
