"""The pool's look at an idle connection before reuse: what the kernel holds for it counts,
whether the event loop has read it yet or not (soakd/targets/pool.py).

Each case is an aiohttp ``ResponseHandler`` on one end of a socketpair; the test acts as
the server on the other end and asks ``_pending`` before the loop gets a turn, so the
bytes or the close are still in the kernel."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
from collections.abc import AsyncIterator

import pytest
from aiohttp.client_proto import ResponseHandler

from soakd.targets.pool import AnswerHandler, NewestFirstConnector, _pending
from tests.waiting import until

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


@pytest.fixture
async def answered() -> AsyncIterator[tuple[AnswerHandler, socket.socket]]:
    """A connection after one answer, back in the pool (idle from there)."""
    ours, server = socket.socketpair()
    loop = asyncio.get_running_loop()
    pool = NewestFirstConnector()
    _, proto = await loop.create_connection(lambda: AnswerHandler(loop, pool), sock=ours)
    proto.set_response_params()  # as after its answer: the next bytes are parsed
    proto.answers = proto.idle_from = 1
    try:
        yield proto, server
    finally:
        proto.close()
        server.close()
        await pool.close()


@pytest.mark.parametrize("read", [False, True], ids=["in_the_kernel", "read_by_the_loop"])
async def test_a_close_with_no_byte_is_silent(
    answered: tuple[AnswerHandler, socket.socket], read: bool
) -> None:
    """What teaches the pool that the server closes after answers: a FIN alone, whether the
    loop has read it yet or not (a FIN makes the socket readable: POLLIN is no byte)."""
    proto, server = answered
    server.close()
    if read:
        await until(lambda: not proto.is_connected(), what="the loop read the FIN")
    assert proto.closed_silently(_pending(proto))


async def test_a_reset_with_no_byte_is_silent(
    answered: tuple[AnswerHandler, socket.socket],
) -> None:
    proto, server = answered
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()
    assert proto.closed_silently(_pending(proto))


@pytest.mark.parametrize("read", [False, True], ids=["in_the_kernel", "read_by_the_loop"])
async def test_a_notice_then_a_close_is_said_not_silent(
    answered: tuple[AnswerHandler, socket.socket], read: bool
) -> None:
    """A 408 before the close is the server saying so (the idle-notice rule, not this one)."""
    proto, server = answered
    server.sendall(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
    server.close()
    if read:
        await until(lambda: not proto.is_connected(), what="the loop read the notice")
    assert not proto.closed_silently(_pending(proto))


async def test_junk_then_a_close_is_not_silent(
    answered: tuple[AnswerHandler, socket.socket],
) -> None:
    proto, server = answered
    server.sendall(b"not http at all\r\n\r\n")
    server.close()
    await until(lambda: not proto.is_connected(), what="the loop read the junk")
    assert not proto.closed_silently(_pending(proto))


async def test_an_open_idle_connection_is_not_closed(
    answered: tuple[AnswerHandler, socket.socket],
) -> None:
    proto, _ = answered
    assert not proto.closed_silently(_pending(proto))
