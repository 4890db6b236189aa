"""Where a streamed answer's E2E ends: at its last chunk that carried a choice, not at the
usage chunk or ``[DONE]`` a busy server writes a scheduler step later (docs/metrics.md).
A real aiohttp server streams the answer, then waits before each trailer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from soakd.config import TargetConfig
from soakd.model import RequestSpec
from soakd.targets import open_target
from tests.serving import served

TRAILER_WAIT_S = 0.15  # before the usage chunk, and again before [DONE]


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _choice(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({"object": "chat.completion.chunk", "choices": [choice]})


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, float]]]:
    """``/<shape>/v1/chat/completions``: ``inline`` puts the finish_reason on the last
    content chunk, ``apart`` sends it in a chunk of its own (llama.cpp does), ``none``
    sends no finish_reason at all. Each answer's trailers wait TRAILER_WAIT_S."""
    sent: dict[str, float] = {}

    async def answer(request: web.Request) -> web.StreamResponse:
        shape = request.match_info["shape"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(4):
            last = i == 3 and shape == "inline"
            await resp.write(_choice({"content": f"t{i} "}, "stop" if last else None))
            await asyncio.sleep(0.01)
        if shape == "apart":
            await resp.write(_choice({}, "stop"))
        sent["answer"] = time.perf_counter()
        await asyncio.sleep(TRAILER_WAIT_S)
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        await resp.write(_event({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        await asyncio.sleep(TRAILER_WAIT_S)
        sent["done"] = time.perf_counter()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/{shape}/v1/chat/completions", answer)
    async with served(app) as url:
        yield url, sent


@pytest.mark.parametrize("shape", ["inline", "apart"])
async def test_e2e_ends_at_the_answers_last_chunk_not_at_its_trailers(
    server: tuple[str, dict[str, float]], shape: str
) -> None:
    url, sent = server
    target = await open_target(TargetConfig(name="t", base_url=f"{url}/{shape}"))
    try:
        out = await target.send(RequestSpec("t", "p", 0, "hello", 1, 8, 0.0, 0))
    finally:
        await target.aclose()
    assert out.outcome == "ok", out.error_detail
    assert out.output_tokens == 4
    assert out.content_chunks == 4
    end_s = out.end_ns / 1e9
    assert out.last_token_ns is not None
    assert out.end_ns >= out.last_token_ns
    if shape == "inline":
        assert out.end_ns == out.last_token_ns
    # the end is taken when the answer came, not when the trailers did (2 x 150 ms later)
    assert end_s < sent["answer"] + TRAILER_WAIT_S / 2 < sent["done"]


async def test_without_a_finish_reason_the_answer_ends_at_its_last_choice(
    server: tuple[str, dict[str, float]],
) -> None:
    url, sent = server
    target = await open_target(TargetConfig(name="t", base_url=f"{url}/none"))
    try:
        out = await target.send(RequestSpec("t", "p", 0, "hello", 1, 8, 0.0, 0))
    finally:
        await target.aclose()
    assert out.outcome == "ok", out.error_detail
    assert out.end_ns == out.last_token_ns
    assert out.end_ns / 1e9 < sent["done"] - TRAILER_WAIT_S
