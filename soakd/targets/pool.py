"""Targets room, connection pool: idle connections handed out newest first, so the pool
shrinks back after a burst, and never one the server closed or wrote to while it sat idle.

aiohttp (3.14, as measured) keeps a host's idle connections in a deque and hands out the
oldest first (``popleft`` in ``TCPConnector._get``). Under steady traffic every idle
connection is then reused within seconds, none reaches the keep-alive timeout (15 s), and
the pool keeps the size of the largest burst of in-flight requests for the whole session:
an endurance run's open fds went 149 -> 494 in two hours (docs/benchmarks.md, "Endurance").

``NewestFirstConnector`` puts a released connection at the front of that deque instead of
the back, so the next request takes the most recently used one. The connections beyond
what the traffic needs stay at the back, untouched, and aiohttp's own keep-alive clean-up
closes them once they have been idle for ``keepalive_timeout``. The pool so follows the
in-flight high-water mark of the last 15-30 s. Nothing in use is ever closed (only idle
connections are in the deque) and no request sees a difference: the cost is one
``deque.rotate(1)`` per released connection.

Where aiohttp keeps its idle connections some other way (a list in some versions) or
changes its internals, the override finds no deque ending with the connection just
released and does nothing: the pool is then aiohttp's own.

**A connection the server closed.** A server or proxy may close a keep-alive connection
at any time: its keep-alive timeout, or right after an error answer sent without
``Connection: close``. aiohttp learns of it only when its loop reads the FIN, which can
be after the connection went back to the pool and was handed out again; the request then
fails before any answer, for a server that never read it (a phantom ``stream_truncated``).
``_get`` asks the kernel first (``poll`` with ``POLLRDHUP``, no wait): a connection whose
peer has closed or reset it is closed here and the next is looked at. No request went out
on it, so there is nothing to resend and nothing to count. That is Go's net/http rule
(its idle connections are always being read, so a closed one leaves the pool at once), and
like Go soakd never sends a POST twice: a request that fails after it was written on a
live connection was read by a server that then failed it (a crash, a drop), and it is an
outcome. Sending it again hid exactly that failure: a server that dropped a third of its
requests after reading them looked healthy. The race left is a FIN crossing the request
on the wire (the server's close within one trip of the request's write), as in Go.

**Bytes on an idle connection.** Some servers and proxies write to a keep-alive
connection nobody asked on: a ``408 Request Timeout`` as an idle notice (with or without
closing it), or junk after an answer. aiohttp parses those bytes into the connection's
queue as they arrive, and the next request sent on it would read them as its own answer: a
phantom ``http_4xx`` for a request the server never got, and every later answer on that
connection one request off. Go's net/http closes such a connection ("unsolicited response
on idle HTTP channel"); so does ``_get`` here: one the server wrote to while idle is closed
(logged, never an outcome), whether aiohttp has read the bytes yet or they still wait in
the kernel (``POLLIN``, plain TCP only: on TLS a readable socket may be a session ticket).
The race left: bytes that arrive after the connection was handed out and before its
request was written are read as the answer, as in Go.

Each connection's protocol is a ``FramingHandler`` (framing.py): an answer whose HTTP
breaks mid-body fails when the bad bytes arrive, not at a deadline.
"""

from __future__ import annotations

import asyncio
import functools
import select
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiohttp import TCPConnector
from aiohttp.client_proto import ResponseHandler

from soakd.targets.framing import FramingHandler

if TYPE_CHECKING:
    from aiohttp.client_reqrep import ConnectionKey
    from aiohttp.connector import Connection
    from aiohttp.tracing import Trace

log = structlog.get_logger()

__all__ = ["IDLE_CLOSE_S", "NewestFirstConnector"]

IDLE_CLOSE_S: Final = 15.0
"""An idle pooled connection is closed after this long unused (aiohttp's default
keep-alive timeout, named here so a test can shorten it)."""


class NewestFirstConnector(TCPConnector):
    """A TCPConnector whose idle connections are reused newest first (module doc)."""

    def __init__(self, **kwargs: Any) -> None:
        if not kwargs.get("force_close"):
            kwargs.setdefault("keepalive_timeout", IDLE_CLOSE_S)
        super().__init__(**kwargs)
        self.spoke_idle = 0  # idle connections closed because the server wrote on them
        # each connection's protocol: parse errors mid-body reach the reader (framing.py)
        if isinstance(getattr(self, "_factory", None), functools.partial):
            self._factory = functools.partial(_framing_handler, loop=self._loop)

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> Connection | None:
        conns = self._conns.get(key)
        if isinstance(conns, deque):
            while conns:
                proto = conns[0][0]
                unusable = _unusable(proto)
                pending = 0 if unusable else _pending(proto)
                if not (unusable or pending):
                    break
                conns.popleft()
                if proto.is_connected() and (proto.should_close or pending == select.POLLIN):
                    self._spoke(key)  # bytes, no close: an idle notice or junk
                proto.close()
            if not conns:
                del self._conns[key]
        return await super()._get(key, traces)

    def _spoke(self, key: ConnectionKey) -> None:
        n = self.spoke_idle = self.spoke_idle + 1
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...
            log.warning(
                "server_wrote_on_idle_connection",
                host=f"{key.host}:{key.port}",
                times=n,
                note="closed, not read as an answer (a 408 idle notice, or junk after an answer)",
            )

    def _release(
        self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False
    ) -> None:
        super()._release(key, protocol, should_close=should_close)
        conns = self._conns.get(key)
        # aiohttp appended (protocol, last use) at the back, where popleft takes it last
        if isinstance(conns, deque) and conns and conns[-1][0] is protocol:
            conns.rotate(1)


def _framing_handler(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    return FramingHandler(loop)


def _pending(proto: ResponseHandler) -> int:
    """What the kernel holds for this idle connection that the loop may not have read yet:
    the server's FIN or reset (``POLLRDHUP``, ``POLLHUP``, ``POLLERR``) or, on a plain
    TCP connection, bytes nobody asked for (``POLLIN``); 0 when nothing. On TLS a readable
    socket can be the protocol's own records (a session ticket), so only a close counts."""
    transport = proto.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if transport is None or sock is None:
        return 0
    events = select.POLLRDHUP
    if transport.get_extra_info("ssl_object") is None:
        events |= select.POLLIN
    poller = select.poll()
    poller.register(sock.fileno(), events)
    ready = poller.poll(0)
    return ready[0][1] if ready else 0


def _unusable(proto: ResponseHandler) -> bool:
    """Closing, or holding bytes that answer no request (``should_close``: a parsed message
    waiting, unparsed bytes, a parse error, or ``Connection: close`` seen)."""
    return not proto.is_connected() or proto.should_close
