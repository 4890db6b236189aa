"""bench/stub.py's server: hand-written HTTP/1.1 on asyncio Protocols, keep-alive, chunked or
close-delimited SSE, every token written at its instant by stub_timers.Timers; one worker's
loop (_serve) and its SO_REUSEPORT socket (_listen)."""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import signal
import socket
import struct
import time
from array import array
from typing import Any

from stub_stats import Lateness, _write_stats
from stub_timers import Timers, _now

TOKEN = " the"


class Config:
    def __init__(self, a: argparse.Namespace) -> None:
        self.ttft_ns = int(a.ttft * 1e9)
        self.itl_ns = int(a.itl * 1e9)
        self.tokens = a.tokens
        self.eos_after = a.eos_after
        self.chunked = a.framing == "chunked"
        self.model = a.model


class State:
    def __init__(
        self, counter: mmap.mmap | None = None, slot: int = 0, arrivals: bool = False
    ) -> None:
        self.requests = 0
        self.tokens = 0
        self.connections = 0  # TCP connections accepted: keep-alive reuse shows here
        self.done = 0  # answers finished (a streamed one at its [DONE])
        self.counter = counter  # shared with the bench harness: (done, tokens) per worker
        self.slot = slot * 16
        self.arrivals: array[int] | None = array("q") if arrivals else None
        self.late = Lateness()  # every token write
        self.ttft_late = Lateness()  # first token write only
        self.templates: dict[tuple[str, bool], tuple[bytes, bytes, bytes]] = {}


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
}


def _framed(data: bytes, chunked: bool) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data


class Stream:
    """One streamed answer in progress."""

    __slots__ = ("chat", "conn", "due0", "i", "include_usage", "model", "n", "prompt_tokens")

    def __init__(
        self,
        conn: Conn,
        model: str,
        chat: bool,
        n: int,
        due0: int,
        include_usage: bool,
        prompt_tokens: int,
    ) -> None:
        self.conn = conn
        self.model = model
        self.chat = chat
        self.n = n
        self.i = 0
        self.due0 = due0
        self.include_usage = include_usage
        self.prompt_tokens = prompt_tokens


class Conn(asyncio.Protocol):
    def __init__(self, cfg: Config, st: State, timers: Timers) -> None:
        self.cfg = cfg
        self.st = st
        self.timers = timers
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.st.connections += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy and not self.closed:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buf) > 65536:
                    self._simple(413, b'{"error":"headers too large"}', close=True)
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self._simple(400, b'{"error":"bad request line"}', close=True)
                return
            length = 0
            close = version == "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip())
                elif name == "connection":
                    v = value.strip().lower()
                    close = v == "close" or (close and v != "keep-alive")
                elif name == "transfer-encoding" and "chunked" in value.lower():
                    self._simple(411, b'{"error":"send content-length"}', close=True)
                    return
            body_end = head_end + 4 + length
            if len(self.buf) < body_end:
                return
            body = self.buf[head_end + 4 : body_end]
            self.buf = self.buf[body_end:]
            self.close_after = close
            self._handle(method, target.split("?", 1)[0], body)

    # --- routing ----------------------------------------------------------------------------

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if path in ("/health", "/healthz", "/ping"):
            self._simple(200, b"{}")
        elif path == "/v1/models":
            m = self.cfg.model
            self._simple(
                200,
                json.dumps(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": m,
                                "object": "model",
                                "created": 0,
                                "owned_by": "stub",
                                "root": m,
                                "max_model_len": 1 << 20,
                            }
                        ],
                    }
                ).encode(),
            )
        elif path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                self._simple(405, b'{"error":"POST only"}')
                return
            self._completion(path == "/v1/chat/completions", body)
        else:
            self._simple(404, b'{"error":"not found"}')

    def _simple(
        self, status: int, body: bytes, *, close: bool = False, ctype: bytes = b"application/json"
    ) -> None:
        close = close or self.close_after
        t = self.transport
        if t is None or self.closed:
            return
        t.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (
                status,
                _REASONS.get(status, "OK").encode(),
                ctype,
                len(body),
                b"connection: close\r\n" if close else b"",
                body,
            )
        )
        if close:
            self.closed = True
            t.close()

    def _completion(self, chat: bool, body: bytes) -> None:
        now = _now()
        try:
            req = json.loads(body)
        except ValueError:
            req = None
        if type(req) is not dict:
            self._simple(400, b'{"error":{"type":"BadRequestError","message":"not JSON"}}')
            return
        cfg = self.cfg
        n = req.get("max_tokens") or req.get("max_completion_tokens") or cfg.tokens
        if cfg.eos_after and not req.get("ignore_eos"):
            n = min(n, cfg.eos_after)
        n = max(1, int(n))
        model = str(req.get("model") or cfg.model)
        if chat:
            msgs = req.get("messages") or []
            text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            text = str(req.get("prompt", ""))
        prompt_tokens = len(text.split())
        self.st.requests += 1
        if self.st.arrivals is not None:
            self.st.arrivals.append(now)
        if not req.get("stream"):
            self.busy = True
            due = now + cfg.ttft_ns + (n - 1) * cfg.itl_ns
            self.timers.at(due, self._json_due, model, chat, n, prompt_tokens)
            return
        opts = req.get("stream_options") or {}
        s = Stream(
            self, model, chat, n, now + cfg.ttft_ns, bool(opts.get("include_usage")), prompt_tokens
        )
        self.busy = True
        assert self.transport is not None
        if cfg.chunked:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; "
                b"charset=utf-8\r\ncache-control: no-cache\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
        else:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; "
                b"charset=utf-8\r\ncache-control: no-cache\r\n"
                b"connection: close\r\n\r\n"
            )
        self.timers.at(s.due0, _emit, s)

    def _json_due(self, due: int, model: str, chat: bool, n: int, prompt_tokens: int) -> None:
        self.st.late.add(_now() - due)
        self.st.tokens += n
        text = TOKEN * n
        choice: dict[str, object] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        doc = {
            "id": "cmpl-stub",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            },
        }
        self.busy = False
        self._simple(200, json.dumps(doc).encode())
        _finished(self.st, n)
        self._next()

    def _next(self) -> None:
        """After an answer: serve a pipelined request already buffered."""
        if self.buf and not self.closed:
            self.data_received(b"")


def _finished(st: State, n: int) -> None:
    st.done += 1
    if st.counter is not None:
        struct.pack_into("<QQ", st.counter, st.slot, st.done, st.tokens)


def _templates(st: State, model: str, chat: bool) -> tuple[bytes, bytes, bytes]:
    """(first-token prefix: the role chunk, a token event, the last token event) as SSE bytes."""
    key = (model, chat)
    t = st.templates.get(key)
    if t is not None:
        return t
    created = int(time.time())
    if chat:
        obj, base = (
            "chat.completion.chunk",
            {"id": "chatcmpl-stub", "created": created, "model": model},
        )

        def ev(delta: dict[str, object], finish: str | None) -> bytes:
            doc = {
                **base,
                "object": obj,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        role = ev({"role": "assistant", "content": ""}, None)
        tok = ev({"content": TOKEN}, None)
        last = ev({"content": TOKEN}, "length")
    else:
        base = {"id": "cmpl-stub", "object": "text_completion", "created": created, "model": model}

        def evc(finish: str | None) -> bytes:
            doc = {
                **base,
                "choices": [{"index": 0, "text": TOKEN, "logprobs": None, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

        role, tok, last = b"", evc(None), evc("length")
    st.templates[key] = t = (role, tok, last)
    return t


def _emit(due: int, s: Stream) -> None:
    """Timer callback: write token ``s.i`` (and the ones due with it when itl is 0)."""
    conn = s.conn
    if conn.closed or conn.transport is None:
        return
    st = conn.st
    cfg = conn.cfg
    late = _now() - due
    st.late.add(late)
    if s.i == 0:
        st.ttft_late.add(late)
    role, tok, last = _templates(st, s.model, s.chat)
    parts = [role] if s.i == 0 else []
    itl = cfg.itl_ns
    while True:
        s.i += 1
        parts.append(last if s.i == s.n else tok)
        if s.i == s.n or itl > 0:
            break
    if s.i < s.n:
        conn.transport.write(_framed(b"".join(parts), cfg.chunked))
        conn.timers.at(s.due0 + s.i * itl, _emit, s)
        return
    st.tokens += s.n
    _finished(st, s.n)
    if s.include_usage:
        usage = {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.n,
            "total_tokens": s.prompt_tokens + s.n,
        }
        doc: dict[str, Any] = {
            "id": "chatcmpl-stub" if s.chat else "cmpl-stub",
            "object": "chat.completion.chunk" if s.chat else "text_completion",
            "created": int(time.time()),
            "model": s.model,
            "choices": [],
            "usage": usage,
        }
        parts.append(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    payload = b"".join(parts)
    t = conn.transport
    if cfg.chunked:
        t.write(_framed(payload, True) + b"0\r\n\r\n")
        conn.busy = False
        if conn.close_after:
            conn.closed = True
            t.close()
        else:
            conn._next()
    else:
        t.write(payload)
        conn.closed = True
        t.close()


async def _serve(
    cfg: Config, sock: socket.socket, stats_path: str | None, precise: bool, st: State
) -> None:
    loop = asyncio.get_running_loop()
    timers = Timers(loop, precise)
    server = await loop.create_server(lambda: Conn(cfg, st, timers), sock=sock)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        if stats_path:
            doc = {
                "pid": os.getpid(),
                "timerfd": timers.fd >= 0,
                "requests": st.requests,
                "connections": st.connections,
                "tokens": st.tokens,
                "late": st.late.doc(),
                "ttft_late": st.ttft_late.doc(),
            }
            _write_stats(stats_path, doc, st.arrivals)


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock
