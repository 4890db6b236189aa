"""A cheap, exact OpenAI-compatible streaming stub: the known truth for bench/.

Hand-written HTTP/1.1 on asyncio Protocols (no framework): keep-alive, chunked SSE
like uvicorn/vLLM (or close-delimited with ``--framing close``), TCP_NODELAY, one
write per token. ``/v1/chat/completions`` and ``/v1/completions``, streamed or not;
``GET /v1/models``, ``/health``.

Timing truth. Every token of a request is due at an absolute instant measured from
the moment the request's body was read: token i (0-based) at ``ttft + i * itl``.
asyncio's own timers wake through epoll with millisecond resolution (a sleep can be
up to 1 ms late), so the stub keeps its deadlines in a heap behind one Linux
``timerfd`` (ns resolution, armed at the earliest deadline): tokens leave within
tens of microseconds of their instant. Each worker measures how late every write
really was and writes it to ``--stats-dir`` on exit, so a benchmark can show the
stub's own error next to the clients'.

Token count: ``max_tokens`` (or ``max_completion_tokens``) from the request, else
``--tokens``; with ``--eos-after N`` a request stops after N tokens unless it sends
``ignore_eos: true``. Every token is the text " the" (one token for Llama/GPT BPE
tokenizers, so a client counting with a tokenizer agrees with ``usage``). ``usage``
is sent with ``stream_options.include_usage`` (as vLLM does) and always in a
non-streamed answer.

    .venv/bin/python bench/stub.py --port 8000 --ttft 0.05 --itl 0.005 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import heapq
import json
import mmap
import os
import signal
import socket
import struct
import sys
import time
from array import array
from collections.abc import Callable
from itertools import count
from typing import Any

_now = time.perf_counter_ns  # CLOCK_MONOTONIC, the clock of timerfd below
TOKEN = " the"

# --- a precise timer: timerfd via ctypes (Linux), asyncio's call_at elsewhere -----------------


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Timers:
    """Deadline heap on one timerfd. ``at(deadline_ns, fn, *args)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, precise: bool = True) -> None:
        self.loop = loop
        self.heap: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self.seq = count()
        self.armed = 0
        self.fd = -1
        if precise and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fd = libc.timerfd_create(1, os.O_NONBLOCK | os.O_CLOEXEC)  # CLOCK_MONOTONIC
                if fd >= 0:
                    self.fd = fd
                    self._settime = libc.timerfd_settime
                    self._spec = _Itimerspec()
                    loop.add_reader(fd, self._fire)
            except (OSError, AttributeError):
                self.fd = -1
        self._handle: asyncio.TimerHandle | None = None

    def at(self, deadline_ns: int, fn: Callable[..., None], *args: object) -> None:
        heapq.heappush(self.heap, (deadline_ns, next(self.seq), fn, args))
        if self.heap[0][0] == deadline_ns and (self.armed == 0 or deadline_ns < self.armed):
            self._arm(deadline_ns)

    def _arm(self, deadline_ns: int) -> None:
        self.armed = deadline_ns
        if self.fd >= 0:
            spec = self._spec
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(1, deadline_ns), 10**9)
            self._settime(self.fd, 1, ctypes.byref(spec), None)  # TFD_TIMER_ABSTIME
        else:
            if self._handle is not None:
                self._handle.cancel()
            delay = max(0.0, (deadline_ns - _now()) / 1e9)
            self._handle = self.loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        if self.fd >= 0:
            try:  # noqa: SIM105 (every timer's wake-up: no context manager on this path)
                os.read(self.fd, 8)
            except BlockingIOError:
                pass
        self.armed = 0
        heap = self.heap
        now = _now()
        while heap and heap[0][0] <= now + 20_000:  # within 20 us: due
            deadline, _, fn, args = heapq.heappop(heap)
            fn(deadline, *args)
            now = _now()
        if heap:
            self._arm(heap[0][0])


# --- lateness statistics ---------------------------------------------------------------------


class Lateness:
    """How late writes left: 10 us buckets up to 20 ms, then one overflow bucket."""

    WIDTH_NS = 10_000
    NBUCKETS = 2001

    def __init__(self) -> None:
        self.n = 0
        self.total_ns = 0
        self.max_ns = 0
        self.buckets = [0] * self.NBUCKETS

    def add(self, late_ns: int) -> None:
        late_ns = max(0, late_ns)
        self.n += 1
        self.total_ns += late_ns
        if late_ns > self.max_ns:
            self.max_ns = late_ns
        self.buckets[min(self.NBUCKETS - 1, late_ns // self.WIDTH_NS)] += 1

    def quantile_ms(self, q: float) -> float | None:
        """Upper edge of the bucket holding the q-quantile (ms)."""
        if not self.n:
            return None
        rank, seen = q * self.n, 0
        for i, c in enumerate(self.buckets):
            seen += c
            if seen >= rank:
                return (i + 1) * self.WIDTH_NS / 1e6
        return self.max_ns / 1e6

    def doc(self) -> dict[str, object]:
        return {
            "n": self.n,
            "total_ns": self.total_ns,
            "max_ns": self.max_ns,
            "buckets_10us": self.buckets,
        }


# --- the server ------------------------------------------------------------------------------


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


def _write_stats(path: str, doc: dict[str, Any], arrivals: array[int] | None) -> None:
    """A worker's stats at exit, once its server has closed (nothing left to delay)."""
    if arrivals is not None:
        with open(path[:-5] + ".arrivals", "wb") as f:
            arrivals.tofile(f)
    with open(path, "w") as f:
        json.dump(doc, f)


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def read_counter(path: str) -> tuple[int, int]:
    """(answers finished, tokens sent) summed over the workers of a --counter-file."""
    with open(path, "rb") as f:
        data = f.read()
    done = tok = 0
    for i in range(0, len(data) - 15, 16):
        d, t = struct.unpack_from("<QQ", data, i)
        done += d
        tok += t
    return done, tok


def merge_stats(paths: list[str]) -> dict[str, object]:
    """Sum the workers' stats files: requests, tokens, write lateness mean/p50/p99/max (ms)."""
    req = tok = conns = 0
    out: dict[str, object] = {}
    agg: dict[str, Lateness] = {"late": Lateness(), "ttft_late": Lateness()}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        req += d["requests"]
        tok += d["tokens"]
        conns += d.get("connections", 0)
        for k, lat in agg.items():
            lat.n += d[k]["n"]
            lat.total_ns += d[k]["total_ns"]
            lat.max_ns = max(lat.max_ns, d[k]["max_ns"])
            lat.buckets = [a + b for a, b in zip(lat.buckets, d[k]["buckets_10us"], strict=True)]
    out["requests"], out["tokens"], out["connections"] = req, tok, conns
    for k, lat in agg.items():
        out[k] = {
            "n": lat.n,
            "mean_ms": lat.total_ns / lat.n / 1e6 if lat.n else None,
            "p50_ms": lat.quantile_ms(0.5),
            "p99_ms": lat.quantile_ms(0.99),
            "max_ms": lat.max_ns / 1e6,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: pick a free one (printed)")
    ap.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    ap.add_argument("--itl", type=float, default=0.005, help="seconds between tokens")
    ap.add_argument("--tokens", type=int, default=16, help="when the request has no max_tokens")
    ap.add_argument(
        "--eos-after",
        type=int,
        default=0,
        help="stop after N tokens unless the request sets ignore_eos",
    )
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--framing", choices=["chunked", "close"], default="chunked")
    ap.add_argument("--workers", type=int, default=1, help="processes (SO_REUSEPORT)")
    ap.add_argument("--stats-dir", help="each worker writes its lateness stats here on exit")
    ap.add_argument("--counter-file", help="live (done, tokens) per worker: u64 pairs, mmapped")
    ap.add_argument(
        "--arrivals",
        action="store_true",
        help="record every request's arrival (ns) to --stats-dir on exit",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="lower (negative: raise) the stub's nice value, so it wakes on time "
        "on a busy machine; ignored when not permitted",
    )
    ap.add_argument(
        "--imprecise",
        action="store_true",
        help="use asyncio's timers (about 1 ms late) instead of timerfd",
    )
    a = ap.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        ap.error("the stub listens on loopback only")
    cfg = Config(a)
    if a.nice:
        with contextlib.suppress(OSError):
            os.nice(a.nice)
    first = _listen(a.host, a.port)
    port = first.getsockname()[1]
    if a.stats_dir:
        os.makedirs(a.stats_dir, exist_ok=True)
    socks = [first] + [_listen(a.host, port) for _ in range(a.workers - 1)]
    counter = None
    if a.counter_file:
        with open(a.counter_file, "wb") as f:
            f.write(bytes(16 * a.workers))
        with open(a.counter_file, "r+b") as rw:
            counter = mmap.mmap(rw.fileno(), 16 * a.workers)
    print(
        f"stub listening on http://{a.host}:{port} (ttft {a.ttft * 1e3:g} ms, "
        f"itl {a.itl * 1e3:g} ms, {a.workers} worker(s), {a.framing})",
        flush=True,
    )
    if a.workers == 1:
        path = os.path.join(a.stats_dir, f"worker-{os.getpid()}.json") if a.stats_dir else None
        asyncio.run(_serve(cfg, first, path, not a.imprecise, State(counter, 0, a.arrivals)))
        return
    pids = []
    for slot, sock in enumerate(socks):
        pid = os.fork()
        if pid == 0:
            for other in socks:
                if other is not sock:
                    other.close()
            path = os.path.join(a.stats_dir, f"worker-{os.getpid()}.json") if a.stats_dir else None
            try:
                asyncio.run(
                    _serve(cfg, sock, path, not a.imprecise, State(counter, slot, a.arrivals))
                )
            finally:
                os._exit(0)
        pids.append(pid)
    for sock in socks:
        sock.close()

    def forward(sig: int, _frame: object) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for pid in pids:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break


if __name__ == "__main__":
    main()
