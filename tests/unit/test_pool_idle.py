"""The pool's look at an idle connection before reuse: what the kernel holds for it counts,
whether the event loop has read it yet or not (soakd/targets/pool.py).

Each case is an aiohttp ``ResponseHandler`` on one end of a socketpair; the test acts as
the server on the other end and asks ``_pending`` before the loop gets a turn, so the
bytes or the close are still in the kernel."""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp.client_proto import ResponseHandler

from soakd.targets.pool import _pending

GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR


@pytest.fixture
async def conn() -> AsyncIterator[tuple[ResponseHandler, socket.socket]]:
    ours, server = socket.socketpair()
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: ResponseHandler(loop), sock=ours)
    try:
        yield proto, server
    finally:
        proto.close()
        server.close()


async def test_a_live_idle_connection_holds_nothing(
    conn: tuple[ResponseHandler, socket.socket],
) -> None:
    proto, _ = conn
    assert _pending(proto) == 0


async def test_bytes_the_server_wrote_while_idle_are_seen_unread(
    conn: tuple[ResponseHandler, socket.socket],
) -> None:
    proto, server = conn
    server.sendall(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
    assert _pending(proto) == select.POLLIN  # bytes, and no close


async def test_a_connection_the_server_closed_is_seen_before_the_loop_reads_it(
    conn: tuple[ResponseHandler, socket.socket],
) -> None:
    proto, server = conn
    server.close()
    assert proto.is_connected()  # the loop has not read the FIN yet
    assert _pending(proto) & GONE


async def test_a_closed_transport_holds_nothing_to_look_at() -> None:
    proto = ResponseHandler(asyncio.get_running_loop())  # never connected
    assert _pending(proto) == 0
