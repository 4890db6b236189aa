"""OpenAI target against real local servers: what a user reads from each Outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from soakd.config import ConfigError, TargetConfig
from soakd.model import ErrorKind, Outcome, RequestSpec
from soakd.targets import open_target
from soakd.targets import openai as openai_target
from soakd.types import NotSent
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(20)]

KEY = "sk-test-SECRET-0123456789"
KEY_ENV = "SOAKD_TEST_OPENAI_KEY"

Scenario = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "choices": [
            {"index": 0, "delta": delta or {}, **({"finish_reason": finish} if finish else {})}
        ],
        **extra,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


USAGE = chunk(usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
DONE = b"data: [DONE]\n\n"
ERROR = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "auth_error",
                   "param": None, "code": "invalid_api_key"}}  # fmt: skip
OOM = {"error": {"message": "CUDA out of memory. Tried to allocate 2.00 GiB",
                 "type": "internal_server_error", "param": None, "code": 500}}  # fmt: skip


async def sse(request: web.Request, parts: list[bytes | float]) -> web.StreamResponse:
    """Stream ``parts``: bytes are written, floats are pauses in seconds."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for part in parts:
        if isinstance(part, float):
            await asyncio.sleep(part)
        else:
            await resp.write(part)
    await resp.write_eof()
    return resp


async def good(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.headers["X-Team"] == "soak"
    assert request.content_type == "application/json"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["max_tokens"] == 16
    assert body["temperature"] == 0.5
    assert body["top_p"] == 0.9  # from extra_body
    return await sse(
        request,
        [
            b": keep-alive\n\ndata:\n\n",  # a comment, then an empty data keep-alive
            chunk({"role": "assistant", "content": ""}),
            0.01,
            chunk({"content": "Hel"}),
            0.01,
            chunk({"reasoning_content": "hmm"}) + chunk({"content": "lo"}),  # one read
            0.01,
            chunk({"content": "!"}),
            chunk({}, finish="stop"),
            USAGE,  # LiteLLM's shape: choices [{"index":0,"delta":{}}]
            DONE,
        ],
    )


async def no_done(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    parts: list[bytes | float] = [chunk({"content": "a"}), chunk({"content": "b"}, finish="length")]
    return await sse(request, parts)


async def no_usage(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    parts: list[bytes | float] = [chunk({"content": "a"}), chunk({"content": "b"}), DONE]
    return await sse(request, parts)


async def completions(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    assert request.path.endswith("/v1/completions")
    assert body["prompt"] == "hello"
    assert "messages" not in body
    text = [b'data: {"choices":[{"index":0,"text":"' + t + b'"}]}\n\n' for t in (b"x", b"y", b"z")]
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}\n\n'
    return await sse(request, [*text, usage, DONE])


async def plain(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    assert body["stream"] is False
    assert "stream_options" not in body
    await asyncio.sleep(0.01)
    return web.json_response(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


async def oom(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response(OOM, status=500)


async def too_many(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response({"error": {"type": "rate_limit_exceeded", "code": None}}, status=429)


async def unauthorized(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response(ERROR, status=401)


async def bad_request(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.Response(status=400, text="<html>" + "x" * 10_000)


async def malformed(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    parts: list[bytes | float] = [chunk({"content": "a"}), b"data: {not json\n\n", DONE]
    return await sse(request, parts)


async def stream_error(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    err = b"data: " + json.dumps(OOM).encode() + b"\n\n"
    return await sse(request, [chunk({"content": "a"}), err, DONE])


async def json_200_error(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response(OOM)


async def html(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.Response(text="<html>maintenance</html>", content_type="text/html")


async def slow_first(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    parts: list[bytes | float] = [chunk({"role": "assistant"}), 5.0, chunk({"content": "late"})]
    return await sse(request, parts)


async def endless(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return await sse(
        request, [part for _ in range(100) for part in (chunk({"content": "t"}), 0.05)]
    )


async def stalls(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Three tokens, then silence: a server that hangs mid-generation."""
    parts: list[bytes | float] = [
        chunk({"content": "a"}),
        chunk({"content": "b"}),
        0.05,
        chunk({"content": "c"}),
        5.0,
        DONE,
    ]
    return await sse(request, parts)


async def huge_line(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    line = b"data: " + b"x" * (1 << 20) + b"\n\n"
    return await sse(request, [chunk({"content": "a"}), line, DONE])


async def cut(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Two tokens, then the connection drops in the middle of the chunked body."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chunk({"content": "a"}) + chunk({"content": "b"}) + b'data: {"cho')
    await asyncio.sleep(0.01)
    assert request.transport is not None
    request.transport.close()
    return resp


SCENARIOS: dict[str, Scenario] = {
    f.__name__: f
    for f in (
        good, no_done, no_usage, completions, plain, oom, too_many, unauthorized, bad_request,
        malformed, stream_error, json_200_error, html, slow_first, endless, stalls, huge_line, cut,
    )
}  # fmt: skip


@dataclass
class Server:
    base: str
    seen: list[tuple[str, str | None]]  # (path, Authorization) of each request
    peers: list[int]  # the client's port of each request: the same port, the same connection

    def url(self, scenario: str) -> str:
        return f"{self.base}/{scenario}"


SEEN = web.AppKey("seen", list[tuple[str, str | None]])
PEERS = web.AppKey("peers", list[int])


async def dispatch(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[SEEN].append((request.path, request.headers.get("Authorization")))
    assert request.transport is not None
    request.app[PEERS].append(request.transport.get_extra_info("peername")[1])
    return await SCENARIOS[request.match_info["scenario"]](request, body)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    app = web.Application()
    app[SEEN] = []
    app[PEERS] = []
    app.router.add_post("/{scenario}/v1/chat/completions", dispatch)
    app.router.add_post("/{scenario}/v1/completions", dispatch)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Server(f"http://127.0.0.1:{runner.addresses[0][1]}", app[SEEN], app[PEERS])
    await runner.cleanup()


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key by reference, and no proxy from the machine running the tests."""
    monkeypatch.setenv(KEY_ENV, KEY)
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                "all_proxy", "NO_PROXY", "no_proxy"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)


def config(base: str, **overrides: Any) -> TargetConfig:
    fields: dict[str, Any] = {
        "name": "local",
        "base_url": base,
        "model": "tiny",
        "api_key_env": KEY_ENV,
        "headers": {"X-Team": "soak"},
        "extra_body": {"top_p": 0.9},
        **overrides,
    }
    return TargetConfig(**fields)


SPEC = RequestSpec(
    target="local", phase="warm", seq=3, prompt="hello", prompt_tokens_hint=1,
    max_tokens=16, temperature=0.5, scheduled_ns=0,
)  # fmt: skip


async def run(cfg: TargetConfig) -> Outcome:
    target = await open_target(cfg)
    try:
        out = await target.send(SPEC)
    finally:
        await target.aclose()
    assert KEY not in out.error_detail
    assert KEY not in repr(target)
    assert KEY not in repr(out)
    assert out.sent_ns > 0
    assert out.end_ns >= out.sent_ns
    assert out.wall_start > 0
    return out


async def scenario(server: Server, name: str, **overrides: Any) -> Outcome:
    return await run(config(server.url(name), **overrides))


async def test_good_stream(server: Server) -> None:
    out = await scenario(server, "good")
    assert out.ok
    assert out.outcome == "ok"
    assert out.error_detail == ""
    assert (out.target, out.phase, out.seq, out.status) == ("local", "warm", 3, 200)
    assert out.usage_reported
    assert out.output_tokens == 7
    assert out.prompt_tokens == 11
    assert out.content_chunks == 4  # role-only and empty chunks are not tokens
    assert len(out.itl_ns) == out.content_chunks - 1
    assert 0 in out.itl_ns  # two tokens that arrived in one read
    assert out.first_byte_ns is not None
    assert out.first_token_ns is not None
    assert out.last_token_ns is not None
    assert out.sent_ns < out.first_byte_ns < out.first_token_ns <= out.last_token_ns <= out.end_ns
    assert sum(out.itl_ns) == out.last_token_ns - out.first_token_ns
    assert out.ttft_ns is not None
    assert 0 < out.ttft_ns <= out.e2e_ns
    assert out.tpot_ns is not None
    assert out.tpot_ns > 0
    assert not out.oom


async def test_connection_is_reused(server: Server) -> None:
    """Once the pool has seen the server keep a connection after a 200 (its probe, held
    up to 0.5 s after the first answer: soakd/targets/pool.py), every later request goes
    out on the one connection."""
    target = await open_target(config(server.url("good")))
    assert target.pool is not None
    try:
        outs = [await target.send(SPEC)]
        await until(lambda: target.pool is not None and target.pool.keeps_after == [200])
        first = len(server.peers)
        outs += [await target.send(SPEC) for _ in range(3)]
    finally:
        await target.aclose()
    assert all(out.ok for out in outs)
    assert len(set(server.peers[first:])) == 1


async def test_past_its_deadline_a_request_is_not_sent(server: Server) -> None:
    """A send reached after its deadline (the sender was behind) raises NotSent(late)
    before anything goes out; one within its deadline is sent."""
    target = await open_target(config(server.url("good")))
    now = time.perf_counter_ns()
    try:
        with pytest.raises(NotSent) as info:
            await target.send(replace(SPEC, scheduled_ns=now - 2_000_000, deadline_ns=now - 1))
        assert server.seen == []
        out = await target.send(replace(SPEC, scheduled_ns=now, deadline_ns=now + 10**12))
    finally:
        await target.aclose()
    assert info.value.reason == "late"
    assert out.ok
    assert len(server.seen) == 1


async def test_stream_cut_midway_keeps_what_arrived(server: Server) -> None:
    out = await scenario(server, "cut")
    assert out.error is ErrorKind.STREAM_TRUNCATED
    assert out.status == 200
    assert out.content_chunks == 2
    assert out.output_tokens == 2
    assert len(out.itl_ns) == 1
    assert out.ttft_ns is not None
    assert out.ttft_ns <= out.e2e_ns


@contextlib.asynccontextmanager
async def raw_server(response: bytes, hold: float = 0.0) -> AsyncIterator[str]:
    """A server that answers every connection with ``response``, then closes it (after
    up to ``hold`` seconds if the client does not close first). Yields its base URL."""
    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
            if hold:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(), hold)
            writer.close()
            await writer.wait_closed()

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.create_task(handle(reader, writer)))

    srv = await asyncio.start_server(track, "127.0.0.1", 0)
    async with srv:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    await asyncio.wait_for(asyncio.gather(*handlers), 2.0)


@pytest.mark.parametrize(
    ("tail", "kind", "detail"),
    [
        (b"", ErrorKind.STREAM_TRUNCATED, "ended before [DONE]"),
        (b'data: {"choi', ErrorKind.STREAM_TRUNCATED, "cut inside an event"),
        (b"data: [DONE]", None, ""),  # a last event without its blank line
        (chunk({}, finish="stop"), None, ""),  # finished, no [DONE]
    ],
)
async def test_clean_eof(tail: bytes, kind: ErrorKind | None, detail: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    async with raw_server(head + chunk({"content": "a"}) + tail) as base:
        out = await run(config(base))
    assert out.error is kind
    assert out.error_detail == detail
    assert out.content_chunks == 1


@pytest.mark.parametrize("hold", [5.0, 0.02])  # the grace ends it / the server drops it
async def test_body_left_open_after_done(monkeypatch: pytest.MonkeyPatch, hold: float) -> None:
    monkeypatch.setattr(openai_target, "DRAIN_GRACE_S", 0.1)
    events = chunk({"content": "a"}, finish="stop") + DONE
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    body = b"%x\r\n%s\r\n" % (len(events), events)  # never the closing 0-length chunk
    async with raw_server(head + body, hold=hold) as base:
        t0 = time.monotonic()
        out = await run(config(base, timeouts={"total": 5}))
        assert time.monotonic() - t0 < 1.0
    assert out.ok, out.error_detail
    assert out.e2e_ns < 0.1e9  # the end is [DONE], not the wait after it


async def test_garbage_instead_of_http() -> None:
    async with raw_server(b"SSH-2.0-OpenSSH_9.6\r\n\r\n") as base:
        out = await run(config(base))
    assert out.error is ErrorKind.PROTOCOL_ERROR
    assert out.error_detail == "invalid http response: BadStatusLine"
    assert out.status == 0


async def test_missing_done_after_finish_is_tolerated(server: Server) -> None:
    out = await scenario(server, "no_done")
    assert out.ok, out.error_detail
    assert out.content_chunks == 2
    assert out.output_tokens == 2
    assert not out.usage_reported


async def test_without_usage_tokens_are_content_chunks(server: Server) -> None:
    out = await scenario(server, "no_usage")
    assert out.ok
    assert not out.usage_reported
    assert out.output_tokens == 2 == out.content_chunks
    assert out.prompt_tokens is None


async def test_completions_api(server: Server) -> None:
    out = await scenario(server, "completions", api="completions")
    assert out.ok
    assert out.output_tokens == 3
    assert out.content_chunks == 3
    assert len(out.itl_ns) == 2
    assert server.seen == [("/completions/v1/completions", f"Bearer {KEY}")]


async def test_not_streaming(server: Server) -> None:
    out = await scenario(server, "plain", stream=False)
    assert out.ok
    assert out.output_tokens == 2
    assert out.prompt_tokens == 5
    assert out.usage_reported
    # No token arrives before the end of a plain response: TTFT is E2E.
    assert out.first_token_ns == out.last_token_ns == out.end_ns
    assert out.ttft_ns == out.e2e_ns
    assert len(out.itl_ns) == 0


async def test_500_with_cuda_oom(server: Server) -> None:
    out = await scenario(server, "oom")
    assert out.error is ErrorKind.HTTP_5XX
    assert out.status == 500
    assert out.oom
    assert out.error_detail == "http 500 internal_server_error 500"
    assert "CUDA" not in out.error_detail  # type and code only, never the message
    assert out.first_token_ns is None
    assert out.ttft_ns is None
    assert out.output_tokens == 0


async def test_429(server: Server) -> None:
    out = await scenario(server, "too_many")
    assert out.error is ErrorKind.HTTP_429
    assert out.status == 429
    assert not out.oom
    assert out.error_detail == "http 429 rate_limit_exceeded"


async def test_401_never_echoes_the_key(server: Server) -> None:
    out = await scenario(server, "unauthorized")
    assert out.error is ErrorKind.HTTP_AUTH
    assert out.status == 401
    assert out.error_detail == "http 401 auth_error invalid_api_key"


async def test_other_4xx_with_a_non_json_body(server: Server) -> None:
    out = await scenario(server, "bad_request")
    assert out.error is ErrorKind.HTTP_4XX
    assert out.error_detail == "http 400"


async def test_malformed_chunk_keeps_what_arrived(server: Server) -> None:
    out = await scenario(server, "malformed")
    assert out.error is ErrorKind.BAD_CHUNK
    assert out.error_detail == "chunk is not JSON"
    assert out.content_chunks == 1
    assert out.output_tokens == 1
    assert out.first_token_ns is not None


async def test_error_object_inside_the_stream(server: Server) -> None:
    out = await scenario(server, "stream_error")
    assert out.error is ErrorKind.BAD_RESPONSE
    assert out.oom
    assert out.content_chunks == 1
    assert out.error_detail == "stream error internal_server_error 500"


async def test_json_error_with_200_for_a_stream(server: Server) -> None:
    out = await scenario(server, "json_200_error")
    assert out.error is ErrorKind.BAD_RESPONSE
    assert out.status == 200
    assert out.oom
    assert out.error_detail == "error body internal_server_error 500"


async def test_json_error_with_200_not_streaming(server: Server) -> None:
    out = await scenario(server, "json_200_error", stream=False)
    assert out.error is ErrorKind.BAD_RESPONSE
    assert out.oom


async def test_wrong_content_type_for_a_stream(server: Server) -> None:
    out = await scenario(server, "html")
    assert out.error is ErrorKind.BAD_RESPONSE
    assert out.error_detail == "expected text/event-stream, got text/html"


async def test_slow_first_token_times_out_on_ttft(server: Server) -> None:
    out = await scenario(server, "slow_first", timeouts={"ttft": 0.2, "total": 3})
    assert out.error is ErrorKind.TIMEOUT_TTFT
    assert out.status == 200
    assert out.first_byte_ns is not None
    assert out.first_token_ns is None
    assert 0.19e9 <= out.e2e_ns < 1e9


async def test_total_timeout_after_the_first_token(server: Server) -> None:
    out = await scenario(server, "endless", timeouts={"ttft": 0.2, "total": 0.4})
    assert out.error is ErrorKind.TIMEOUT_TOTAL
    assert out.first_token_ns is not None
    assert out.content_chunks >= 3
    assert len(out.itl_ns) == out.content_chunks - 1
    assert 0.39e9 <= out.e2e_ns < 1.5e9


async def test_a_silent_stream_is_cut_at_the_idle_limit(server: Server) -> None:
    out = await scenario(server, "stalls", timeouts={"ttft": 1, "idle": 0.3, "total": 4})
    assert out.error is ErrorKind.TIMEOUT_IDLE
    assert out.content_chunks == 3  # what arrived is kept
    assert out.last_token_ns is not None
    silence = out.end_ns - out.last_token_ns
    assert 0.27e9 <= silence < 1.5e9  # cut between 0.9x and 1x idle after the last chunk


async def test_idle_limit_off_leaves_the_total(server: Server) -> None:
    out = await scenario(server, "stalls", timeouts={"ttft": 1, "idle": None, "total": 0.5})
    assert out.error is ErrorKind.TIMEOUT_TOTAL


async def test_line_over_the_limit(server: Server) -> None:
    out = await scenario(server, "huge_line")
    assert out.error is ErrorKind.TOO_LARGE
    assert out.content_chunks == 1


async def test_refused_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    out = await run(config(f"http://127.0.0.1:{port}"))
    assert out.error is ErrorKind.CONNECT_REFUSED
    assert out.status == 0
    assert out.first_byte_ns is None
    assert out.error_detail == "connection refused"


async def test_cancel_records_then_reraises(server: Server) -> None:
    target = await open_target(config(f"{server.base}/slow_first"))
    out = Outcome.planned(SPEC)
    task = asyncio.create_task(target.send(SPEC, out))
    await until(lambda: out.sent_ns > 0, what="the request sent")  # cancelled mid-request
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await target.aclose()
    assert out.error is ErrorKind.CANCELLED
    assert out.end_ns > out.sent_ns


async def test_env_proxy_is_honoured(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # The proxy (our server) receives the absolute URL of a host that does not exist.
    monkeypatch.setenv("HTTP_PROXY", server.base)
    monkeypatch.setenv("NO_PROXY", "")
    out = await run(config("http://model.invalid/good"))
    assert out.ok, out.error_detail


async def test_no_proxy_bypasses_the_env_proxy(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would be refused
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert (await scenario(server, "good")).ok


async def test_no_key_no_authorization_header(server: Server) -> None:
    out = await run(config(server.url("no_done"), api_key_env=None))
    assert out.ok
    assert server.seen == [("/no_done/v1/chat/completions", None)]


async def test_bad_ca_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    cfg = config("https://127.0.0.1:1", api_key_env=None, tls={"ca_file": bad})
    with pytest.raises(ConfigError, match=r"targets\[local\]\.tls\.ca_file"):
        await open_target(cfg)


async def test_repr_and_detail_hold_no_key(server: Server) -> None:
    target = await open_target(config(server.url("unauthorized")))
    try:
        out = await target.send(SPEC)
    finally:
        await target.aclose()
    assert out.error is ErrorKind.HTTP_AUTH
    assert "local" in repr(target)
    assert KEY not in repr(target)
    assert KEY not in repr(out)
    assert KEY not in repr(vars(target))  # no attribute holds the plain key


async def test_explicit_proxy(server: Server) -> None:
    out = await run(config("http://model.invalid/good", proxy=server.base))
    assert out.ok, out.error_detail


async def test_connect_timeout() -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs.
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        await asyncio.sleep(0.05)
        host, port = listener.getsockname()
        out = await run(config(f"http://{host}:{port}", timeouts={"connect": 0.2, "ttft": 5}))
    assert out.error is ErrorKind.TIMEOUT_CONNECT
    assert out.e2e_ns < 2e9


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("tls")
    crt, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.mark.parametrize(
    ("tls", "kind"),
    [
        ({}, ErrorKind.CONNECT_ERROR),  # self-signed: rejected
        ({"ca_file": "CERT"}, None),
        ({"verify": False}, None),
    ],
)
async def test_tls(cert: tuple[Path, Path], tls: dict[str, Any], kind: ErrorKind | None) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    app = web.Application()
    app[SEEN], app[PEERS] = [], []
    app.router.add_post("/{scenario}/v1/chat/completions", dispatch)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    try:
        tls = {k: (cert[0] if v == "CERT" else v) for k, v in tls.items()}
        base = f"https://127.0.0.1:{runner.addresses[0][1]}/no_done"
        out = await run(config(base, tls=tls))
        if kind is None:  # a TLS keep-alive connection is reused: the pool's probe sees
            # the server keep it, and its check of idle connections keeps a live one
            target = await open_target(config(base, tls=tls))
            try:
                outs = [await target.send(SPEC)]
                await until(lambda: target.pool is not None and target.pool.keeps_after == [200])
                outs += [await target.send(SPEC) for _ in range(3)]
            finally:
                await target.aclose()
            assert [o.error for o in outs] == [None] * 4
            assert len(set(app[PEERS][-3:])) == 1, app[PEERS]
    finally:
        await runner.cleanup()
    assert out.error is kind
    if kind is not None:
        assert out.error_detail == "tls certificate rejected"
