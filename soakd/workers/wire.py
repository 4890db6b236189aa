"""Workers room, the wire: frames between the parent and a sender process.

A frame is ``u32 length | u8 kind | payload`` (soakd/framing.py, the journal's writer link
speaks it too; this link's frames are up to ``MAX_FRAME``). Requests and outcomes travel in batches
(one frame per event-loop turn, however many it holds), packed with ``struct``: no
pickle, no per-request object on the wire, and nothing a newer soakd on the other end
could misread, since both ends are the same installed code.

- ``HELLO`` (parent -> worker, JSON): the worker's index, the run id, the targets'
  resolved configs (secrets by reference only: the worker reads its keys itself), the
  workload and the calibrations so far: what the worker builds each request's text from
  (soakd/workload/build.py).
- ``READY`` (worker -> parent, JSON): the worker's pid.
- ``SEND`` (parent -> worker): requests, each ``id, target, seq, max_tokens, planned
  (the answer length is planned: 1), temperature, scheduled_ns, deadline_ns, conversation,
  turn, keep_answer`` and a conversation's history (the answers its server gave to the
  earlier turns, each length-prefixed): no prompt text, the worker builds it, but for a
  check's few words, given outright (soakd/checks/mix.py). The instants
  are on the parent's clock; the worker converts them with the offset the parent measured.
- ``CALIBRATE`` (parent -> worker, JSON): a calibration measured or corrected since the
  HELLO (its ``from_seq`` on), written ahead of any SEND that needs it.
- ``CANCEL`` (parent -> worker): request ids to cut (the drain deadline passed).
- ``PING`` / ``PONG``: the clock check (``t0`` from the parent, ``t1`` the worker's now).
- ``OUTCOMES`` (worker -> parent): finished requests, each the id and the Outcome's record
  (soakd/outcome_record.py, the one the journal's packets carry: instants on the worker's
  clock, ITL gaps as raw int64 and their Digest buckets; the identity left to the parent),
  or the id and a ``NOT_SENT`` record whose detail says why it was not sent (past its
  deadline when the worker got to it).
- ``CLOSES`` (worker -> parent): a target's server closes (or keeps again) its
  connections after answers with a status, as the worker's pool learned it
  (soakd/targets/pool.py): the target's index, the status, 1 or 0.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Final

from soakd import framing, outcome_record
from soakd.framing import HEAD as HEAD  # the link's frames (soakd/framing.py)
from soakd.framing import frame as frame
from soakd.measure.analysis import itl_keys
from soakd.model import Outcome, RequestSpec
from soakd.workload.calibration import Calibration

HELLO, READY, SEND, CANCEL, PING, PONG, OUTCOMES, CLOCK, CLOSES, CALIBRATE = range(1, 11)

MAX_FRAME: Final = 64 << 20
"""A frame longer than this is a broken peer, not data."""

_SPEC = struct.Struct("<IHqIBdqqqIBHI")
# id, target, seq, max_tokens, planned, temperature, scheduled, deadline (0: none),
# conversation (-1: none), turn, keep_answer, answers in the history (each: u32 length,
# text), the bytes of a text given outright (a check's: the only text the parent makes;
# 0: the worker's builder makes it), then that text
_LEN = struct.Struct("<I")
_RID = struct.Struct("<I")  # an OUTCOMES entry: the request id, then its record
_CLOCK = struct.Struct("<qq")
_CLOSES = struct.Struct("<HHB")  # target, status, closes
_IDS = struct.Struct("<I")
NOT_SENT: Final = outcome_record.NOT_SENT
"""The error byte of a record that never went out (``NotSent``): its detail is the reason."""


WireError = framing.FrameError
"""A frame or a batch that cannot be read: the peer is broken (or not a soakd worker)."""


def json_frame(kind: int, doc: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(doc).encode())


def pack_spec(buf: bytearray, rid: int, target: int, spec: RequestSpec) -> None:
    """Append one request to a SEND batch."""
    history = spec.history
    given = spec.prompt.encode() if spec.prompt else b""
    buf += _SPEC.pack(
        rid,
        target,
        spec.seq,
        spec.max_tokens,
        spec.output_planned,
        spec.temperature,
        spec.scheduled_ns,
        spec.deadline_ns,
        spec.conversation,
        spec.turn,
        spec.keep_answer,
        len(history),
        len(given),
    )
    for answer in history:
        text = answer.encode()
        buf += _LEN.pack(len(text))
        buf += text
    buf += given


def unpack_specs(
    payload: bytes, names: Sequence[str] = (), shift: int = 0
) -> Iterator[tuple[int, int, RequestSpec]]:
    """``(id, target index, spec)`` per request: the spec's target named from ``names``
    (empty when not given), its phase empty, its prompt empty unless the parent gave one
    (a check's; else the worker's builder makes the text), ``shift`` (the parent's clock
    minus the reader's) taken from its instants."""
    at, end, size = 0, len(payload), _SPEC.size
    while at < end:
        if at + size > end:
            raise WireError("SEND batch ends inside a request")
        (
            rid,
            target,
            seq,
            max_tokens,
            planned,
            temp,
            scheduled,
            deadline,
            conversation,
            turn,
            keep,
            n,
            n_given,
        ) = _SPEC.unpack_from(payload, at)
        at += size
        history: tuple[str, ...] = ()
        if n:
            answers = []
            for _ in range(n):
                if at + _LEN.size > end:
                    raise WireError("SEND batch ends inside a history")
                (length,) = _LEN.unpack_from(payload, at)
                at += _LEN.size
                if at + length > end:
                    raise WireError("SEND batch ends inside a history")
                answers.append(payload[at : at + length].decode())
                at += length
            history = tuple(answers)
        if at + n_given > end:
            raise WireError("SEND batch ends inside a prompt")
        given = payload[at : at + n_given].decode() if n_given else ""
        at += n_given
        yield (
            rid,
            target,
            RequestSpec(
                names[target] if names else "",
                "",
                seq,
                given,
                0,
                max_tokens,
                temp,
                scheduled - shift,
                deadline - shift if deadline else 0,
                planned == 1,
                conversation,
                turn,
                keep == 1,
                history,
            ),
        )
    if at != end:
        raise WireError("SEND batch ends inside a request")


def calibration_doc(cal: Calibration) -> dict[str, Any]:
    """A calibration as HELLO and CALIBRATE carry it."""
    return {
        "source": cal.source,
        "reference": cal.reference,
        "costs": list(cal.costs) if cal.costs is not None else None,
        "scale": cal.scale,
        "overhead": cal.overhead,
        "from_seq": cal.from_seq,
    }


def read_calibration(doc: dict[str, Any]) -> Calibration:
    """``calibration_doc``'s inverse (WireError: not one)."""
    try:
        return Calibration.read(
            doc["source"],
            doc["reference"],
            doc["costs"],
            doc["scale"],
            doc["overhead"],
            doc["from_seq"],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"not a calibration ({exc})") from None


def pack_ids(buf: bytearray, rid: int) -> None:
    """Append one request id to a CANCEL batch."""
    buf += _IDS.pack(rid)


def unpack_ids(payload: bytes) -> tuple[int, ...]:
    if len(payload) % _IDS.size:
        raise WireError("CANCEL batch of a partial id")
    return struct.unpack(f"<{len(payload) // _IDS.size}I", payload)


def pack_clock(t0: int, t1: int) -> bytes:
    return _CLOCK.pack(t0, t1)


def unpack_clock(payload: bytes) -> tuple[int, int]:
    t0, t1 = _CLOCK.unpack(payload)
    return int(t0), int(t1)


def pack_closes(target: int, status: int, closes: bool) -> bytes:
    return _CLOSES.pack(target, status, closes)


def unpack_closes(payload: bytes) -> tuple[int, int, bool]:
    try:
        target, status, closes = _CLOSES.unpack(payload)
    except struct.error:
        raise WireError("CLOSES of the wrong size") from None
    return int(target), int(status), bool(closes)


def pack_outcome(buf: bytearray, rid: int, o: Outcome) -> None:
    """Append one finished request to an OUTCOMES batch: its id and its record, with its
    ITL gaps' Digest buckets (counted here, by the worker that timed it, not by soakd)."""
    itl_keys(o)
    buf += _RID.pack(rid)
    outcome_record.pack(buf, o)


def pack_not_sent(buf: bytearray, rid: int, reason: str) -> None:
    """Append a request the worker did not send (``NotSent``) to an OUTCOMES batch."""
    buf += _RID.pack(rid)
    outcome_record.pack_not_sent(buf, reason)


def unpack_outcomes(payload: bytes) -> Iterator[tuple[int, outcome_record.Head, int, int]]:
    """``(id, head, start, end)`` per finished request: its record is ``payload[start:end]``
    (``outcome_record.fill`` sets an Outcome's fields from it)."""
    at, end, rid_size = 0, len(payload), _RID.size
    while at < end:
        if at + rid_size + outcome_record.HEAD.size > end:
            raise WireError("OUTCOMES batch ends inside a request")
        (rid,) = _RID.unpack_from(payload, at)
        at += rid_size
        head = outcome_record.head(payload, at)
        stop = outcome_record.end_of(head, at)
        if stop > end:
            raise WireError("OUTCOMES batch ends inside a request")
        yield rid, head, at, stop
        at = stop


FRAME_SPLIT: Final = 8 << 20
"""A batch this long takes no more records: the next go in a new frame of the same kind,
so a turn of long prompts (a million tokens is ~7 MB) never makes a frame past MAX_FRAME."""


class Outbox:
    """Records for the other end, batched: one frame per kind per flush (more when a batch
    passes FRAME_SPLIT), however many records it holds, written in the order of the kinds'
    numbers (a SEND before a CANCEL of the same turn, so a cut never overtakes its request).

    A record someone waits for (``buf``) is flushed at the end of this loop turn; one
    nobody waits for (``buf(kind, wait_ns=...)``: an open-loop outcome, whose instants are
    already stamped) may wait that long for company, so a busy worker writes a frame every
    few ms, not one per request."""

    def __init__(self) -> None:
        self._parts: dict[int, list[bytearray]] = {}
        self._more = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    def buf(self, kind: int, wait_ns: int = 0) -> bytearray:
        """The open batch of ``kind``: pack records into it; it leaves at the next flush,
        within ``wait_ns`` (0: this turn)."""
        parts = self._parts.get(kind)
        if parts is None:
            parts = self._parts[kind] = [bytearray()]
        elif len(parts[-1]) >= FRAME_SPLIT:
            parts.append(bytearray())
        part = parts[-1]
        if not wait_ns:
            self._more.set()
        elif self._timer is None and not self._more.is_set():
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(wait_ns / 1e9, self._more.set)
        return part

    def clear(self) -> None:
        """Forget what is waiting (the other end is gone)."""
        self._parts = {}

    def write_to(self, writer: asyncio.StreamWriter) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        parts, self._parts = self._parts, {}
        for kind in sorted(parts):
            for part in parts[kind]:
                if part:
                    writer.write(frame(kind, part))

    async def flush_forever(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await self._more.wait()
            self._more.clear()
            self.write_to(writer)
            await writer.drain()


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next ``(kind, payload)``; None at a clean end of the stream."""
    return await framing.read_frame(reader, MAX_FRAME)
