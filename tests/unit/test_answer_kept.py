"""The answer's text, kept only when a request asks (``RequestSpec.keep_answer``): a
conversation's next turn holds it, a check judges it. A real aiohttp server answers,
streamed and not, whole and cut mid-answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from soakd.config import TargetConfig
from soakd.model import ErrorKind, RequestSpec
from soakd.targets import open_target
from tests.serving import served

PIECES = ["Hé", "llo, ", "wörld", "\n!"]


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """``/whole`` streams every piece; ``/cut`` two of them, then drops the connection."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(PIECES)}
            usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
            return web.json_response(
                {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                 "usage": usage}
            )  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cut = request.match_info["shape"] == "cut"
        for piece in PIECES[:2] if cut else PIECES:
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            await resp.write(_event({"choices": [choice]}))
        if cut:
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/{shape}/v1/chat/completions", answer)
    async with served(app) as url:
        yield url


SPEC = RequestSpec("t", "p", 0, "hello", 1, 8, 0.0, 0)


@pytest.mark.parametrize("stream", [True, False])
async def test_the_answer_is_kept_whole_only_when_asked(server: str, stream: bool) -> None:
    target = await open_target(TargetConfig(name="t", base_url=f"{server}/whole", stream=stream))
    try:
        kept = await target.send(replace(SPEC, keep_answer=True))
        unasked = await target.send(SPEC)
    finally:
        await target.aclose()
    assert kept.ok
    assert unasked.ok
    assert kept.answer == "".join(PIECES)
    assert unasked.answer is None


async def test_a_cut_answer_keeps_what_arrived(server: str) -> None:
    target = await open_target(TargetConfig(name="t", base_url=f"{server}/cut"))
    try:
        out = await target.send(replace(SPEC, keep_answer=True))
    finally:
        await target.aclose()
    assert out.error is ErrorKind.STREAM_TRUNCATED
    assert out.answer == "".join(PIECES[:2])


def test_a_conversations_turn_is_on_its_outcome() -> None:
    from soakd.model import Outcome

    out = Outcome.planned(replace(SPEC, conversation=41, turn=3))
    assert (out.conversation, out.turn, out.answer) == (41, 3, None)
    assert Outcome.planned(SPEC).conversation == -1
