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
requests after reading them looked healthy. The race left is a close crossing the
request on the wire; a server that closes right after its answers meets it on nearly
every reuse, and is learned instead (below).

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

**A server that closes after its answers without saying so.** Some servers and proxies
close every connection right after an answer (or after some statuses, an error's) without
``Connection: close``. The close then races the next request: aiohttp releases the
connection the moment the answer's last byte is read, and a closed loop writes its next
request on it within microseconds, before the server's FIN or reset arrives; the kernel
check above cannot see a close that has not happened yet. Measured: 63 phantom
``stream_truncated`` in 4,300 outcomes (closed loop of 2, 12 s); closed 10 ms after the
answer, half the outcomes. Such a loss cannot be told from a server that read the request
and then aborted the connection: the server closes with the request unread in its
buffer, so its kernel sends a reset, not a FIN (so did all 13 of a 6 s run), and both
are a reset with no byte of answer on a reused connection, the request unacknowledged. So
the pool does not guess per loss: it learns, per answer status, whether the server keeps
its connections after such an answer, and reuses one only once it has seen it do so.

- **The probe.** The first connection released after an answer with a status not judged
  yet is held out of the pool (its limit does not count it) for ``CLOSE_WINDOW_S``, and
  every other connection released after that status meanwhile is closed: the next
  requests open new ones. Closed by the server in that window with no byte (judged at
  once; a 408 notice before the close is the server saying so, see above): it closes
  after that status (``closes_after``). Still open at the end: it keeps them
  (``keeps_after``), and connections are reused after that status from then on.
- **No reuse after a status the server closes on**: the connection is closed when its
  answer ends, and the next request opens a new one (its connect is in that request's
  time to first token), as the server forces anyway. That status is probed again every
  ``RECHECK_S``, for free (those connections are not reused anyway): a crash closes every
  connection at once and looks the same, and must not end reuse for the rest of a run.
- **A server that starts closing later.** An idle connection found closed, silently,
  within ``CLOSE_WINDOW_S`` of its answer, teaches the pool at once. A loss on a
  connection reused after a status (the server closed it under the request, before any
  answer) has that status probed again (no reuse after it meanwhile; once a
  ``RECHECK_S`` at most, so that a server that reads requests and drops some is not
  probed on every drop). That loss, and any other before the pool knew, cannot be told
  from a drop and stays ``stream_truncated``: at most one per request in flight when the
  server changed. A loss after it knew (its request was written before) is
  ``connection_closed_unannounced`` (``ClosedAfterAnswer``): the server closes after
  that answer, so it never read the request.

The verdicts are reported through ``on_learn(status, closes)`` when they change (the run
logs them, exports ``soakd_target_no_reuse`` and journals them). A keep-alive server pays
one probe per status: one connection held for ``CLOSE_WINDOW_S``, and a new connection
for each request after that status meanwhile; nothing per request after it.

Each connection's protocol is an ``AnswerHandler``, a ``FramingHandler`` (framing.py): an
answer whose HTTP breaks mid-body fails when the bad bytes arrive, not at a deadline.
"""

from __future__ import annotations

import asyncio
import fcntl
import select
import sys
import termios
from collections import deque
from collections.abc import Callable
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiohttp import ClientConnectionError, ServerDisconnectedError, TCPConnector
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError

from soakd.targets.framing import FramingHandler

if TYPE_CHECKING:
    from aiohttp.client_reqrep import ConnectionKey
    from aiohttp.connector import Connection
    from aiohttp.http import RawResponseMessage
    from aiohttp.streams import StreamReader
    from aiohttp.tracing import Trace

log = structlog.get_logger()

__all__ = [
    "CLOSE_WINDOW_S",
    "IDLE_CLOSE_S",
    "RECHECK_S",
    "AnswerHandler",
    "ClosedAfterAnswer",
    "NewestFirstConnector",
]

IDLE_CLOSE_S: Final = 15.0
"""An idle pooled connection is closed after this long unused (aiohttp's default
keep-alive timeout, named here so a test can shorten it)."""
CLOSE_WINDOW_S: Final = 0.5
"""A connection the server closes, silently, within this long of an answer: the server
closes after answers with that status (module doc). Well below the keep-alive timeouts
servers use (uvicorn, and so vLLM, 5 s; gunicorn 2 s), well above the trip a close takes
behind its answer, even over a WAN."""
RECHECK_S: Final = 60.0
"""A status the server was seen to close after is probed again this long after; a loss
on a connection reused after a status asks for a probe at most this often."""

_GONE: Final = select.POLLRDHUP | select.POLLHUP | select.POLLERR

OnLearn = Callable[[int, bool], None]
"""``(status, closes)``: the server closes (True) or keeps (False) its connections after
answers with ``status``; called when that changes (a first "keeps" is not a change)."""


class ClosedAfterAnswer(ServerDisconnectedError):
    """A request written on a connection reused after an answer with ``status``, lost with
    no answer, when the server is known to close after such answers: it most likely never
    read it (``connection_closed_unannounced``, module doc)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"closed after a {status} answer, unannounced")
        self.status = status


class AnswerHandler(FramingHandler):
    """aiohttp's connection protocol (framing.py's), noting what the pool needs: the last
    answer's status, how many answers the connection carried, and whether a request written
    on it after reuse is still waiting for its answer. One call per answer (``feed_data`` is
    called per response head, not per chunk)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: NewestFirstConnector) -> None:
        super().__init__(loop)
        self.status = 0  # the last answer's status (0: none yet)
        self.answers = 0  # response heads read on this connection
        self.idle_from = 0  # ``answers`` when it last went back to the pool
        self.awaiting = False  # handed out again; its request has no answer head yet
        self.probe: ConnectionKey | None = None  # held by the pool to see if the server closes it
        self._pool = pool
        self._unannounced: ClosedAfterAnswer | None = None

    def feed_data(self, data: tuple[RawResponseMessage, StreamReader], size: int = 0) -> None:
        self.status = data[0].code
        self.answers += 1
        self.awaiting = False
        super().feed_data(data, size)

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        if isinstance(exc, ClientConnectionError) and not isinstance(exc, asyncio.TimeoutError):
            # the transport is still set: the server closed it, not soakd (a timeout, a cut)
            if self.awaiting and self.transport is not None:
                self.awaiting = False
                if self._pool.lost_after(self.status):
                    self._unannounced = ClosedAfterAnswer(self.status)
            if self._unannounced is not None:
                exc = self._unannounced
        super().set_exception(exc, exc_cause)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.probe is not None:  # the server closed a probe: judged now, not at the end
            self._pool.judge(self.probe, self.status)

    def closed_silently(self, pending: int) -> bool:
        """The server closed (or reset) it while it sat idle, without a byte: no answer
        read since it went back to the pool, nor bytes that were none (unparsed, or not
        HTTP), and none waiting in the kernel behind the close (``pending``, from
        ``_pending``)."""
        closed = not self.is_connected() or bool(pending & _GONE)
        said = self.answers != self.idle_from or self._tail or self._said_junk()
        return closed and not said and not _unread(self)

    def _said_junk(self) -> bool:
        return isinstance(self.exception(), HttpProcessingError)


class NewestFirstConnector(TCPConnector):
    """A TCPConnector whose idle connections are reused newest first, never one the server
    closed or wrote to while idle, and never after an answer the server closes on (module
    doc)."""

    def __init__(self, *, on_learn: OnLearn | None = None, **kwargs: Any) -> None:
        if not kwargs.get("force_close"):
            kwargs.setdefault("keepalive_timeout", IDLE_CLOSE_S)
        super().__init__(**kwargs)
        self.spoke_idle = 0  # idle connections closed because the server wrote on them
        self._closes: dict[int, float] = {}  # status -> when learned closing (monotonic)
        self._keeps: set[int] = set()  # statuses after which the server keeps connections
        self._probes: dict[int, tuple[ResponseHandler, asyncio.TimerHandle]] = {}
        self._asked: dict[int, float] = {}  # status -> when a loss last asked for a probe
        self._on_learn = on_learn
        factory: Callable[..., ResponseHandler] = AnswerHandler  # every connection's protocol
        self._factory = partial(factory, loop=self._loop, pool=self)

    @property
    def closes_after(self) -> list[int]:
        """The statuses after which the server closes its connections unannounced, now."""
        return sorted(self._closes)

    @property
    def keeps_after(self) -> list[int]:
        """The statuses after which the server keeps its connections (reused), now."""
        return sorted(self._keeps)

    async def _get(self, key: ConnectionKey, traces: list[Trace]) -> Connection | None:
        conns = self._conns.get(key)
        if isinstance(conns, deque):
            keeps = self._keeps
            while conns:
                proto, released = conns[0]
                # pooled while its status was trusted: it may no longer be (a loss, a close)
                trusted = not isinstance(proto, AnswerHandler) or proto.status in keeps
                unusable = _unusable(proto)
                pending = 0 if unusable else _pending(proto)
                if trusted and not (unusable or pending):
                    break
                conns.popleft()
                if proto.is_connected() and (proto.should_close or pending == select.POLLIN):
                    self._spoke(key)  # bytes, no close: an idle notice or junk
                elif (
                    isinstance(proto, AnswerHandler)
                    and proto.status not in self._closes
                    and proto.closed_silently(pending)
                    and monotonic() - released <= CLOSE_WINDOW_S
                ):  # the server has started closing after that status
                    self._verdict(key, proto.status, closes=True)
                proto.close()
            if not conns:
                del self._conns[key]
        conn = await super()._get(key, traces)
        if conn is not None and isinstance(reused := conn.protocol, AnswerHandler):
            reused.awaiting = True
        return conn

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
        if isinstance(protocol, AnswerHandler):
            protocol.idle_from = protocol.answers
            if (
                protocol.status not in self._keeps
                and not (self._closed or self._force_close or should_close)
                and not protocol.should_close
            ):  # after a status not judged yet, or one the server closes on: no reuse
                if self._probe(key, protocol):
                    return
                should_close = True
        super()._release(key, protocol, should_close=should_close)
        conns = self._conns.get(key)
        # aiohttp appended (protocol, last use) at the back, where popleft takes it last
        if isinstance(conns, deque) and conns and conns[-1][0] is protocol:
            conns.rotate(1)

    def _probe(self, key: ConnectionKey, protocol: AnswerHandler) -> bool:
        """Hold ``protocol`` out of the pool for ``CLOSE_WINDOW_S`` to see whether the
        server closes it, if its status is due a look; whether it is held."""
        status = protocol.status
        learned = self._closes.get(status)
        if status in self._probes or (learned is not None and monotonic() - learned < RECHECK_S):
            return False
        self._release_acquired(key, protocol)  # out of the pool's count: others may connect
        handle = self._loop.call_later(CLOSE_WINDOW_S, self.judge, key, status)
        self._probes[status] = (protocol, handle)
        protocol.probe = key
        return True

    def judge(self, key: ConnectionKey, status: int) -> None:
        """The probe after ``status``: closed by the server (its ``connection_lost``, at
        once) or at the end of ``CLOSE_WINDOW_S`` (the timer), whichever comes first."""
        got = self._probes.pop(status, None)
        if got is None:
            return
        proto, handle = got
        handle.cancel()
        assert isinstance(proto, AnswerHandler)
        proto.probe = None
        closed = proto.closed_silently(_pending(proto))
        proto.close()
        self._verdict(key, status, closes=closed)

    def lost_after(self, status: int) -> bool:
        """A connection reused after a ``status`` answer was closed by the server under its
        request, before any answer (``AnswerHandler``): whether the server is known to
        close after such answers (then it never read the request). If not, that status is
        probed again at its next answer (no reuse after it meanwhile), at most once a
        ``RECHECK_S``: this loss cannot be told from a server that read the request and
        dropped it, and stays the server's, but a server that has started closing after
        that status is learned, and one that drops requests is not probed on every drop."""
        if status in self._closes:
            return True
        asked = self._asked.get(status)
        if asked is None or monotonic() - asked >= RECHECK_S:
            self._asked[status] = monotonic()
            self._keeps.discard(status)  # judged again at its next answer
        return False

    def _verdict(self, key: ConnectionKey, status: int, *, closes: bool) -> None:
        before = status in self._closes
        if closes:
            self._closes[status] = monotonic()
            self._keeps.discard(status)
        else:
            self._closes.pop(status, None)
            self._keeps.add(status)
        if closes == before:
            return
        if self._on_learn is not None:
            self._on_learn(status, closes)
        else:
            log.warning(
                "server_closes_after_answers" if closes else "server_keeps_connections_again",
                host=f"{key.host}:{key.port}",
                status=status,
            )

    def _close(self, *, abort_ssl: bool = False) -> list[Any]:
        waiters = super()._close(abort_ssl=abort_ssl)
        for proto, handle in self._probes.values():
            handle.cancel()
            if isinstance(proto, AnswerHandler):
                proto.probe = None
            proto.close()
            if (closed := proto.closed) is not None:
                waiters.append(closed)
        self._probes.clear()
        return waiters


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


def _unread(proto: ResponseHandler) -> int:
    """Bytes the kernel holds for this connection that nobody has read (``FIONREAD``; a
    FIN is not one). 0 on TLS, where they may be the protocol's own records (the
    ``close_notify`` of a silent close), and once the loop has closed the socket."""
    transport = proto.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if transport is None or sock is None or transport.get_extra_info("ssl_object") is not None:
        return 0
    try:
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(got, sys.byteorder, signed=True)


def _unusable(proto: ResponseHandler) -> bool:
    """Closing, or holding bytes that answer no request (``should_close``: a parsed message
    waiting, unparsed bytes, a parse error, or ``Connection: close`` seen)."""
    return not proto.is_connected() or proto.should_close
