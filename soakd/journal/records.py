"""Journal records room: the run's events as the type checker sees them, written and read.

Every event the journal holds has an ``EventKind`` and one frozen dataclass, whose fields are
the keys of its ``data`` (the ``events`` table stores ``kind`` and ``data`` as JSON, as it
always did: docs/journal.md), written and read by the journal's one field codec
(jsondoc.py, which the writer link's frames use too). soakd's side journals only these
(``Journal.event``), the writer process writes its own (downtime, retention...) the same
way, and ``JournalReader`` reads them back typed (``Logged``), so the report matches on
classes, never on strings.

Read back, a key an older soakd did not write takes its field's default and one it no longer
knows is left; an event this soakd cannot read (a newer soakd's kind, a value of the wrong
type) is ``Unreadable``: kept, and skipped by whatever looks for a kind. Standard library
only: the writer process imports it.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self, TypeVar

from soakd.journal import jsondoc
from soakd.journal.jsondoc import Json
from soakd.model import NS_PER_S, PauseReason, SpendCap


class EventKind(enum.StrEnum):
    """The ``kind`` column of ``events``."""

    RUN_STARTED = "run_started"
    RUN_RESUMED = "run_resumed"
    RUN_STOPPED = "run_stopped"
    DOWNTIME = "downtime"
    WRITER_RESTARTED = "writer_restarted"
    PREFLIGHT = "preflight"
    PROMPT_CALIBRATION = "prompt_calibration"
    CONFIG_CHANGED = "config_changed"
    JOURNAL_LOSS = "journal_loss"
    PHASE = "phase"
    GATEWAY_MODES = "gateway_modes"
    NO_REUSE = "no_reuse"
    TARGET_PAUSED = "target_paused"
    TARGET_RESUMED = "target_resumed"
    AUTH_FAILED = "auth_failed"
    ROWS_STOPPED = "rows_stopped"
    RETENTION = "retention"
    JOURNAL_WRITE_ERRORS = "journal_write_errors"
    CHECK = "check"
    IDENTITY = "identity"


@dataclass(frozen=True, slots=True)
class Event:
    """A run event: its fields are its data. ``to_data`` leaves out the fields named in
    ``OMIT_NONE`` while they are None (keys the event never carried then)."""

    kind: ClassVar[EventKind]
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_data(self) -> dict[str, Json]:
        return jsondoc.doc(self, self.OMIT_NONE)

    @classmethod
    def from_data(cls, data: Mapping[str, object]) -> Self:
        """The event from its stored data; ValueError (or TypeError) when it is not one
        (soakd/journal/jsondoc.py reads each field by its type)."""
        return jsondoc.from_doc(cls, data)


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    kind = EventKind.RUN_STARTED
    version: str
    host: str = ""  # where the session ran (the report's header)


@dataclass(frozen=True, slots=True)
class RunResumed(Event):
    kind = EventKind.RUN_RESUMED
    version: str
    session: int
    host: str = ""


@dataclass(frozen=True, slots=True)
class RunStopped(Event):
    kind = EventKind.RUN_STOPPED
    completed: bool  # the plan ran to its end (a resume refuses a completed run)


@dataclass(frozen=True, slots=True)
class Downtime(Event):
    """A resumed run's time down: from the last heartbeat before the stop to the plan
    clock running again."""

    kind = EventKind.DOWNTIME
    seconds: float = 0.0
    from_wall: float = 0.0
    to_wall: float = 0.0


@dataclass(frozen=True, slots=True)
class WriterRestarted(Event):
    kind = EventKind.WRITER_RESTARTED
    session: int


@dataclass(frozen=True, slots=True)
class Preflight(Event):
    """A target asked once before the journal opened (soakd/targets/preflight.py)."""

    kind = EventKind.PREFLIGHT
    OMIT_NONE = frozenset({"models", "version"})
    target: str
    ok: bool
    line: str
    seconds: float
    unreached: bool = False
    warning: bool = False
    models: tuple[str, ...] | None = None  # its models list (with checks: docs/checks.md)
    version: str | None = None  # vLLM's /version


class CalibrationStage(enum.StrEnum):
    """When the prompts' sizing was journaled (soakd/workload/sizing.py)."""

    START = "start"  # the measurement at start
    CHECK = "check"  # a check of the sizing against the first answers' usage


_CALIBRATION = ("source", "reference", "costs", "scale", "overhead", "from_seq")
_MEASURED = ("planned", "served", "failed", "requests", "seconds")
_CHECKED = ("changed", "target", "answers", "estimated", "served", "off_pct")


@dataclass(frozen=True, slots=True)
class PromptCalibration(Event):
    """The prompts' sizing (soakd/workload/sizing.py). Each carries the calibration then
    in use, a ``Calibration``'s fields (``source`` "none" at start: nothing could count,
    and nothing else of it is written). At start, the measurement: the start prompts'
    mean planned tokens, each target's own count of them (``served``) or why it could not
    count, what it took. At a check, the first answers' usage read against it: whether
    it ``changed``, whose answers and how many, the tokens estimated and served (sums),
    how far off. Written as it always was (``to_data``), a key each stage never had
    left out."""

    kind = EventKind.PROMPT_CALIBRATION
    stage: CalibrationStage
    source: str = "none"
    reference: str = ""
    costs: tuple[int, ...] | None = None
    scale: float = 1.0
    overhead: float = 0.0
    from_seq: int = 0
    planned: float | None = None
    served: Mapping[str, float] | int | None = None  # start: per target; a check: a sum
    failed: Mapping[str, str] | None = None  # target -> why it could not count
    requests: int | None = None
    seconds: float | None = None
    changed: bool | None = None
    target: str | None = None
    answers: int | None = None
    estimated: float | None = None
    off_pct: float | None = None

    def to_data(self) -> dict[str, Json]:
        data = Event.to_data(self)
        start = self.stage is CalibrationStage.START
        calibration = ("source",) if start and self.source == "none" else _CALIBRATION
        keys = ("stage", *calibration, *(_MEASURED if start else _CHECKED))
        return {k: data[k] for k in keys}


@dataclass(frozen=True, slots=True)
class ConfigChanged(Event):
    """A resume went on with another config (``--force``): the paths that differ."""

    kind = EventKind.CONFIG_CHANGED
    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JournalLoss(Event):
    """What a damaged write-ahead log took, found when the run was resumed
    (``integrity.Loss``)."""

    kind = EventKind.JOURNAL_LOSS
    rows: int
    requests: int
    offset_ns: int
    held_offset_ns: int


@dataclass(frozen=True, slots=True)
class Phase(Event):
    kind = EventKind.PHASE
    name: str
    index: int


@dataclass(frozen=True, slots=True)
class GatewayModes(Event):
    """A phase switched a guard gateway's features (the ones it names)."""

    kind = EventKind.GATEWAY_MODES
    OMIT_NONE = frozenset({"vram_breaker", "error_breaker", "adaptive"})
    target: str
    vram_breaker: bool | None = None
    error_breaker: bool | None = None
    adaptive: bool | None = None

    def switched(self) -> dict[str, bool]:
        """The features this phase named, on or off, in their order."""
        return {k: v for k, v in self.to_data().items() if isinstance(v, bool)}


@dataclass(frozen=True, slots=True)
class NoReuse(Event):
    """A target's server closes its connections after answers of ``status`` without saying
    so (``closes``), or keeps them again (soakd/targets/pool.py)."""

    kind = EventKind.NO_REUSE
    target: str = ""
    status: int = 0
    closes: bool = False


@dataclass(frozen=True, slots=True)
class TargetPaused(Event):
    """A target's sends paused (soakd/workload/guard.py): a spend cap or a Retry-After
    (``resume_in_s``: None until the end of the run; a cap's limit and use), or a target
    failing every request (its cause and the last failure)."""

    kind = EventKind.TARGET_PAUSED
    OMIT_NONE = frozenset({"cap", "limit", "used", "cause", "detail", "failures"})
    target: str
    reason: PauseReason
    resume_in_s: float | None = None
    cap: SpendCap | None = None
    limit: int | None = None
    used: float | None = None
    cause: str | None = None
    detail: str | None = None
    failures: int | None = None
    failing_for_s: float | None = None

    def to_data(self) -> dict[str, Json]:
        data = Event.to_data(self)
        if self.reason is PauseReason.FAILING:
            del data["resume_in_s"]
        else:
            del data["failing_for_s"]
        return data


@dataclass(frozen=True, slots=True)
class TargetResumed(Event):
    kind = EventKind.TARGET_RESUMED
    target: str
    reason: PauseReason
    paused_s: float


@dataclass(frozen=True, slots=True)
class AuthFailed(Event):
    """The first of a streak of 401/403s; ``key`` says where the key comes from, never it."""

    kind = EventKind.AUTH_FAILED
    target: str
    status: int
    key: str | None = None


@dataclass(frozen=True, slots=True)
class RowsStopped(Event):
    """The journal neared ``journal.max_bytes``: no more request rows this session."""

    kind = EventKind.ROWS_STOPPED
    used_bytes: int = 0
    max_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Retention(Event):
    """Old rows deleted, per table (only the tables it deleted from)."""

    kind = EventKind.RETENTION
    OMIT_NONE = frozenset({"samples", "requests"})
    samples: int | None = None
    requests: int | None = None


@dataclass(frozen=True, slots=True)
class JournalWriteErrors(Event):
    """The journal could not write from ``from_offset_ns`` to ``to_offset_ns`` of plan
    time (``until_end``: to the end of the session)."""

    kind = EventKind.JOURNAL_WRITE_ERRORS
    error: str | None = None
    from_offset_ns: int = 0
    failures: int | None = None
    to_offset_ns: int = 0
    until_end: bool = False
    dropped_requests: int = 0


@dataclass(frozen=True, slots=True)
class CheckJudged(Event):
    """A check's answer judged (soakd/checks/mix.py): its kind, its result (pass, fail,
    unparseable), a reference check's similarity, and a failing answer's first characters."""

    kind = EventKind.CHECK
    OMIT_NONE = frozenset({"score"})
    target: str
    phase: str
    seq: int
    check: str
    result: str
    score: float | None = None
    answer: str = ""


@dataclass(frozen=True, slots=True)
class Identity(Event):
    """What a target said it is (soakd/checks/identity.py): the ``model`` and
    ``system_fingerprint`` of its answers; at its first answer, then at each change."""

    kind = EventKind.IDENTITY
    target: str
    model: str
    fingerprint: str
    previous_model: str = ""
    previous_fingerprint: str = ""


EVENTS: Mapping[EventKind, type[Event]] = {
    cls.kind: cls
    for cls in (
        RunStarted,
        RunResumed,
        RunStopped,
        Downtime,
        WriterRestarted,
        Preflight,
        PromptCalibration,
        ConfigChanged,
        JournalLoss,
        Phase,
        GatewayModes,
        NoReuse,
        TargetPaused,
        TargetResumed,
        AuthFailed,
        RowsStopped,
        Retention,
        JournalWriteErrors,
        CheckJudged,
        Identity,
    )
}
"""Every kind's class: one each (tests/unit/test_records.py walks them all)."""


EventRow = tuple[float, int | None, EventKind, dict[str, Json]]
"""(wall, plan offset, kind, data): one row of ``events`` as it travels to the writer."""


@dataclass(frozen=True, slots=True)
class Stamped:
    """An event on its way to the journal, stamped when it happened (wall clock, and plan
    time when the plan clock runs)."""

    wall: float
    offset_ns: int | None
    event: Event

    def row(self) -> EventRow:
        return (self.wall, self.offset_ns, self.event.kind, self.event.to_data())


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An event this soakd cannot read: a kind it does not know (a newer soakd's), or data
    that is not its kind's."""

    kind: str
    data: Mapping[str, Json]


@dataclass(frozen=True, slots=True)
class Logged:
    """One row of ``events``: when (wall clock, plan time), in which session, what."""

    session: int
    wall: float
    offset_ns: int | None
    event: Event | Unreadable

    @property
    def offset_s(self) -> float:
        """Plan seconds (0 when the plan clock had not run)."""
        return (self.offset_ns or 0) / NS_PER_S


def read_event(kind: str, data: object) -> Event | Unreadable:
    """A stored event, typed: ``Unreadable`` when it is no event this soakd knows."""
    try:
        cls = EVENTS[EventKind(kind)]
    except ValueError:  # not a kind this soakd knows
        return Unreadable(kind, _json_object(data) if isinstance(data, Mapping) else {})
    return read_as(cls, data)


E = TypeVar("E", bound=Event)


def read_as(cls: type[E], data: object) -> E | Unreadable:
    """A stored event of ``cls``'s kind, typed: ``Unreadable`` when its data is not one."""
    doc = _json_object(data) if isinstance(data, Mapping) else {}
    if isinstance(data, Mapping):
        try:
            return cls.from_data(doc)
        except (ValueError, TypeError):  # not its data
            pass
    return Unreadable(cls.kind, doc)


def of_kind(logged: Iterable[Logged], cls: type[E]) -> Iterator[E | Unreadable]:
    """The events of one class and those of its kind this soakd could not read, in the
    order they were journaled: for a reader that must not skip one unseen."""
    for row in logged:
        event = row.event
        if isinstance(event, cls) or (isinstance(event, Unreadable) and event.kind == cls.kind):
            yield event


def each(logged: Iterable[Logged], cls: type[E]) -> Iterator[tuple[Logged, E]]:
    """The events of one class, each with its row, in the order they were journaled."""
    for row in logged:
        if isinstance(row.event, cls):
            yield row, row.event


def _json_object(data: Mapping[str, object]) -> dict[str, Json]:
    return {str(k): typing.cast(Json, v) for k, v in data.items()}
