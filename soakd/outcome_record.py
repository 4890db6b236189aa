"""Outcome record room: one finished request as one compact binary record, the one format
both hops carry (a sender worker's ``OUTCOMES`` frame to soakd, soakd's journal packet to
the writer process). Pure: no IO, no state.

A record is a fixed head (``HEAD``, its fields named in ``FIELDS``), then four tails whose
lengths the head gives: the error detail (UTF-8), the answer's text when it was kept
(UTF-8: a conversation's next turn or a check reads it; the journal's writer drops it),
the ITL gaps (int64 ns, little-endian) and their ``Digest`` buckets (uint32 key, count
pairs), when the process that timed the request counted them. Every field of ``Outcome``
is carried, but ``packed`` (the record itself); ``tests/unit/test_outcome_record.py``
builds an Outcome from ``dataclasses.fields(Outcome)`` and fails on a field added and not
carried here.

Why one format for both hops: soakd need not unpack a worker's record into an ``Outcome``
and pack it again for the journal. It reads the head (named fields: what the runner, the
guards and the probes consume), keeps the record's bytes on the Outcome (``packed``) and
the journal's link thread copies them into its packet as they are, filling in only the
identity (``IDENT``: the target and the phase as indexes in the packet's names, the seq,
the scheduled instant, all of them the parent's own). A record whose instants must move to
the parent's clock (a worker's clock that differs, never seen on one kernel) is unpacked
and packed again instead, as an Outcome built in soakd's own process is.

Both ends are the same installed soakd: no version per record (the journal's packet has
one), no pickle, nothing in a record is code.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Final, NamedTuple

from soakd.model import USAGE_REJECTED_REASONS, ErrorKind, Outcome

FIELDS: Final = (
    ("target", "H"),  # index in the names that travel with the record (NO_NAME: unfilled)
    ("phase", "H"),  # the same
    ("seq", "q"),
    ("scheduled_ns", "q"),
    ("sent_ns", "q"),
    ("wall_start", "d"),
    ("first_byte_ns", "q"),  # NONE: None
    ("first_token_ns", "q"),  # NONE: None
    ("last_token_ns", "q"),  # NONE: None
    ("end_ns", "q"),
    ("status", "H"),
    ("error", "B"),  # index in ErrorKind; NO_KIND: ok; NOT_SENT: a worker did not send it
    ("flags", "B"),  # OOM | USAGE_REPORTED | RETRY_UNREADABLE
    ("prompt_tokens", "q"),  # NONE: None
    ("output_tokens", "q"),  # NONE: None (unknown)
    ("content_chunks", "q"),
    ("usage_rejected", "B"),  # 0: none, else 1 + index in USAGE_REJECTED_REASONS
    ("usage_delta", "q"),  # NO_DELTA: None (-1 is a delta)
    ("retry_after_s", "d"),  # NaN: None
    ("conversation", "q"),  # -1: none
    ("turn", "I"),
    ("n_detail", "H"),  # bytes of error_detail
    ("n_answer", "I"),  # bytes of the answer kept (UTF-8); NO_ANSWER: none kept
    ("n_gaps", "I"),  # ITL gaps
    ("n_keys", "I"),  # (digest key, count) pairs
)
"""The head's fields in order, with their ``struct`` codes: the one definition of a record.
Token counts are int64: the stream parser bounds what a server says to that."""

HEAD: Final = struct.Struct("<" + "".join(code for _, code in FIELDS))
IDENT: Final = struct.Struct("<HHqq")
"""The head's first four fields (target, phase, seq, scheduled_ns): the parent's to fill."""
assert IDENT.format[1:] == "".join(code for _, code in FIELDS[:4])


class Head(NamedTuple):
    """A record's head, field by field (``FIELDS``)."""

    target: int
    phase: int
    seq: int
    scheduled_ns: int
    sent_ns: int
    wall_start: float
    first_byte_ns: int
    first_token_ns: int
    last_token_ns: int
    end_ns: int
    status: int
    error: int
    flags: int
    prompt_tokens: int
    output_tokens: int
    content_chunks: int
    usage_rejected: int
    usage_delta: int
    retry_after_s: float
    conversation: int
    turn: int
    n_detail: int
    n_answer: int
    n_gaps: int
    n_keys: int


assert Head._fields == tuple(name for name, _ in FIELDS)

NONE: Final = -1
NO_DELTA: Final = -(1 << 63)
NO_NAME: Final = 0xFFFF
NO_KIND: Final = 255
NO_ANSWER: Final = 0xFFFFFFFF
NOT_SENT: Final = 254
"""The error byte of a request a worker did not send (``NotSent``): the detail is why."""
OOM, USAGE_REPORTED, RETRY_UNREADABLE = 1, 2, 4
KINDS: Final = tuple(ErrorKind)
_KIND_INDEX: Final = {kind: i for i, kind in enumerate(KINDS)}
_REJECTED: Final = ("", *USAGE_REJECTED_REASONS)
_REJECTED_INDEX: Final = {reason: i for i, reason in enumerate(_REJECTED)}
_GAP: Final = 8  # bytes of a gap
_PAIR: Final = 8  # bytes of a (key, count) pair
_BIG: Final = sys.byteorder == "big"
NOT_CARRIED: Final = frozenset({"packed"})
"""Outcome fields a record does not carry: ``packed`` is the record."""


class RecordError(ValueError):
    """Bytes that are not whole records."""


def _opt(value: int | None) -> int:
    return NONE if value is None else value


def _le(values: array[int]) -> bytes:
    if _BIG:
        values = values[:]
        values.byteswap()
    return values.tobytes()


def pack(buf: bytearray, o: Outcome, target: int = NO_NAME, phase: int = NO_NAME) -> None:
    """Append ``o``'s record; ``target`` and ``phase`` are indexes in the names that travel
    with it (a worker leaves them unfilled: soakd fills them). Its ITL buckets travel when
    counted (``o.itl_keys``); otherwise the reader counts them."""
    detail = o.error_detail.encode()[:0xFFFF] if o.error_detail else b""
    answer = None if o.answer is None else _answer_tail(o.answer, o.identity)
    gaps = o.itl_ns
    keys = o.itl_keys
    error = o.error
    buf += HEAD.pack(
        target,
        phase,
        o.seq,
        o.scheduled_ns,
        o.sent_ns,
        o.wall_start,
        _opt(o.first_byte_ns),
        _opt(o.first_token_ns),
        _opt(o.last_token_ns),
        o.end_ns,
        o.status,
        NO_KIND if error is None else _KIND_INDEX[error],
        o.oom * OOM
        | o.usage_reported * USAGE_REPORTED
        | o.retry_after_unreadable * RETRY_UNREADABLE,
        _opt(o.prompt_tokens),
        _opt(o.output_tokens),
        o.content_chunks,
        _REJECTED_INDEX[o.usage_rejected],
        NO_DELTA if o.usage_delta is None else o.usage_delta,
        math.nan if o.retry_after_s is None else o.retry_after_s,
        o.conversation,
        o.turn,
        len(detail),
        NO_ANSWER if answer is None else len(answer),
        len(gaps),
        len(keys) if keys else 0,
    )
    if detail:
        buf += detail
    if answer:
        buf += answer
    if gaps:
        buf += _le(gaps)
    if keys:
        buf += _le(array("I", chain.from_iterable(keys.items())))  # key, count, key, count...


def pack_not_sent(buf: bytearray, reason: str, seq: int = 0) -> None:
    """Append the record of a request a worker did not send: ``NOT_SENT``, the reason as its
    detail."""
    text = reason.encode()[:0xFFFF]
    buf += HEAD.pack(
        NO_NAME, NO_NAME, seq, 0, 0, 0.0, NONE, NONE, NONE, 0, 0, NOT_SENT, 0, NONE, 0, 0, 0,
        NO_DELTA, math.nan, -1, 0, len(text), NO_ANSWER, 0, 0,
    )  # fmt: skip
    buf += text


def head(data: bytes | memoryview, at: int = 0) -> Head:
    """The head of the record at ``data[at:]``; RecordError when it is cut short."""
    try:
        return Head._make(HEAD.unpack_from(data, at))
    except struct.error:
        raise RecordError("a record's head cut short") from None


def end_of(h: Head, at: int) -> int:
    """Where the record whose head ``h`` starts at ``at`` ends."""
    answer = 0 if h.n_answer == NO_ANSWER else h.n_answer
    return at + HEAD.size + h.n_detail + answer + h.n_gaps * _GAP + h.n_keys * _PAIR


def detail(data: bytes, at: int, h: Head) -> str:
    """The record's error detail (for a ``NOT_SENT`` record: why)."""
    start = at + HEAD.size
    return str(data[start : start + h.n_detail], "utf-8", "replace") if h.n_detail else ""


def fill(
    o: Outcome, h: Head, data: bytes | memoryview, at: int, shift: int = 0, *, tails: bool = True
) -> None:
    """Set ``o``'s fields, but its identity (target, phase, seq, scheduled_ns), from the
    record at ``data[at:]`` whose head is ``h``; ``shift`` is added to its instants (0 on
    one kernel). ``tails=False`` leaves the ITL gaps and buckets out: whoever reads them
    (the journal's writer) reads the record itself (``o.packed``)."""
    # one unpacking of the head, in FIELDS' order (checked against Head above): the
    # fastest way to the 25 fields, for every outcome soakd and the writer read
    (
        _,
        _,
        _,
        _,
        sent,
        o.wall_start,
        first_byte,
        first_token,
        last_token,
        end,
        o.status,
        kind,
        flags,
        prompt,
        output,
        o.content_chunks,
        rejected,
        delta,
        retry,
        o.conversation,
        o.turn,
        n,
        n_answer,
        n_gaps,
        n_keys,
    ) = h
    o.sent_ns = sent + shift if sent else 0
    o.first_byte_ns = None if first_byte == NONE else first_byte + shift
    o.first_token_ns = None if first_token == NONE else first_token + shift
    o.last_token_ns = None if last_token == NONE else last_token + shift
    o.end_ns = end + shift if end else 0
    o.error = None if kind == NO_KIND else KINDS[kind]
    o.oom = bool(flags & OOM)
    o.usage_reported = bool(flags & USAGE_REPORTED)
    o.retry_after_unreadable = bool(flags & RETRY_UNREADABLE)
    o.prompt_tokens = None if prompt == NONE else prompt
    o.output_tokens = None if output == NONE else output
    o.usage_rejected = _REJECTED[rejected]
    o.usage_delta = None if delta == NO_DELTA else delta
    o.retry_after_s = None if retry != retry else retry  # NaN: None
    start = at + HEAD.size
    o.error_detail = str(data[start : start + n], "utf-8", "replace") if n else ""
    start += n
    if n_answer == NO_ANSWER:
        o.answer = o.identity = None
    else:
        o.answer, o.identity = _answer_of(str(data[start : start + n_answer], "utf-8", "replace"))
        start += n_answer
    if not tails:
        return
    n = n_gaps * _GAP
    gaps: array[int] = array("q")
    if n:
        gaps.frombytes(data[start : start + n])
        if _BIG:
            gaps.byteswap()
    o.itl_ns = gaps
    if n_keys:
        start += n
        pairs: array[int] = array("I")
        pairs.frombytes(data[start : start + n_keys * _PAIR])
        if _BIG:
            pairs.byteswap()
        pair = iter(pairs)  # key, count, key, count...: one iterator zipped with itself
        o.itl_keys = dict(zip(pair, pair))  # noqa: B905  # 2 * n_keys values, read above
    else:
        o.itl_keys = None


def read(data: bytes | memoryview, at: int, names: Sequence[str]) -> tuple[Outcome, int]:
    """The Outcome of the record at ``data[at:]`` (its target and phase from ``names``), and
    where the record ends; RecordError when it is not a whole record."""
    h = head(data, at)
    end = end_of(h, at)
    if end > len(data):
        raise RecordError("a record cut short")
    try:
        o = Outcome(names[h.target], names[h.phase], h.seq, h.scheduled_ns)
    except IndexError:
        raise RecordError(f"a record's names ({h.target}, {h.phase}) are not sent") from None
    fill(o, h, data, at)
    return o, end


def read_all(data: bytes, names: Sequence[str]) -> Iterator[Outcome]:
    """Every record in ``data``, in order."""
    view = memoryview(data)  # the tails copied once, into their arrays
    at, end = 0, len(data)
    while at < end:
        o, at = read(view, at, names)
        yield o


def _answer_tail(answer: str, identity: tuple[str, str] | None) -> bytes:
    """The answer's tail: its text, then NUL, the model, NUL, the fingerprint (neither holds
    a NUL: soakd/targets/stream.py served_by); an identity not seen travels as NUL NUL."""
    model, fingerprint = identity if identity is not None else ("", "")
    return f"{answer}\0{model}\0{fingerprint}".encode()


def _answer_of(tail: str) -> tuple[str, tuple[str, str] | None]:
    answer, model, fingerprint = tail.rsplit("\0", 2)
    return answer, (model, fingerprint) if model or fingerprint else None
