"""The target's connection pool after a burst: it shrinks back to what the traffic needs.

A burst of BURST requests held in flight together opens BURST connections; then two
streams send one request after another. The idle connections beyond those two are closed
once idle for the keep-alive timeout (shortened here), counted on the server's side, and
every request still gets exactly one outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from soakd.config import TargetConfig
from soakd.model import Outcome, RequestSpec
from soakd.targets import open_target, pool
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

BURST = 40
QUIET_STREAMS = 2
BODY = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


@dataclass
class Server:
    url: str
    runner: web.AppRunner
    requests: int = 0
    in_flight: int = 0
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    def connections(self) -> int:
        assert self.runner.server is not None
        return len(self.runner.server.connections)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    app = web.Application()
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    srv: Server

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        srv.requests += 1
        srv.in_flight += 1
        try:
            await srv.hold.wait()  # set: answers at once
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(BODY)
            await resp.write_eof()
            return resp
        finally:
            srv.in_flight -= 1

    app.router.add_post("/v1/chat/completions", answer)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv = Server(f"http://127.0.0.1:{runner.addresses[0][1]}", runner)
    yield srv
    await runner.cleanup()


def spec(seq: int) -> RequestSpec:
    return RequestSpec(
        target="local", phase="p", seq=seq, prompt="hello", prompt_tokens_hint=1,
        max_tokens=1, temperature=0.0, scheduled_ns=0,
    )  # fmt: skip


async def test_pool_shrinks_after_a_burst(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "IDLE_CLOSE_S", 0.3)
    target = await open_target(TargetConfig(name="local", base_url=server.url, model="tiny"))
    connector = target.pool
    assert connector is not None
    server.hold.set()
    outcomes: list[Outcome] = [await target.send(spec(-1))]
    # the pool reuses connections after a 200 once it saw the server keep one (pool.py)
    await until(lambda: connector.keeps_after == [200], what="the server seen keeping one")
    server.hold.clear()
    try:
        # the burst: BURST requests in flight at once, each on a connection of its own
        burst = [asyncio.create_task(target.send(spec(i))) for i in range(BURST)]
        await until(lambda: server.in_flight == BURST, what="the whole burst in flight")
        assert server.connections() == BURST
        server.hold.set()
        outcomes += await asyncio.gather(*burst)

        # the quiet part: two streams, one request after another, until the pool is small
        quiet = True

        async def stream(seq: int) -> None:
            while quiet:
                outcomes.append(await target.send(spec(seq)))
                seq += QUIET_STREAMS

        streams = [asyncio.create_task(stream(BURST + i)) for i in range(QUIET_STREAMS)]
        try:
            await until(
                lambda: server.connections() <= QUIET_STREAMS,
                what=f"the pool back to {QUIET_STREAMS} connections",
            )
        finally:
            quiet = False  # each stream ends after the request it is on
            await asyncio.gather(*streams)
    finally:
        await target.aclose()
    # nothing in use was closed: every request went out once and came back ok
    assert all(out.ok for out in outcomes), {out.error for out in outcomes}
    assert server.requests == len(outcomes)
    assert len({out.seq for out in outcomes}) == len(outcomes)
