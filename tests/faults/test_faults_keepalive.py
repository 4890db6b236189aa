"""Keep-alive connections a server closed: one outcome per request the server saw.

A raw-socket server answers each request with ``Content-Length``, no ``Connection: close``
(so the client keeps the connection), and then closes the socket, as proxies do after an
error answer and some servers after every answer. soakd must never send a request on such
a dead pooled connection, nor on one the server is about to close (a phantom
``stream_truncated`` for a request the server never saw), and a server that read a request
and then dropped the connection must have that failure counted, not hidden by a second
send. The outcomes soakd counts must equal what the server received, exactly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Final, Self

import pytest
from prometheus_client import generate_latest

from soakd.app import RunOptions, Soak
from soakd.config import config_from_dict
from soakd.report.build import build_report
from tests.faults.conftest import figure, samples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ERROR = json.dumps({"error": {"message": "no", "type": "server_error", "code": "x"}}).encode()
TIMEOUTS: Final = {"connect": "2s", "ttft": "3s", "total": "5s"}
STREAM: Final = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
MODES = {  # mode: (status, content type, body, the kind soakd must count)
    "ok": (200, "text/event-stream", STREAM, "ok"),
    "s400": (400, "application/json", ERROR, "http_4xx"),
    "s401": (401, "application/json", ERROR, "http_auth"),
    "s503": (503, "application/json", ERROR, "http_5xx"),
    "s503oom": (
        503,
        "application/json",
        json.dumps({"error": {"message": "CUDA out of memory"}}).encode(),
        "http_5xx",
    ),
    "error200": (200, "application/json", ERROR, "bad_response"),
    "html": (200, "text/html", b"<html>a proxy's page</html>", "bad_response"),
}


class RawServer:
    """A raw-socket server on a free port, counting the whole requests it read by mode (the
    first path segment); ``_handle`` is its behaviour. ``async with`` starts and stops it."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.port = 0
        self._server: asyncio.Server | None = None

    STREAM = STREAM

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _answer_stream(self, writer: asyncio.StreamWriter) -> None:
        """A short successful stream with ``Content-Length``, the connection kept."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(self.STREAM) + self.STREAM
        )
        await writer.drain()

    async def _read_body(self, reader: asyncio.StreamReader, head: bytes) -> str:
        """Read the body of the request whose ``head`` was read, count it; its mode."""
        lines = head.decode("latin-1").split("\r\n")
        mode = lines[0].split(" ")[1].strip("/").split("/")[0]
        length = next(
            (
                int(v)
                for k, _, v in (ln.partition(":") for ln in lines)
                if k.lower() == "content-length"
            ),
            0,
        )
        await reader.readexactly(length)
        self.requests[mode] += 1  # the server saw a whole request
        return mode

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)


class ClosingServer(RawServer):
    """Reads one request per connection, answers it as keep-alive, then closes."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mode = await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
            status, ctype, body, _ = MODES[mode]
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, KeyError):
            pass
        finally:
            writer.close()  # no Connection: close was said: the client thinks it may reuse it


CLOSED_2: Final = {"mode": "closed", "concurrency": 2}


async def soak_modes(
    server: RawServer,
    modes: Iterable[str],
    load: dict[str, Any],
    tmp_path: Path,
    *,
    seconds: int = 2,
    **target: Any,
) -> str:
    """soakd against ``server``, one target per mode (the path's first segment), for
    ``seconds`` under ``load``; it must complete. Its final scrape."""
    soak = await soak_run(server, modes, load, tmp_path, seconds=seconds, **target)
    return generate_latest(soak.metrics.registry).decode()


async def soak_run(
    server: RawServer,
    modes: Iterable[str],
    load: dict[str, Any],
    tmp_path: Path,
    *,
    seconds: int = 2,
    workers: int = 1,
    **target: Any,
) -> Soak:
    """``soak_modes``, with ``run.workers``; the finished run."""
    cfg = config_from_dict(
        {
            "run": {"name": "keepalive", "drain_timeout": "5s", "workers": workers},
            "targets": [
                {
                    "name": mode,
                    "base_url": f"http://127.0.0.1:{server.port}/{mode}",
                    "model": "m",
                    "scrape": False,
                    **target,
                }
                for mode in modes
            ],
            "workload": {"max_tokens": 4},
            "gpu": {"source": "none"},
            "phases": [{"name": "p", "duration": f"{seconds}s", "load": load}],
        }
    )
    soak = Soak(
        cfg, RunOptions(run_dir=tmp_path / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )
    result = await soak.run()
    assert result.completed
    return soak


@pytest.fixture
async def closing() -> AsyncIterator[ClosingServer]:
    async with ClosingServer() as server:
        yield server


async def test_outcomes_equal_what_the_server_received(
    closing: ClosingServer, tmp_path: Path
) -> None:
    text = await soak_modes(
        closing,
        MODES,
        CLOSED_2,
        tmp_path,
        seconds=3,
        timeouts=TIMEOUTS,
        rate_limit={"honour_retry_after": False, "default_pause": 0},
    )
    for mode, (_, _, _, kind) in MODES.items():
        seen = closing.requests[mode]
        counted = samples(text, "soakd_requests_total", target=mode)
        assert seen > 20, (mode, seen)
        assert counted == seen, (mode, counted, seen)  # not one phantom, not one lost
        assert samples(text, "soakd_requests_total", target=mode, outcome=kind) == seen
        figure(f"keepalive.{mode}.server_saw", seen)
        figure(f"keepalive.{mode}.soakd_counted", counted)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("concurrency", [2, 64])
async def test_a_server_closing_after_every_answer_is_learned_not_raced(
    closing: ClosingServer, tmp_path: Path, concurrency: int, workers: int
) -> None:
    """A server that closes every connection right after a 200, unannounced: the next
    request written on a reused connection would cross the close (63 phantom
    ``stream_truncated`` in 4,300 outcomes at a closed loop of 2). soakd learns it before
    it reuses one (a probe held after the first 200) and opens a new connection after each
    answer: every request the server read is one ``ok``, nothing else is counted. Each
    worker process learns it for its own pool and tells the parent."""
    soak = await soak_run(
        closing, ["ok"], {"mode": "closed", "concurrency": concurrency}, tmp_path, workers=workers
    )
    text = generate_latest(soak.metrics.registry).decode()
    seen = closing.requests["ok"]
    assert seen > 50, seen
    assert samples(text, "soakd_requests_total", target="ok") == seen  # not one phantom
    assert samples(text, "soakd_requests_total", target="ok", outcome="ok") == seen
    # learned, shown and exported: the parent heard it from every sender that learned it
    assert soak.status()["no_reuse"] == {"ok": [200]}
    assert samples(text, "soakd_target_no_reuse", target="ok", status="200") == 1
    note = [n for n in build_report(soak.run_dir).notes if "after 200 answers" in n]
    assert len(note) == 1 and note[0].startswith("ok: the server closed its connections")
    figure(f"keepalive.closing.c{concurrency}.w{workers}.server_saw", seen)


class FlippingServer(RawServer):
    """Answers with a short stream and keeps the connection for ``KEEP_S`` after it
    started; from then on it closes every connection right after its answer, unannounced.
    soakd has seen it keep its connections by then (the probe after its first 200)."""

    KEEP_S = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.started = 0.0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
                await self._answer_stream(writer)
                if loop.time() - self.started > self.KEEP_S:
                    return  # closes after the answer, no Connection: close
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Self:
        self.started = asyncio.get_running_loop().time()
        return await super().__aenter__()


async def test_a_server_that_starts_closing_after_answers_is_learned_at_once(
    tmp_path: Path,
) -> None:
    """Connections are reused after 200s at first (the server kept the probe); once the
    server closes after every answer, the first connection found closed within half a
    second of its answer teaches soakd, which stops reusing them. What is left is the race
    of the few requests written before that: each is ``stream_truncated`` (lost before
    soakd knew) or ``connection_closed_unannounced`` (lost after), never more than one per
    stream, and every request the server read is an ``ok``."""
    async with FlippingServer() as server:
        soak = await soak_run(
            server, ["ok"], {"mode": "closed", "concurrency": 8}, tmp_path, seconds=3
        )
    text = generate_latest(soak.metrics.registry).decode()
    seen = server.requests["ok"]
    assert samples(text, "soakd_requests_total", target="ok", outcome="ok") == seen
    raced = samples(text, "soakd_requests_total", target="ok") - seen
    assert raced <= 8, raced  # at most the requests already in flight when it flipped
    assert soak.status()["no_reuse"] == {"ok": [200]}
    figure("keepalive.flipping.server_saw", seen)
    figure("keepalive.flipping.raced", raced)
    for kind in ("stream_truncated", "connection_closed_unannounced"):
        figure(f"keepalive.flipping.{kind}", samples(text, "soakd_requests_total", outcome=kind))


class DroppingServer(RawServer):
    """Answers the first request of each connection with a short stream, keep-alive; reads
    the second whole and then drops the connection without a byte of answer, as a server
    that crashes on a request or a proxy that loses its upstream does. ``/close/``: a
    plain close at once; ``/late/``: after 30 ms of "work"; ``/reset/``: an abort (RST)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: Counter[str] = Counter()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mode = await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
            await self._answer_stream(writer)
            mode = await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
            self.dropped[mode] += 1
            if mode == "late":
                await asyncio.sleep(0.03)
            if mode == "reset":
                writer.transport.abort()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_request_the_server_read_and_dropped_is_its_failure(tmp_path: Path) -> None:
    """Every request the server read is one outcome: the answered ones ``ok``, the dropped
    ones ``stream_truncated``. A second send of a dropped request would make the server
    see it twice and hide its failure (soakd once counted a third of them as successes)."""
    modes = ("close", "late", "reset")
    async with DroppingServer() as server:
        text = await soak_modes(server, modes, CLOSED_2, tmp_path, timeouts=TIMEOUTS)
    for mode in modes:
        seen, dropped = server.requests[mode], server.dropped[mode]
        assert dropped >= 10, (mode, dropped)  # the case was met
        assert samples(text, "soakd_requests_total", target=mode) == seen, mode
        truncated = samples(text, "soakd_requests_total", target=mode, outcome="stream_truncated")
        assert truncated == dropped, (mode, truncated, dropped)
        assert samples(text, "soakd_requests_total", target=mode, outcome="ok") == seen - dropped
        figure(f"keepalive.dropped.{mode}.server_saw", seen)
        figure(f"keepalive.dropped.{mode}.dropped", dropped)


class IdleNoticeServer(RawServer):
    """Answers every request with a short stream, keep-alive; when a connection then sits
    idle for ``IDLE_S``, writes ``408 Request Timeout`` on it, answering no request, as
    some servers and proxies do. ``/open/...`` keeps the connection after the notice (and
    reads the next request on it); ``/close/...`` closes it."""

    IDLE_S = 0.03

    def __init__(self) -> None:
        super().__init__()
        self.notices: Counter[str] = Counter()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mode = ""  # the first request's path says it
        try:
            while True:
                if not mode:
                    head = await reader.readuntil(b"\r\n\r\n")
                else:
                    try:
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.IDLE_S)
                    except TimeoutError:
                        self.notices[mode] += 1
                        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
                        await writer.drain()
                        if mode == "close":
                            return
                        head = await reader.readuntil(b"\r\n\r\n")
                mode = await self._read_body(reader, head)
                await self._answer_stream(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_408_on_an_idle_connection_is_no_answer(tmp_path: Path) -> None:
    """The notice must never be read as the answer to the next request sent on that
    connection: every request the server got is one success, and nothing else counted."""
    async with IdleNoticeServer() as server:
        text = await soak_modes(
            server, ("open", "close"), {"mode": "constant", "rate": 10}, tmp_path
        )
    for mode in ("open", "close"):
        seen = server.requests[mode]
        counted = samples(text, "soakd_requests_total", target=mode)
        assert counted == seen, (mode, counted, seen)  # not one phantom 408
        assert samples(text, "soakd_requests_total", target=mode, outcome="ok") == seen, mode
        assert seen >= 15, (mode, seen)
        assert server.notices[mode] >= 10, (mode, server.notices)  # the case was met
        figure(f"keepalive.idle408.{mode}.server_saw", seen)
        figure(f"keepalive.idle408.{mode}.notices", server.notices[mode])
