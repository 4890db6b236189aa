"""Targets room, HTTP framing: a response whose HTTP breaks mid-body fails at once, and a
body longer than its Content-Length is named.

aiohttp's HTTP parser runs in its connection's protocol (``ResponseHandler``). When it
rejects bytes after the headers (a chunk size that is not hex, a chunk that does not end
where its size says), the protocol fails and closes the connection, but the answer's
reader is another object, the response's ``StreamReader``:

- with the C parser (aiohttp's default, measured on 3.14) the reader is dropped without
  an exception or an end, and a streamed answer waits until soakd's idle or total deadline
  fires: a broken chunked encoding was counted ``timeout_idle`` after 60 s;
- with the pure-Python parser (``AIOHTTP_NO_EXTENSIONS=1``) the reader gets the parser's
  own exception (``TransferEncodingError``, not a ``ClientError``) at once.

``FramingHandler`` hands the reader the parser's error in both cases, so the request
ends when the bad bytes arrive and is counted ``protocol_error`` (soakd/targets/openai.py).

**A body longer than its Content-Length.** The parser ends the answer where the header
said, and reads what follows as the next response: bytes that are not one fail the parse
in the same read. ``overrun`` records that the answer that just ended was followed so, so
the reader names it (``protocol_error``) instead of a stream cut short. Extra bytes that
arrive in a later read are junk on an idle connection, which the pool closes unused
(soakd/targets/pool.py).
"""

from __future__ import annotations

import asyncio

from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["FramingHandler", "HttpProcessingError", "overrun"]


class FramingHandler(ResponseHandler):
    """aiohttp's protocol for one connection, whose parse errors reach the answer's reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.overrun = False  # an answer's body was followed by bytes that are not HTTP

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        # aiohttp links the parser's own error as the cause only when a read waits on the
        # connection; the reader failed below needs it too, to name it (BadStatusLine...)
        if exc_cause is None:
            super().set_exception(exc)
            return
        if exc.__cause__ is None and exc_cause is not exc and type(exc_cause) is not BaseException:
            exc.__cause__ = exc_cause  # (a bare BaseException is aiohttp's "no cause")
        super().set_exception(exc, exc_cause)

    def data_received(self, data: bytes) -> None:
        payload = self._payload
        reading = payload is not None and not payload.is_eof()
        super().data_received(data)
        exc = self.exception()
        if not reading or not isinstance(exc, HttpProcessingError):
            return
        assert payload is not None
        if payload.is_eof():  # it ended (Content-Length) and what followed is not HTTP
            self.overrun = True
        elif payload.exception() is None:  # the C parser dropped it: fail it now
            payload.set_exception(exc)


def overrun(protocol: object) -> bool:
    """Was the answer read on ``protocol`` (a response's) followed by bytes that are not
    HTTP? False for a protocol that is not a FramingHandler."""
    return isinstance(protocol, FramingHandler) and protocol.overrun
