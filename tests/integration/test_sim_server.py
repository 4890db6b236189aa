"""The simulator served on 127.0.0.1:0 and spoken to by a real aiohttp client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from soakd.profiles import Profile, get_profile
from soakd.sim.server import RUNTIME, SimServer, run_sim, start_sim
from tests.waiting import eventually

pytestmark = pytest.mark.integration

MODEL = "sim-model"


@contextlib.asynccontextmanager
async def serving(profile: Profile) -> AsyncIterator[tuple[SimServer, aiohttp.ClientSession]]:
    server = await start_sim("127.0.0.1", 0, profile, MODEL)
    try:
        async with aiohttp.ClientSession(base_url=server.url) as session:
            yield server, session
    finally:
        await server.aclose()


@pytest.fixture
async def fast() -> AsyncIterator[tuple[SimServer, aiohttp.ClientSession]]:
    async with serving(get_profile("fast")) as pair:
        yield pair


async def sse_events(resp: aiohttp.ClientResponse) -> list[Any]:
    """Every ``data:`` payload in order, JSON-decoded except the final [DONE]."""
    events: list[Any] = []
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            assert frame.startswith(b"data: "), frame
            payload = frame[len(b"data: ") :].decode()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    assert buffer == b""
    return events


async def scrape(session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.get("/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    """The sum of the samples named ``sample`` whose labels include ``labels``."""
    return float(
        sum(
            s.value
            for f in families.values()
            for s in f.samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


def chat_body(max_tokens: int, *, stream: bool = True, usage: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me about soak tests please"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def test_streamed_chat_is_shaped_like_vllm(fast: tuple[SimServer, Any]) -> None:
    _, session = fast
    before = value(await scrape(session), "vllm:generation_tokens_total")
    async with session.post("/v1/chat/completions", json=chat_body(24)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(resp)

    role, *tokens, usage_chunk, done = events
    assert done == "[DONE]"
    assert role["object"] == "chat.completion.chunk"
    assert role["model"] == MODEL
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 24
    for chunk in tokens:
        assert chunk["id"] == role["id"]
        text = chunk["choices"][0]["delta"]["content"]
        assert text.startswith(" ")
        assert text.strip()
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 23 + ["length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 6, "completion_tokens": 24, "total_tokens": 30}

    after = await scrape(session)
    assert value(after, "vllm:generation_tokens_total") - before == 24
    assert value(after, "vllm:prompt_tokens_total") == 6
    success = value(after, "vllm:request_success_total", finished_reason="length")
    assert success == 1


async def test_streamed_completion_without_usage(fast: tuple[SimServer, Any]) -> None:
    _, session = fast
    body = {"model": MODEL, "prompt": "one two three", "max_tokens": 5, "stream": True}
    async with session.post("/v1/completions", json=body) as resp:
        events = await sse_events(resp)
    *tokens, done = events
    assert done == "[DONE]"
    assert len(tokens) == 5
    assert all(t["object"] == "text_completion" for t in tokens)
    assert all(t["choices"][0]["text"].startswith(" ") for t in tokens)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"


async def test_non_streaming_answers_carry_usage(fast: tuple[SimServer, Any]) -> None:
    _, session = fast
    async with session.post("/v1/chat/completions", json=chat_body(7, stream=False)) as resp:
        assert resp.status == 200
        chat = await resp.json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["finish_reason"] == "length"
    assert len(chat["choices"][0]["message"]["content"].split()) == 7
    assert chat["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 7,
        "total_tokens": 13,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    body = {"prompt": [1, 2, 3, 4], "max_tokens": 3}
    async with session.post("/v1/completions", json=body) as resp:
        completion = await resp.json()
    assert completion["usage"]["prompt_tokens"] == 4
    assert completion["usage"]["completion_tokens"] == 3


async def test_eight_concurrent_streams_all_succeed(fast: tuple[SimServer, Any]) -> None:
    _, session = fast

    async def one(i: int) -> int:
        async with session.post("/v1/chat/completions", json=chat_body(20 + i)) as resp:
            assert resp.status == 200
            events = await sse_events(resp)
        assert events[-2]["usage"]["completion_tokens"] == 20 + i
        return len(events) - 3  # role, usage, [DONE]

    counts = await asyncio.gather(*(one(i) for i in range(8)))
    assert counts == [20 + i for i in range(8)]
    families = await scrape(session)
    assert value(families, "vllm:generation_tokens_total") == sum(counts)
    assert value(families, "vllm:num_requests_running") == 0
    assert value(families, "vllm:kv_cache_usage_perc") == 0
    assert value(families, "vllm:time_to_first_token_seconds_count") == 8
    assert value(families, "vllm:e2e_request_latency_seconds_count") == 8
    itl = value(families, "vllm:inter_token_latency_seconds_count")
    assert itl == sum(counts) - 8


async def test_metrics_page_has_vllm_and_dcgm_names(fast: tuple[SimServer, Any]) -> None:
    _, session = fast
    async with session.get("/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
    families = await scrape(session)
    expected_types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "process_start_time_seconds": "gauge",
        "process_resident_memory_bytes": "gauge",
        "DCGM_FI_DEV_FB_USED": "gauge",
        "DCGM_FI_DEV_FB_FREE": "gauge",
        "DCGM_FI_DEV_GPU_TEMP": "gauge",
        "DCGM_FI_DEV_POWER_USAGE": "gauge",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
        "DCGM_FI_DEV_SM_CLOCK": "gauge",
        "DCGM_FI_DEV_MEM_CLOCK": "gauge",
        "DCGM_FI_DEV_GPU_UTIL": "gauge",
        "DCGM_FI_DEV_XID_ERRORS": "gauge",
    }
    for name, kind in expected_types.items():
        assert families[name].type == kind, name
    running = families["vllm:num_requests_running"].samples[0]
    assert running.labels == {"engine": "0", "model_name": MODEL}
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    fb = families["DCGM_FI_DEV_FB_USED"].samples[0]
    assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= set(fb.labels)
    assert fb.labels["device"] == "nvidia0"


async def test_models_health_and_unknown_model(fast: tuple[SimServer, Any]) -> None:
    _, session = fast
    async with session.get("/health") as resp:
        assert resp.status == 200
    async with session.get("/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    body = chat_body(3) | {"model": "other"}
    async with session.post("/v1/chat/completions", json=body) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["type"] == "NotFoundError"
    assert error["code"] == 404


async def test_output_is_clamped_to_the_context_and_long_prompts_refused() -> None:
    profile = get_profile("fast", max_model_len=40)
    async with serving(profile) as (_, session):
        body = {"prompt": " ".join(["w"] * 30), "max_tokens": 20, "stream": False}
        async with session.post("/v1/completions", json=body) as resp:
            assert (await resp.json())["usage"]["completion_tokens"] == 10
        body = {"prompt": " ".join(["w"] * 40), "max_tokens": 5}
        async with session.post("/v1/completions", json=body) as resp:
            assert resp.status == 400
            assert "maximum context length is 40" in (await resp.json())["error"]["message"]
        async with session.post("/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400


async def test_oom_past_the_batch_limit_is_a_vllm_shaped_500() -> None:
    profile = get_profile("fast", oom_above_running=2, decode_s_per_step=0.005)
    async with serving(profile) as (_, session):

        async def one() -> tuple[int, str]:
            async with session.post("/v1/chat/completions", json=chat_body(30)) as resp:
                return resp.status, await resp.text()

        results = await asyncio.gather(*(one() for _ in range(5)))
        statuses = sorted(s for s, _ in results)
        assert statuses == [200, 200, 500, 500, 500]
        for status, text in results:
            if status == 500:
                error = json.loads(text)["error"]
                assert error["type"] == "InternalServerError"
                assert error["code"] == 500
                assert error["message"].startswith("CUDA out of memory.")
        families = await scrape(session)
        errors = value(families, "vllm:request_success_total", finished_reason="error")
        assert errors == 3


async def test_injected_errors() -> None:
    async with (
        serving(get_profile("fast", error_rate=1.0)) as (_, session),
        session.post("/v1/chat/completions", json=chat_body(3)) as resp,
    ):
        assert resp.status == 500
        assert (await resp.json())["error"]["message"] == "Internal server error"


async def test_a_client_that_hangs_up_aborts_its_request() -> None:
    profile = get_profile("fast", decode_s_per_step=0.01)
    async with serving(profile) as (_, session):
        resp = await session.post("/v1/chat/completions", json=chat_body(1000))
        await resp.content.readuntil(b"\n\n")  # the role chunk and first token arrived
        resp.close()  # drop the connection mid-stream
        for _ in range(100):
            families = await scrape(session)
            aborted = value(families, "vllm:request_success_total", finished_reason="abort")
            if aborted:
                break
            await asyncio.sleep(0.02)
        assert aborted == 1
        assert value(families, "vllm:num_requests_running") == 0
        assert value(families, "vllm:kv_cache_usage_perc") == 0
        written = value(families, "vllm:generation_tokens_total")
        assert 1 <= written < 1000


async def test_a_crashed_engine_fails_streams_and_health(fast: tuple[SimServer, Any]) -> None:
    server, session = fast
    engine = server.app[RUNTIME].engine
    real_step = engine.step
    calls = 0

    def flaky_step() -> Any:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise RuntimeError("boom")
        return real_step()

    engine.step = flaky_step  # type: ignore[method-assign]
    async with session.post("/v1/chat/completions", json=chat_body(50)) as resp:
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 500
    assert 1 <= len(events) - 3 <= 3  # role chunk, the tokens before the crash, error, DONE
    async with session.get("/health") as health:
        assert health.status == 503
    async with session.post("/v1/chat/completions", json=chat_body(5)) as resp:
        assert resp.status == 503


async def test_requests_queue_past_max_num_seqs() -> None:
    profile = get_profile("fast", max_num_seqs=2, decode_s_per_step=0.005)
    async with serving(profile) as (_, session):
        tasks = [
            asyncio.create_task(session.post("/v1/chat/completions", json=chat_body(40)))
            for _ in range(5)
        ]
        seen: list[Any] = []

        async def all_five_in() -> bool:
            seen[:] = [await scrape(session)]
            running = value(seen[0], "vllm:num_requests_running")
            return bool(running + value(seen[0], "vllm:num_requests_waiting") == 5)

        await eventually(all_five_in, what="five requests in the engine")
        families = seen[0]
        assert value(families, "vllm:num_requests_running") == 2
        assert value(families, "vllm:num_requests_waiting") == 3
        for resp in await asyncio.gather(*tasks):
            assert len(await sse_events(resp)) == 43
            resp.release()


async def test_run_sim_serves_until_cancelled() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ready = asyncio.Event()
    task = asyncio.create_task(run_sim("127.0.0.1", port, "edge-4gb", MODEL, ready))
    await asyncio.wait_for(ready.wait(), 5)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/health") as resp,
    ):
        assert resp.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{port}/health")
