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

from soakd.config import TargetConfig, config_from_dict
from soakd.measure.goodput import classify
from soakd.model import ErrorKind, RequestSpec
from soakd.report.build import build_report
from soakd.run.app import RunOptions, Soak
from soakd.targets import open_target, pool
from tests.faults.conftest import figure, samples
from tests.waiting import until

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
    """Reads one request per connection, answers it as keep-alive, then closes (after
    ``linger_s``: a server that tidies up first, or a proxy that flushes)."""

    def __init__(self, linger_s: float = 0.0) -> None:
        super().__init__()
        self.linger_s = linger_s

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
            if self.linger_s:
                await asyncio.sleep(self.linger_s)
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
            # these servers count every request they read: no /tokenize at start
            "workload": {"max_tokens": 4, "calibrate": "off"},
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
        # a closed loop backs off after a 401 (soakd/workload/runner.py): fewer of those
        assert seen > (5 if mode == "s401" else 20), (mode, seen)
        assert counted == seen, (mode, counted, seen)  # not one phantom, not one lost
        assert samples(text, "soakd_requests_total", target=mode, outcome=kind) == seen
        figure(f"keepalive.{mode}.server_saw", seen)
        figure(f"keepalive.{mode}.soakd_counted", counted)


LINGER_S: Final = 0.01
"""The closing server's close, this long after its answer: a closed loop's next request
is written within it, so without soakd's learning nearly every reused connection races
the close (one run: 1,157 outcomes, 565 of them phantoms, for 592 requests read)."""


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("concurrency", [2, 64])
async def test_a_server_closing_after_every_answer_is_learned_not_raced(
    tmp_path: Path, concurrency: int, workers: int
) -> None:
    """A server that closes every connection right after a 200, unannounced: the next
    request written on a reused connection crosses the close (a phantom
    ``stream_truncated`` for a request the server never read). soakd learns it before it
    reuses one (a probe held after the first 200) and opens a new connection after each
    answer: every request the server read is one ``ok``, nothing else is counted. Each
    worker process learns it for its own pool and tells the parent."""
    async with ClosingServer(LINGER_S) as closing:
        soak = await soak_run(
            closing, ["ok"], {"mode": "closed", "concurrency": concurrency}, tmp_path,
            workers=workers,
        )  # fmt: skip
    text = generate_latest(soak.metrics.registry).decode()
    seen = closing.requests["ok"]
    assert seen > 50, seen
    assert samples(text, "soakd_requests_total", target="ok") == seen  # not one phantom
    assert samples(text, "soakd_requests_total", target="ok", outcome="ok") == seen
    # learned, shown and exported: the parent heard it from every sender that learned it
    assert soak.status().no_reuse == {"ok": [200]}
    assert samples(text, "soakd_target_no_reuse", target="ok", status="200") == 1
    note = [n for n in build_report(soak.run_dir).notes if "after 200 answers" in n]
    assert len(note) == 1, note
    assert note[0].startswith("ok: the server closed its connections"), note
    figure(f"keepalive.closing.c{concurrency}.w{workers}.server_saw", seen)


class FlippingServer(RawServer):
    """Answers with a short stream and keeps the connection for ``KEEP_S`` after it
    started; from then on it closes every connection right after its answer (``linger_s``
    later), unannounced. soakd has seen it keep its connections by then (the probe after
    its first 200)."""

    KEEP_S = 1.0

    def __init__(self, linger_s: float) -> None:
        super().__init__()
        self.started = 0.0
        self.linger_s = linger_s

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
                await self._answer_stream(writer)
                if loop.time() - self.started > self.KEEP_S:
                    await asyncio.sleep(self.linger_s)
                    return  # closes after the answer, no Connection: close
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Self:
        self.started = asyncio.get_running_loop().time()
        return await super().__aenter__()


@pytest.mark.parametrize("linger_s", [0.0, LINGER_S])
async def test_a_server_that_starts_closing_after_answers_is_learned_at_once(
    tmp_path: Path, linger_s: float
) -> None:
    """Connections are reused after 200s at first (the server kept the probe); then the
    server closes every connection after its answer. Closed at once (``linger_s`` 0), the
    pool finds the next one closed and learns it; closed a little later, the requests on
    reused connections are lost under it, and the first loss has 200s probed again. The
    losses before soakd learned cannot be told from a server that read and dropped them
    (``stream_truncated``), those after are ``connection_closed_unannounced``; together at
    most one per stream. Every request the server read is an ``ok``."""
    async with FlippingServer(linger_s) as server:
        soak = await soak_run(
            server, ["ok"], {"mode": "closed", "concurrency": 8}, tmp_path, seconds=3
        )
    text = generate_latest(soak.metrics.registry).decode()
    seen = server.requests["ok"]
    assert samples(text, "soakd_requests_total", target="ok", outcome="ok") == seen
    lost = {
        kind: samples(text, "soakd_requests_total", outcome=kind)
        for kind in ("stream_truncated", "connection_closed_unannounced")
    }
    assert samples(text, "soakd_requests_total", target="ok") == seen + sum(lost.values())
    assert sum(lost.values()) <= 8, lost  # at most the requests in flight when it flipped
    assert soak.status().no_reuse == {"ok": [200]}
    figure(f"keepalive.flipping.linger{linger_s:g}.server_saw", seen)
    for kind, n in lost.items():
        figure(f"keepalive.flipping.linger{linger_s:g}.{kind}", n)


class StagedServer(RawServer):
    """Answers the first request of each connection with a short stream and keeps the
    connection; then a second request there is left unread (its head is seen, ``second``,
    its body never read nor counted) until ``drop`` is set, when the connection is closed
    under it; a connection with no second request is closed, silently, once
    ``close_idle`` is set (``idle_closed`` then)."""

    def __init__(self) -> None:
        super().__init__()
        self.second = asyncio.Event()
        self.drop = asyncio.Event()
        self.close_idle = asyncio.Event()
        self.idle_closed = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._read_body(reader, await reader.readuntil(b"\r\n\r\n"))
            await self._answer_stream(writer)
            head = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
            idle = asyncio.ensure_future(self.close_idle.wait())
            await asyncio.wait({head, idle}, return_when=asyncio.FIRST_COMPLETED)
            if head.done():
                idle.cancel()
                head.result()  # a second request (or the client's close)
                self.second.set()
                await self.drop.wait()
            else:
                head.cancel()
                writer.close()
                await writer.wait_closed()
                self.idle_closed += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def one(seq: int) -> RequestSpec:
    return RequestSpec("ok", "p", seq, "hello", 1, 4, 0.0, 0)


async def test_a_request_written_before_soakd_learned_is_closed_unannounced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server kept its connections after 200s (the probe), then closes one silently
    right after its answer while a request is already written on the other. Seeing the
    first closed teaches soakd that the server closes after 200s; the request on the
    second, lost with no answer, is then ``connection_closed_unannounced``: the server
    never read it (it is not in the server's count), and it is left out of the error
    ratio and goodput."""
    learned: list[tuple[int, bool]] = []
    async with StagedServer() as server:
        target = await open_target(
            TargetConfig(name="ok", base_url=f"http://127.0.0.1:{server.port}/ok", model="m"),
            on_learn=lambda status, closes: learned.append((status, closes)),
        )
        connector = target.pool
        assert connector is not None
        try:
            outs = [await target.send(one(0))]
            await until(lambda: connector.keeps_after == [200], what="the probe kept")
            # a close found later counts however slow this machine is (0.5 s by default)
            monkeypatch.setattr(pool, "CLOSE_WINDOW_S", 60.0)
            outs += await asyncio.gather(target.send(one(1)), target.send(one(2)))
            lost = asyncio.create_task(target.send(one(3)))  # on a reused connection
            await until(server.second.is_set, what="the request on a reused connection")
            server.close_idle.set()
            await until(lambda: server.idle_closed == 1, what="the idle one closed")
            outs.append(await target.send(one(4)))  # finds it closed: learned
            assert learned == [(200, True)]
            server.drop.set()
            out = await lost
        finally:
            await target.aclose()
    assert [o.error for o in outs] == [None] * 4
    assert out.error is ErrorKind.CONNECTION_CLOSED_UNANNOUNCED, (out.error, out.error_detail)
    assert out.status == 0
    assert out.first_byte_ns is None
    assert server.requests["ok"] == 4  # the lost one was never read
    assert classify(out.outcome) == "excluded"  # no one's failure: out of every ratio
    assert connector.closes_after == [200]
    assert connector.keeps_after == []


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
        # it keeps its connections after answers: a drop is not a close after an answer
        assert samples(text, "soakd_target_no_reuse", target=mode) == 0, mode
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
        # a notice before the close is the server saying so: not a close to learn from
        assert samples(text, "soakd_target_no_reuse", target=mode) == 0, mode
        figure(f"keepalive.idle408.{mode}.server_saw", seen)
        figure(f"keepalive.idle408.{mode}.notices", server.notices[mode])
