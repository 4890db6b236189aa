"""Targets room, connection pool: idle connections handed out newest first, so the pool
shrinks back after a burst.

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
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Final

from aiohttp import TCPConnector

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ConnectionKey

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

    def _release(
        self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False
    ) -> None:
        super()._release(key, protocol, should_close=should_close)
        conns = self._conns.get(key)
        # aiohttp appended (protocol, last use) at the back, where popleft takes it last
        if isinstance(conns, deque) and conns and conns[-1][0] is protocol:
            conns.rotate(1)
