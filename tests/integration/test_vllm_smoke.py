"""Smoke test of the real vLLM CPU server: streamed tokens, usage and /metrics agree.

Needs scripts/setup-vllm.sh. Run: pytest tests/integration/test_vllm_smoke.py -m vllm
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from tests.vllm_server import VllmServer, sum_samples

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]

MAX_TOKENS_CHAT = 16
MAX_TOKENS_COMPLETION = 8


async def _metrics(session: aiohttp.ClientSession, server: VllmServer) -> tuple[float, float]:
    async with session.get(server.metrics_url) as resp:
        assert resp.status == 200
        text = await resp.text()
    return (
        sum_samples(text, "vllm:generation_tokens_total", model_name=server.model),
        sum_samples(text, "vllm:prompt_tokens_total", model_name=server.model),
    )


async def _stream_chat(session: aiohttp.ClientSession, server: VllmServer) -> dict[str, Any]:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Write a short story about the sea."}],
        "max_tokens": MAX_TOKENS_CHAT,
        "temperature": 0.8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # vLLM extra parameter: output length == max_tokens
    }
    content_chunks: list[str] = []
    usage: dict[str, int] | None = None
    finish_reason = None
    done = False
    async with session.post(server.api_url + "/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if text := choice.get("delta", {}).get("content"):
                    content_chunks.append(text)
                finish_reason = choice.get("finish_reason") or finish_reason
    assert done, "stream ended without data: [DONE]"
    assert usage is not None, "no usage chunk despite stream_options.include_usage"
    return {"chunks": content_chunks, "usage": usage, "finish_reason": finish_reason}


async def _completion(session: aiohttp.ClientSession, server: VllmServer) -> dict[str, Any]:
    body = {
        "model": server.model,
        "prompt": "The server answered the request in",
        "max_tokens": MAX_TOKENS_COMPLETION,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    async with session.post(server.api_url + "/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
    return result


async def test_stream_usage_and_metrics_agree(vllm: VllmServer) -> None:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        gen_before, prompt_before = await _metrics(session, vllm)

        chat = await _stream_chat(session, vllm)
        assert chat["chunks"], "no content arrived in the stream"
        assert chat["usage"]["completion_tokens"] == MAX_TOKENS_CHAT
        assert chat["finish_reason"] == "length"
        # One delta per token at most (a token may detokenize to nothing, e.g. <unk>).
        assert len(chat["chunks"]) <= MAX_TOKENS_CHAT
        assert chat["usage"]["total_tokens"] == (
            chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
        )

        comp = await _completion(session, vllm)
        assert comp["choices"][0]["text"], "empty completion text"
        assert comp["choices"][0]["finish_reason"] == "length"
        assert comp["usage"]["completion_tokens"] == MAX_TOKENS_COMPLETION

        want_gen = chat["usage"]["completion_tokens"] + comp["usage"]["completion_tokens"]
        want_prompt = chat["usage"]["prompt_tokens"] + comp["usage"]["prompt_tokens"]
        # The engine publishes its counters a little after the response ends: poll.
        deadline = time.monotonic() + 15
        while True:
            gen_after, prompt_after = await _metrics(session, vllm)
            if gen_after - gen_before >= want_gen or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert gen_after - gen_before == want_gen
        assert prompt_after - prompt_before == want_prompt
