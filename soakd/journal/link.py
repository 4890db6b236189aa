"""Journal link room: the frames between soakd and its journal writer process. Pure.

A frame is ``u32 length | u8 kind | payload`` (soakd/framing.py, as between soakd and its
sender workers).
JSON where a frame is small or rare; the outcomes as their records (batch.py).

- ``HELLO`` (soakd -> writer, JSON): the journal's path, the run, ``journal:`` as dumped,
  what a resume continues from, and the session to rejoin (0: a new one).
- ``READY`` (writer -> soakd, JSON): what the journal holds (``Restored``), the session, the
  last packet this session committed before (a restarted writer), the writer's pid; or
  ``FAILED`` with the one-line error (the journal cannot be used).
- ``PACKET`` (soakd -> writer): ``u32 length | header (JSON) | records``: the packet's
  sequence number, the plan clock, samples, events, a tally of outcomes soakd could not
  queue, whether soakd already counted it (sent again to a restarted writer), and the
  outcomes' records (a batch).
- ``FOLD`` (writer -> soakd, JSON): a batch's fold (soakd/measure/fold.py), ``through`` the last
  packet in it, ``committed`` or not yet (the disk failing); ``COMMITTED``: packets up to
  ``through`` committed, their folds sent earlier.
- ``STATS``, ``LOG`` (writer -> soakd, JSON): the writer's own counts (counts.py) after each
  commit; a log event, logged by soakd as its own.
- ``CLOSE`` (soakd -> writer, JSON ``{}``): write everything and stop; ``CLOSED`` the answer.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

from soakd import framing
from soakd.framing import frame

HELLO, READY, FAILED, PACKET, FOLD, COMMITTED, STATS, LOG, CLOSE, CLOSED = range(1, 11)

MAX_FRAME: Final = 256 << 20
"""A frame longer than this is a broken peer, not data."""
_LEN = struct.Struct("<I")

LinkError = framing.FrameError
"""A frame that cannot be read: the other end is broken."""


def json_frame(kind: int, doc: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(doc, separators=(",", ":"), default=str).encode())


def packet(header: dict[str, Any], records: bytes) -> bytes:
    """A ``PACKET`` frame."""
    head = json.dumps(header, separators=(",", ":"), default=str).encode()
    return frame(PACKET, _LEN.pack(len(head)) + head + records)


def unpack_packet(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """A ``PACKET``'s header and its records (the bytes ``batch.Batch.decode`` reads)."""
    try:
        (n,) = _LEN.unpack_from(payload, 0)
        header: dict[str, Any] = json.loads(payload[_LEN.size : _LEN.size + n])
    except (struct.error, ValueError) as exc:
        raise LinkError(f"packet: {exc}") from None
    return header, payload[_LEN.size + n :]


def frames() -> framing.Frames:
    """A reader of this link's frames (up to ``MAX_FRAME``)."""
    return framing.Frames(MAX_FRAME)
