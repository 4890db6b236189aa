"""A small TCP fault proxy for the network fault tests (toxiproxy is neither in Debian
nor on PyPI as a server): asyncio, on 127.0.0.1, between soakd and a target.

Faults are attributes changed while it runs, from any thread (plain attribute writes):

- ``latency_s``: every chunk, both ways, arrives this much later (a delay line: the
  order is kept and the delays do not add up).
- ``bandwidth_bps``: bytes per second, server to client (None: unlimited).
- ``blackhole``: bytes are read and dropped both ways; connections stay open.
- ``reset_all()``: RST every open connection now; ``reset_after_bytes``: RST a
  connection once that many bytes went server to client.
- ``refuse()`` / ``accept()``: stop and start listening (connection refused meanwhile).

``syn_blackhole()`` is a port whose SYNs go unanswered: a connect that never completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

from tests.hostile_server import HOST, LoopThread

PIECE = 16 << 10


class FaultProxy:
    def __init__(self, upstream_port: int, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.latency_s = 0.0
        self.bandwidth_bps: float | None = None
        self.blackhole = False
        self.reset_after_bytes: int | None = None
        self.connections = 0
        self.bytes_down = 0  # delivered to clients, all connections: what a test waits on
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()  # the client sides
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def start(self) -> FaultProxy:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._handle, HOST, self.port, backlog=512)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def refuse(self) -> None:
        """Stop listening (new connects are refused) and reset the open connections."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await self.reset_all()

    async def accept(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, HOST, self.port, backlog=512)

    async def reset_all(self) -> None:
        for conn in list(self._conns):
            _rst(conn)
        self._conns.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)

    async def aclose(self) -> None:
        await self.refuse()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._conns.add(cwriter)
        swriter: asyncio.StreamWriter | None = None
        try:
            sreader, swriter = await asyncio.open_connection(HOST, self.upstream_port)
            up = asyncio.create_task(self._pump(creader, swriter, None, downstream=False))
            down = asyncio.create_task(self._pump(sreader, cwriter, cwriter, downstream=True))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
                if not down.done():  # the client finished sending: wait for the answer
                    await down
            finally:
                up.cancel()
                down.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            self._conns.discard(cwriter)
            if swriter is not None:
                swriter.transport.abort()
            if not cwriter.transport.is_closing():
                cwriter.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: asyncio.StreamWriter | None,
        *,
        downstream: bool,
    ) -> None:
        line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._deliver(line, writer, client, downstream))
        try:
            while True:
                data = await reader.read(PIECE)
                if self.blackhole:
                    continue  # into the void (and the peer's EOF too)
                await line.put((time.monotonic() + self.latency_s, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    async def _deliver(
        self,
        line: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        client: asyncio.StreamWriter | None,
        downstream: bool,
    ) -> None:
        sent = 0
        while True:
            due, data = await line.get()
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            for i in range(0, len(data), 1024 if downstream and self.bandwidth_bps else PIECE):
                piece = data[i : i + (1024 if downstream and self.bandwidth_bps else PIECE)]
                while self.blackhole:  # noqa: ASYNC110 (set from any thread)
                    await asyncio.sleep(0.01)  # a blackhole also holds what was in flight
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
                if downstream:
                    self.bytes_down += len(piece)
                if downstream and self.bandwidth_bps:
                    await asyncio.sleep(len(piece) / self.bandwidth_bps)
                limit = self.reset_after_bytes
                if downstream and client is not None and limit is not None and sent >= limit:
                    _rst(client)
                    raise ConnectionResetError


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort with SO_LINGER 0: the peer gets a RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def fault_proxy(upstream_port: int) -> Iterator[tuple[FaultProxy, LoopThread]]:
    """A FaultProxy to ``upstream_port``, in a thread; the LoopThread runs its coroutines
    (``lt.call(proxy.refuse)``)."""
    lt = LoopThread()
    proxy = FaultProxy(upstream_port)
    try:
        lt.call(proxy.start)
        yield proxy, lt
    finally:
        lt.call(proxy.aclose)
        lt.close()


@contextlib.contextmanager
def syn_blackhole() -> Iterator[int]:
    """A port that never completes a TCP handshake: its accept queue (backlog 0) is
    already full, so the kernel drops every new SYN and a connect just waits."""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(2):
            c = socket.socket()
            c.settimeout(0.2)
            with contextlib.suppress(OSError):
                c.connect((HOST, port))
            fillers.append(c)
        yield port
    finally:
        for c in fillers:
            c.close()
        listener.close()
