"""Framing room: the one frame codec of soakd's links to its own processes. Pure.

A frame is ``u32 length | u8 kind | payload``: the length counts the kind byte and the
payload, little-endian. Both links speak it: soakd and its sender workers
(soakd/workers/wire.py), soakd and the journal's writer process (soakd/journal/messages.py).
Each link has its own kinds and its own ``limit``: a frame longer than that is a broken
peer, not data. Two readers of one codec: ``Frames`` takes bytes as a socket gives them (the
journal's link thread and the writer, plain sockets), ``read_frame`` reads one frame from
an asyncio stream (the workers' link).

Standard library only, and no asyncio at import: the journal's writer process imports it.
"""

from __future__ import annotations

import struct
from typing import Final, Protocol

HEAD: Final = struct.Struct("<IB")
"""A frame's header: the payload's length (kind byte included) and the kind."""


class FrameError(Exception):
    """A frame that cannot be read: the other end is broken (or not soakd's own)."""


def frame(kind: int, *parts: bytes | bytearray) -> bytes:
    """One frame of ``kind`` whose payload is ``parts`` joined (copied once)."""
    size = sum(len(p) for p in parts)
    return b"".join((HEAD.pack(size + 1, kind), *parts))


def _checked(size: int, limit: int) -> int:
    if not 1 <= size <= limit:
        raise FrameError(f"frame of {size} bytes")
    return size


class Frames:
    """Frames out of a byte stream, as it arrives; ``limit``: the longest frame."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The ``(kind, payload)`` frames ``data`` completes (the rest waits for more)."""
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        at, end = 0, len(buf)
        while end - at >= HEAD.size:
            size, kind = HEAD.unpack_from(buf, at)
            _checked(size, self.limit)
            if end - at - HEAD.size < size - 1:
                break
            start = at + HEAD.size
            out.append((kind, bytes(buf[start : start + size - 1])))
            at = start + size - 1
        del buf[:at]
        return out

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished frame are waiting."""
        return bool(self._buf)


class Reader(Protocol):
    """What ``read_frame`` reads from (``asyncio.StreamReader``)."""

    async def readexactly(self, n: int) -> bytes: ...


async def read_frame(reader: Reader, limit: int) -> tuple[int, bytes] | None:
    """The next ``(kind, payload)``; None at a clean end of the stream."""
    try:
        head = await reader.readexactly(HEAD.size)
    except EOFError as exc:  # asyncio.IncompleteReadError: the stream ended
        if getattr(exc, "partial", b""):
            raise FrameError("stream ended inside a frame header") from None
        return None
    size, kind = HEAD.unpack(head)
    _checked(size, limit)
    try:
        return kind, await reader.readexactly(size - 1)
    except EOFError:
        raise FrameError("stream ended inside a frame") from None
