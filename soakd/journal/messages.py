"""Journal messages room: every frame of the link between soakd and its journal's writer
process, one frozen dataclass each, and the one codec both ends read and write them with.
Pure; the standard library and the journal's own rooms only (the writer imports it).

A frame is ``u32 length | u8 kind | payload`` (soakd/framing.py, the workers' too), up to
``MAX_FRAME``. A message's payload is its JSON object, field by field (jsondoc.py, the
codec of the journal's events): ``encode`` and ``decode`` know no message by name, so a
field added to a message travels, and a message added to ``MESSAGES`` is read.
``tests/unit/test_messages.py`` builds every message from its fields and round-trips it.
A ``bytes`` field (a ``Packet``'s records) is no JSON: it follows the object, as it is
(``u32 length | object | bytes``).

- ``Hello`` (soakd -> writer): the journal's path, the run, ``journal:`` (``WriterConfig``),
  what a resume continues from (``Resume``), and the session to rejoin (0: a new one).
- ``Ready`` (writer -> soakd): what the journal holds (``Restored``), the session, the last
  packet this session committed before (a restarted writer), the writer's pid; or
  ``Failed`` with the one-line error (the journal cannot be used).
- ``Packet`` (soakd -> writer): its sequence number, the plan clock's last snapshot,
  samples, events, a tally of outcomes soakd could not queue, whether soakd already counted
  it (sent again to a restarted writer), and the outcomes' records (a batch: batch.py).
- ``Folded`` (writer -> soakd): a batch's fold (soakd/measure/fold.py), ``through`` the last
  packet in it, ``committed`` or not yet (the disk failing); ``Committed``: packets up to
  ``through`` committed, their folds sent earlier.
- ``Stats``, ``Log`` (writer -> soakd): the writer's own counts (counts.py) after each
  commit; a log event, logged by soakd as its own.
- ``Close`` (soakd -> writer): write everything and stop; ``Closed`` the answer.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol, cast

from soakd import framing
from soakd.journal import jsondoc
from soakd.journal.jsondoc import Json
from soakd.journal.progress import ClockState, Resumed
from soakd.journal.records import EventRow
from soakd.measure.fold import Fold
from soakd.model import Sample

if TYPE_CHECKING:
    from soakd.config import JournalConfig

HELLO, READY, FAILED, PACKET, FOLD, COMMITTED, STATS, LOG, CLOSE, CLOSED = range(1, 11)

MAX_FRAME: Final = 256 << 20
"""A frame longer than this is a broken peer, not data."""
_LEN = struct.Struct("<I")

LinkError = framing.FrameError
"""A frame that cannot be read: the other end is broken."""


def frames() -> framing.Frames:
    """A reader of this link's frames (up to ``MAX_FRAME``)."""
    return framing.Frames(MAX_FRAME)


# --- what the messages carry ---------------------------------------------------------------


class _Dumps(Protocol):
    def model_dump(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class WriterConfig:
    """``journal:`` as the writer reads it: ``JournalConfig``'s fields, without the config
    models (the writer process does not load pydantic). No defaults here: ``of`` takes every
    field of a ``JournalConfig``, and a field one side has and the other lacks is a
    TypeError at the first start (``tests/unit/test_messages.py`` holds the two together)."""

    synchronous: Literal["full", "normal"]
    flush_interval: float
    queue_size: int
    keep_samples: float | None
    keep_requests: float | None
    max_bytes: int | None
    itl_gaps: bool
    itl: Literal["compact", "exact"]

    @classmethod
    def of(cls, journal: JournalConfig | _Dumps) -> WriterConfig:
        return cls(**journal.model_dump())


@dataclass(frozen=True, slots=True)
class Resume:
    """What a resumed run continues from (``progress.Resumed``: ``ResumeState`` has it)."""

    offset_ns: int
    next_seq: dict[str, int]
    last_wall: float

    @classmethod
    def of(cls, resumed: Resumed) -> Resume:
        return cls(resumed.offset_ns, dict(resumed.next_seq), resumed.last_wall)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the journal stores about the run when it creates it."""

    run_id: str
    config: dict[str, Json]
    plan: dict[str, Json]
    plan_start: datetime
    options: dict[str, float | None]
    window_ns: int


@dataclass(frozen=True, slots=True)
class Restored:
    """What the journal held when this session opened it (for Metrics.restore)."""

    totals: list[tuple[str, str, str, str, int, int, int, int]]
    histograms: dict[tuple[str, str], tuple[list[int], float]]
    downtime_s: float
    resumes: int
    missed: dict[tuple[str, str, str], int]  # sends not made
    notes: list[tuple[str, str, int]]  # (target, note, count)


# --- the frames ----------------------------------------------------------------------------


class Message:
    """A frame of the writer link: ``KIND`` is its frame kind."""

    __slots__ = ()
    KIND: ClassVar[int]


@dataclass(frozen=True, slots=True)
class Hello(Message):
    KIND = HELLO
    path: str
    run: RunInfo
    journal: WriterConfig
    resume: Resume | None
    session: int  # 0: a new session; else the one a restarted writer continues


@dataclass(frozen=True, slots=True)
class Ready(Message):
    KIND = READY
    restored: Restored
    session: int
    packet_seq: int  # the last packet this session committed before this writer
    pid: int


@dataclass(frozen=True, slots=True)
class Failed(Message):
    KIND = FAILED
    error: str


@dataclass(frozen=True, slots=True)
class Packet(Message):
    KIND = PACKET
    seq: int
    clock: ClockState | None
    samples: tuple[Sample, ...] = ()
    events: tuple[EventRow, ...] = ()
    tally: Fold | None = None  # outcomes soakd could not queue: into the totals only
    counted: bool = False  # sent again to a restarted writer, its fold applied already
    records: bytes = b""  # the outcomes' records (batch.py), after the JSON


@dataclass(frozen=True, slots=True)
class Folded(Message):
    KIND = FOLD
    fold: Fold
    through: int
    committed: bool


@dataclass(frozen=True, slots=True)
class Committed(Message):
    KIND = COMMITTED
    through: int


@dataclass(frozen=True, slots=True)
class Stats(Message):
    """The writer's own counts since it last sent them (counts.py; ``JournalMetrics.add``):
    counters' increments, gauges' last values (None: not set), commit durations."""

    KIND = STATS
    write_errors: float = 0.0
    downtime: float = 0.0
    rows_dropped: float = 0.0
    last_commit: float | None = None
    size: float | None = None
    max_bytes: float | None = None
    disk_free: float | None = None
    rows_kept: float | None = None
    records: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, float] = field(default_factory=dict)
    commit: tuple[float, ...] = ()

    def __bool__(self) -> bool:
        return self != _NO_STATS


_NO_STATS: Final = Stats()


@dataclass(frozen=True, slots=True)
class Log(Message):
    KIND = LOG
    level: str
    event: str
    fields: dict[str, Json]


@dataclass(frozen=True, slots=True)
class Close(Message):
    KIND = CLOSE


@dataclass(frozen=True, slots=True)
class Closed(Message):
    KIND = CLOSED
    unwritten: int = 0  # records the journal could not write at all


MESSAGES: Final[dict[int, type[Message]]] = {
    m.KIND: m for m in (Hello, Ready, Failed, Packet, Folded, Committed, Stats, Log, Close, Closed)
}
"""Every message by its frame kind."""


def _tail(cls: type[Message]) -> str | None:
    """The message's ``bytes`` field, sent after its JSON (at most one)."""
    fields = dataclasses.fields(cast("Any", cls))
    names = [f.name for f in fields if f.type in ("bytes", bytes)]
    assert len(names) <= 1, cls
    return names[0] if names else None


_TAILS: Final = {cls: _tail(cls) for cls in MESSAGES.values()}


def encode(msg: Message) -> bytes:
    """The message's frame."""
    cls = type(msg)
    tail = _TAILS[cls]
    doc = jsondoc.doc(msg, leave=(tail,) if tail else ())
    head = json.dumps(doc, separators=(",", ":")).encode()
    if tail is None:
        return framing.frame(cls.KIND, head)
    data: bytes = getattr(msg, tail)
    return framing.frame(cls.KIND, _LEN.pack(len(head)), head, data)


def decode(kind: int, payload: bytes) -> Message:
    """The message of a frame; LinkError when it is none this soakd sends."""
    cls = MESSAGES.get(kind)
    if cls is None:
        raise LinkError(f"a frame of kind {kind}")
    tail = _TAILS[cls]
    try:
        if tail is None:
            return jsondoc.from_doc(cls, _object(payload))
        (n,) = _LEN.unpack_from(payload, 0)
        msg = jsondoc.from_doc(cls, _object(payload[_LEN.size : _LEN.size + n]))
        return dataclasses.replace(msg, **{tail: payload[_LEN.size + n :]})  # type: ignore[type-var]
    except (struct.error, ValueError, TypeError) as exc:
        raise LinkError(f"{cls.__name__}: {exc}") from None


def _object(raw: bytes) -> dict[str, object]:
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise TypeError(f"{type(doc).__name__}, not an object")
    return doc
