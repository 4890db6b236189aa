"""A hostile OpenAI-compatible server for the fault tests: raw asyncio, so it can misbehave
at the byte level (aiohttp's server would refuse to send most of this).

The first path segment picks the behaviour, so one server serves every fault side by
side: a target with ``base_url: http://127.0.0.1:PORT/<mode>`` posts to
``/<mode>/v1/chat/completions`` and gets that mode's answer. ``MODES`` lists them with
the error kind soakd must record (``None``: a success).

Run it in a thread of the test process (``serve_hostile()``, a context manager), or as
its own process: ``python -m tests.hostile_server --port N`` (prints ``{"port": N}``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"
HEAD_LIMIT = 64 << 10
BODY_LIMIT = 8 << 20
HUGE_LINE_BYTES = 100 << 20  # the "100 MB single line"
PIECE = 64 << 10


def chunk(text: object = None, finish: str | None = None, **extra: Any) -> bytes:
    """One chat.completion.chunk SSE event."""
    delta = {"content": text} if text is not None else {}
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish:
        choice["finish_reason"] = finish
    body = {"id": "h-1", "object": "chat.completion.chunk", "choices": [choice], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def usage(n: Any, prompt: Any = 3) -> bytes:
    """The usage chunk; ``n`` and ``prompt`` as given, whatever their type."""
    total = n + 3 if type(n) is int else None
    body = {
        "id": "h-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": total},
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def good_stream(tokens: int) -> list[bytes]:
    parts = [chunk("tok") for _ in range(tokens)]
    return [*parts, chunk(finish="stop"), usage(tokens), DONE]


# mode -> the error kind soakd must record for it (None: the request succeeds)
MODES: dict[str, str | None] = {
    "ok": None,
    "paced": None,  # 20 tokens, 20 ms apart
    "big": None,  # 20 tokens of 1 kB each
    "http10": None,  # HTTP/1.0, no length, the body ends when the connection closes
    "http10_cut": "stream_truncated",  # the same, closed before [DONE]
    "truncated": "stream_truncated",  # chunked encoding, cut without the last chunk
    "reset_mid": "stream_truncated",  # RST after a few tokens
    "reset": "stream_truncated",  # RST as soon as the request is read
    "close": "stream_truncated",  # FIN as soon as the request is read, no answer
    "malformed": "bad_chunk",  # a chunk that is not JSON
    "bad_utf8": "bad_chunk",  # a data line that is not UTF-8
    "bad_shape": "bad_chunk",  # JSON, but choices is a number
    "huge_line": "too_large",  # a 100 MB line without a line end
    "many_lines": "too_large",  # 100 MB of short data lines, never a blank line
    "gzip_bomb": "too_large",  # 100 MB of zeros, gzip-compressed, despite identity
    "huge_headers": "protocol_error",  # a 1 MB header line (aiohttp's parser: 8 KiB)
    "endless": "timeout_total",  # tokens forever (20 a second), never [DONE]
    "stall": "timeout_ttft",  # headers, then silence (slowloris)
    "drip": "timeout_ttft",  # headers, then a comment every 100 ms, never a token
    "no_headers": "timeout_ttft",  # reads the request, never answers
    "wrong_ctype": "bad_response",  # 200 text/html
    "error_200": "bad_response",  # 200 application/json with an error object
    "error_in_stream": "bad_response",  # an error object inside the SSE stream
    "error_200_404": "bad_response",  # the same two with vLLM's unknown model (code 404)
    "error_in_stream_404": "bad_response",
    "garbage": "protocol_error",  # not HTTP at all
    "s429": "http_429",
    "s429ra": "http_429",  # with Retry-After: 1
    "s503": "http_5xx",
    "s503ra": "http_5xx",  # with Retry-After: 1
    "json_huge": "too_large",  # a non-streamed 100 MB JSON body (for stream: false)
    "echo_key": "http_auth",  # 401 echoing the Authorization header everywhere
    "redirect_key": "bad_response",  # 307 to a URL holding the key
    "key_stream": None,  # a good stream whose tokens and ids are the key
    "oom_key": "http_5xx",  # 500 "CUDA out of memory" whose type and code are the key
    # numbers a server gets wrong: the answer is ok, its usage is not taken (USAGE)
    "usage_negative": None,  # usage.completion_tokens -5
    "usage_huge": None,  # 2**70: beyond 64 bits
    "usage_float": None,  # 4.5
    "usage_high": None,  # 1000 for 5 streamed tokens (max_tokens 8)
    "usage_low": None,  # 1 for 5 streamed: taken, and a mismatch
    "json_usage_negative": None,  # non-streamed: 8 tokens of text, completion_tokens -5
    "content_object": "bad_response",  # every delta's content is a JSON object
    "s429_bad_ra": "http_429",  # Retry-After: a digit Python reads and HTTP does not
    "s503_bad_ra": "http_5xx",  # Retry-After: a date that is not one
    "bad_chunk_size": "protocol_error",  # a chunk size line that is not hex, mid-stream
    "bad_status": "protocol_error",  # a status line that is not HTTP's
    "long_body": "protocol_error",  # a body longer than its Content-Length, which cuts it
    "short_body": "stream_truncated",  # Content-Length promises more than comes, then FIN
    "runaway": "too_many_tokens",  # tokens as fast as they go, never a finish
}
USAGE: dict[str, Any] = {
    "usage_negative": -5,
    "usage_huge": 2**70,
    "usage_float": 4.5,
    "usage_high": 1000,
    "usage_low": 1,
}
"""Mode -> the ``usage.completion_tokens`` it sends after ``tokens`` good tokens."""
JSON_MODES = frozenset({"json_huge", "json_usage_negative"})
"""Modes that answer a non-streamed request (``stream: false``): a JSON body, no SSE."""
JSON_TEXT_TOKENS = 8
"""The tokens of text in ``json_usage_negative``'s answer (one word each)."""
BAD_RETRY_AFTER = {"s429_bad_ra": "\u00b2", "s503_bad_ra": "Mon, 32 Foo 2025 25:61:00 GMT"}


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def mode(self) -> str:
        return self.path.lstrip("/").split("/", 1)[0]

    @property
    def key(self) -> str:
        return self.headers.get("authorization", "").removeprefix("Bearer ")


@dataclass
class Stats:
    requests: Counter[str] = field(default_factory=Counter)
    bytes_sent: Counter[str] = field(default_factory=Counter)
    client_gone: Counter[str] = field(default_factory=Counter)  # the client hung up on us
    completed: Counter[str] = field(default_factory=Counter)  # whole answers written
    tokens: Counter[str] = field(default_factory=Counter)  # content chunks written
    connections: int = 0
    open_connections: int = 0
    keys: set[str] = field(default_factory=set)
    other: int = 0  # soakd's /tokenize and /apply-template requests (404 unless tokenize)


class HostileServer:
    """The server. ``start()`` on a running loop, ``aclose()`` to stop."""

    def __init__(
        self, port: int = 0, seed: int = 0, tokens: int = 5, *, tokenize: bool = False
    ) -> None:
        self.port = port
        self.tokens = tokens
        self.tokenize = tokenize  # answer /<mode>/tokenize by the mode too (else 404)
        self.stats = Stats()
        self.random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def url(self, mode: str) -> str:
        return f"http://{HOST}:{self.port}/{mode}"

    async def start(self) -> HostileServer:
        self._server = await asyncio.start_server(self._handle, HOST, self.port, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # --- connection ------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        self.stats.open_connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        mode = "?"
        try:
            req = await self._read_request(reader)
            if req is None:
                return
            path = req.path.split("?")[0]
            if path.endswith(("/tokenize", "/apply-template")):
                # soakd's prompt calibration: not one of the mode's requests; answered by
                # the mode with ``tokenize``, else 404 (a server without a /tokenize)
                self.stats.other += 1
                if not self.tokenize:
                    await self._send(writer, "?", _response(404, b'{"error":"not found"}'))
                    return
            else:
                self.stats.requests[req.mode] += 1
            mode = req.mode
            if req.key:
                self.stats.keys.add(req.key)
            if mode == "random":
                mode = self.random.choice(["ok", "ok", "reset", "reset_mid", "truncated", "close"])
            handler = getattr(self, f"_m_{mode}", None)
            if handler is None:
                await self._send(writer, mode, _response(404, b'{"error":"no such mode"}'))
                return
            await handler(req, writer)
        except (ConnectionError, OSError):
            self.stats.client_gone[mode] += 1
        except asyncio.CancelledError:
            pass
        finally:
            self.stats.open_connections -= 1
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        if len(head) > HEAD_LIMIT:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, version = [*lines[0].split(" "), "", "", ""][:3]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        length = min(int(headers.get("content-length", "0") or 0), BODY_LIMIT)
        body = await reader.readexactly(length) if length else b""
        return Request(method, path, version, headers, body)

    async def _send(self, writer: asyncio.StreamWriter, mode: str, data: bytes) -> None:
        writer.write(data)
        self.stats.bytes_sent[mode] += len(data)
        await writer.drain()

    async def _chunk(self, writer: asyncio.StreamWriter, mode: str, data: bytes) -> None:
        """One HTTP/1.1 chunk."""
        await self._send(writer, mode, b"%x\r\n%s\r\n" % (len(data), data))

    async def _sse_head(self, writer: asyncio.StreamWriter, mode: str, **extra: str) -> None:
        head = {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked", **extra}
        await self._send(writer, mode, _head(200, head))

    async def _stream(self, writer: asyncio.StreamWriter, mode: str, parts: list[bytes]) -> None:
        await self._sse_head(writer, mode)
        for part in parts:
            await self._chunk(writer, mode, part)
        await self._send(writer, mode, b"0\r\n\r\n")
        self.stats.completed[mode] += 1

    def _rst(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    # --- modes ---------------------------------------------------------------------------

    async def _m_ok(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._stream(w, "ok", good_stream(self.tokens))

    async def _m_paced(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "paced")
        for part in good_stream(20):
            await self._chunk(w, "paced", part)
            await asyncio.sleep(0.02)
        await self._send(w, "paced", b"0\r\n\r\n")
        self.stats.completed["paced"] += 1

    async def _m_big(self, req: Request, w: asyncio.StreamWriter) -> None:
        parts = [chunk("b" * 1024) for _ in range(20)]
        await self._stream(w, "big", [*parts, chunk(finish="stop"), usage(20), DONE])

    async def _m_http10(self, req: Request, w: asyncio.StreamWriter, cut: bool = False) -> None:
        mode = "http10_cut" if cut else "http10"
        head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
        await self._send(w, mode, head)
        parts = good_stream(self.tokens)
        for part in parts[:2] if cut else parts:
            await self._send(w, mode, part)
            await asyncio.sleep(0.005)
        w.close()  # the end of the body
        self.stats.completed[mode] += 1

    async def _m_http10_cut(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._m_http10(req, w, cut=True)

    async def _m_truncated(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "truncated")
        await self._chunk(w, "truncated", chunk("a") + chunk("b"))
        await self._chunk(w, "truncated", b'data: {"choices": [{"delta": {"cont')
        w.close()  # no terminating chunk: the body is incomplete

    async def _m_reset_mid(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "reset_mid")
        await self._chunk(w, "reset_mid", chunk("a") + chunk("b"))
        await asyncio.sleep(0.02)
        self._rst(w)

    async def _m_reset(self, req: Request, w: asyncio.StreamWriter) -> None:
        self._rst(w)

    async def _m_close(self, req: Request, w: asyncio.StreamWriter) -> None:
        w.close()

    async def _m_malformed(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._stream(w, "malformed", [chunk("a"), b"data: {this is not json\n\n", DONE])

    async def _m_bad_utf8(self, req: Request, w: asyncio.StreamWriter) -> None:
        bad = b'data: {"choices": [{"index": 0, "delta": {"content": "\xff\xfe\xc3"}}]}\n\n'
        await self._stream(w, "bad_utf8", [chunk("a"), bad, DONE])

    async def _m_bad_shape(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._stream(w, "bad_shape", [chunk("a"), b'data: {"choices": 7}\n\n', DONE])

    async def _m_huge_line(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "huge_line")
        await self._chunk(w, "huge_line", chunk("a") + b"data: ")
        piece = b"x" * PIECE
        for _ in range(HUGE_LINE_BYTES // PIECE):
            await self._chunk(w, "huge_line", piece)  # raises once soakd hangs up
        await self._chunk(w, "huge_line", b"\n\n" + DONE)
        await self._send(w, "huge_line", b"0\r\n\r\n")

    async def _m_many_lines(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "many_lines")
        await self._chunk(w, "many_lines", chunk("a"))
        line = b"data: " + b"y" * 1000 + b"\n"
        piece = line * (PIECE // len(line))
        for _ in range(HUGE_LINE_BYTES // len(piece)):
            await self._chunk(w, "many_lines", piece)
        await self._chunk(w, "many_lines", b"\n" + DONE)
        await self._send(w, "many_lines", b"0\r\n\r\n")

    async def _m_gzip_bomb(self, req: Request, w: asyncio.StreamWriter) -> None:
        bomb = _gzip_bomb()
        head = {
            "Content-Type": "text/event-stream",
            "Content-Encoding": "gzip",
            "Content-Length": str(len(bomb)),
        }
        await self._send(w, "gzip_bomb", _head(200, head))
        for i in range(0, len(bomb), PIECE):
            await self._send(w, "gzip_bomb", bomb[i : i + PIECE])

    async def _m_huge_headers(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._send(w, "huge_headers", b"HTTP/1.1 200 OK\r\nX-Huge: ")
        piece = b"h" * PIECE
        for _ in range((1 << 20) // PIECE):
            await self._send(w, "huge_headers", piece)
        await self._send(w, "huge_headers", b"\r\nContent-Length: 0\r\n\r\n")

    async def _m_endless(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "endless")
        while True:
            await self._chunk(w, "endless", chunk("t"))
            await asyncio.sleep(0.05)  # slow enough to meet the total deadline first

    async def _m_stall(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "stall")
        await asyncio.sleep(3600)

    async def _m_drip(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "drip")
        while True:
            await self._chunk(w, "drip", b":\n")
            await asyncio.sleep(0.1)

    async def _m_no_headers(self, req: Request, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async def _m_wrong_ctype(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._send(w, "wrong_ctype", _response(200, b"<html>hi</html>", "text/html"))

    async def _m_error_200(self, req: Request, w: asyncio.StreamWriter) -> None:
        body = json.dumps({"error": {"message": "boom", "type": "server_error", "code": 500}})
        await self._send(w, "error_200", _response(200, body.encode()))

    async def _m_error_in_stream(self, req: Request, w: asyncio.StreamWriter) -> None:
        err = json.dumps({"error": {"message": "boom", "type": "server_error", "code": 500}})
        await self._stream(w, "error_in_stream", [chunk("a"), f"data: {err}\n\n".encode()])

    async def _m_error_200_404(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._send(w, "error_200_404", _response(200, _UNKNOWN_MODEL))

    async def _m_error_in_stream_404(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._stream(w, "error_in_stream_404", [b"data: " + _UNKNOWN_MODEL + b"\n\n"])

    async def _m_garbage(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._send(w, "garbage", b"\x00\x01SSH-2.0-what\r\n\r\n" * 10)
        w.close()

    async def _status(self, mode: str, w: asyncio.StreamWriter, code: int, ra: bool | str) -> None:
        body = json.dumps({"error": {"message": "slow down", "type": "rate_limit", "code": code}})
        extra = {"Retry-After": "1" if ra is True else ra} if ra else {}
        await self._send(w, mode, _response(code, body.encode(), **extra))

    async def _m_s429(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s429", w, 429, False)

    async def _m_s429ra(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s429ra", w, 429, True)

    async def _m_s503(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s503", w, 503, False)

    async def _m_s503ra(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s503ra", w, 503, True)

    async def _m_s429_bad_ra(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s429_bad_ra", w, 429, BAD_RETRY_AFTER["s429_bad_ra"])

    async def _m_s503_bad_ra(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._status("s503_bad_ra", w, 503, BAD_RETRY_AFTER["s503_bad_ra"])

    async def _usage(self, mode: str, w: asyncio.StreamWriter) -> None:
        n = self.tokens
        parts = [chunk("tok") for _ in range(n)]
        self.stats.tokens[mode] += n
        await self._stream(w, mode, [*parts, chunk(finish="stop"), usage(USAGE[mode]), DONE])

    async def _m_usage_negative(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._usage("usage_negative", w)

    async def _m_usage_huge(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._usage("usage_huge", w)

    async def _m_usage_float(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._usage("usage_float", w)

    async def _m_usage_high(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._usage("usage_high", w)

    async def _m_usage_low(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._usage("usage_low", w)

    async def _m_json_usage_negative(self, req: Request, w: asyncio.StreamWriter) -> None:
        mode = "json_usage_negative"
        n = JSON_TEXT_TOKENS
        body = {
            "id": "h-1",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(["tok"] * n)},
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": -5, "total_tokens": -2},
        }
        self.stats.tokens[mode] += n
        await self._send(w, mode, _response(200, json.dumps(body).encode()))
        self.stats.completed[mode] += 1

    async def _m_content_object(self, req: Request, w: asyncio.StreamWriter) -> None:
        n = self.tokens
        parts = [chunk({"text": "tok"}) for _ in range(n)]
        self.stats.tokens["content_object"] += n
        await self._stream(w, "content_object", [*parts, chunk(finish="stop"), usage(n), DONE])

    async def _m_bad_chunk_size(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "bad_chunk_size")
        await self._chunk(w, "bad_chunk_size", chunk("a"))
        self.stats.tokens["bad_chunk_size"] += 1
        await asyncio.sleep(0.05)  # the first token is read on its own, then the framing breaks
        await self._send(w, "bad_chunk_size", b"zz\r\n" + chunk("b") + b"\r\n")
        await asyncio.sleep(3600)  # the connection stays open: only the framing is wrong

    async def _m_bad_status(self, req: Request, w: asyncio.StreamWriter) -> None:
        body = b"".join(good_stream(self.tokens))
        head = b"HTTP/1.1 2x0 OK\r\nContent-Type: text/event-stream\r\n"
        await self._send(w, "bad_status", head + b"Content-Length: %d\r\n\r\n" % len(body))
        await self._send(w, "bad_status", body)
        await asyncio.sleep(3600)

    async def _m_long_body(self, req: Request, w: asyncio.StreamWriter) -> None:
        tokens = b"".join(chunk("tok") for _ in range(self.tokens))
        body = tokens + b"".join([chunk(finish="stop"), usage(self.tokens), DONE])
        # the length ends 10 bytes into the finish chunk: the stream looks cut there
        head = {"Content-Type": "text/event-stream", "Content-Length": str(len(tokens) + 10)}
        await self._send(w, "long_body", _head(200, head))
        await asyncio.sleep(0.02)  # the head is read on its own, then the whole body at once
        await self._send(w, "long_body", body)
        self.stats.tokens["long_body"] += self.tokens
        await asyncio.sleep(3600)

    async def _m_short_body(self, req: Request, w: asyncio.StreamWriter) -> None:
        parts = [chunk("tok") for _ in range(self.tokens)]
        body = b"".join(parts)
        head = {"Content-Type": "text/event-stream", "Content-Length": str(len(body) + 100)}
        await self._send(w, "short_body", _head(200, head) + body)
        self.stats.tokens["short_body"] += self.tokens
        await asyncio.sleep(0.05)
        w.close()  # 100 bytes short of what the head promised

    async def _m_runaway(self, req: Request, w: asyncio.StreamWriter) -> None:
        await self._sse_head(w, "runaway")
        piece = chunk("t") * 64
        data = b"%x\r\n%s\r\n" % (len(piece), piece)
        while True:  # until soakd hangs up (a failed write ends the handler)
            w.write(data)
            self.stats.bytes_sent["runaway"] += len(data)
            self.stats.tokens["runaway"] += 64
            await w.drain()
            await asyncio.sleep(0)  # drain() does not yield below its high-water mark

    async def _m_json_huge(self, req: Request, w: asyncio.StreamWriter) -> None:
        head = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        await self._send(w, "json_huge", _head(200, head))
        await self._chunk(w, "json_huge", b'{"choices": [{"text": "')
        piece = b"z" * PIECE
        for _ in range(HUGE_LINE_BYTES // PIECE):
            await self._chunk(w, "json_huge", piece)
        await self._chunk(w, "json_huge", b'"}]}')
        await self._send(w, "json_huge", b"0\r\n\r\n")

    async def _m_echo_key(self, req: Request, w: asyncio.StreamWriter) -> None:
        key = req.key
        body = json.dumps(
            {
                "error": {
                    "message": f"Incorrect API key provided: {key}",
                    "type": key,
                    "code": key,
                    "param": req.headers.get("authorization", ""),
                },
                key: key,
            }
        ).encode()
        await self._send(w, "echo_key", _response(401, body, **{"WWW-Authenticate": key}))

    async def _m_redirect_key(self, req: Request, w: asyncio.StreamWriter) -> None:
        loc = f"http://{HOST}:{self.port}/ok/v1/chat/completions?api_key={req.key}"
        await self._send(w, "redirect_key", _response(307, req.key.encode(), Location=loc))

    async def _m_oom_key(self, req: Request, w: asyncio.StreamWriter) -> None:
        key = req.key
        body = json.dumps(
            {
                "error": {"message": f"CUDA out of memory (key {key})", "type": key, "code": key},
            }
        ).encode()
        await self._send(w, "oom_key", _response(500, body))

    async def _m_key_stream(self, req: Request, w: asyncio.StreamWriter) -> None:
        key = req.key
        parts = [chunk(key, id=key, model=key) for _ in range(self.tokens)]
        await self._stream(w, "key_stream", [*parts, chunk(finish="stop"), usage(3), DONE])


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join([*lines, "Connection: close", "", ""])).encode()


def _response(status: int, body: bytes, ctype: str = "application/json", **headers: str) -> bytes:
    head = {"Content-Type": ctype, "Content-Length": str(len(body)), **headers}
    return _head(status, head) + body


_UNKNOWN_MODEL = json.dumps(
    {
        "error": {
            "message": "The model `m` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
    }
).encode()
"""vLLM's answer for a model it does not serve, as an error object of a 200."""

_BOMB: bytes | None = None


def _gzip_bomb() -> bytes:
    """100 MB of zeros in one line (no line end), gzip-compressed (about 100 kB)."""
    global _BOMB
    if _BOMB is None:
        zero = b"data: " + b"0" * (1 << 20)
        gz = gzip.compress(zero, 9)
        # gzip members concatenate: 100 one-MiB members decode to one 100 MiB line
        _BOMB = gz * (HUGE_LINE_BYTES >> 20)
    return _BOMB


# --- running it --------------------------------------------------------------------------


class LoopThread:
    """An event loop in a daemon thread: servers the tests talk to without sharing the
    test's own loop (nor soakd's, when soakd runs in-process)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Awaitable[Any]], timeout: float = 10) -> Any:
        async def run() -> Any:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def serve_hostile(**kwargs: Any) -> Iterator[HostileServer]:
    """A HostileServer on 127.0.0.1 (a free port unless ``port`` is given), in a thread."""
    lt = LoopThread()
    server = HostileServer(**kwargs)
    try:
        lt.call(server.start)
        yield server
    finally:
        lt.call(server.aclose)
        lt.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()

    async def run() -> None:
        server = await HostileServer(args.port).start()
        print(json.dumps({"port": server.port}), flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
