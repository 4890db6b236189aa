"""Journal progress room: this session's row in ``progress``, the plan clock's heartbeat,
the downtime of a resumed run, and the run's events.

Writer state only (the journal's writer process). The plan clock reaches it as a
``ClockState``, a snapshot of the runner the parent sends with each batch. ``heartbeat``
writes inside the batch's transaction and returns a ``Beat``; ``committed`` applies it once
the transaction commits, so a failed batch is retried from the same state.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from soakd import __version__
from soakd.journal.records import (
    Downtime,
    Event,
    EventRow,
    RunResumed,
    RunStarted,
    WriterRestarted,
)
from soakd.model import Phase

MissedKey = tuple[str, str, str]
"""(target, phase, reason): one row of ``missed``."""


class PlanClock(Protocol):
    """What the journal reads from the runner, on the loop the runner lives on."""

    @property
    def origin_ns(self) -> int: ...
    @property
    def phase(self) -> Phase | None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def stopped_ns(self) -> int: ...
    @property
    def next_seq(self) -> dict[str, int]: ...
    @property
    def missed(self) -> dict[MissedKey, int]: ...


@dataclass(frozen=True, slots=True)
class ClockState:
    """The plan clock as the writer reads it: a snapshot of the runner (``PlanClock``), taken
    on soakd's loop (``Journal.publish``) and sent with each batch. The writer reads the
    monotonic clock itself (CLOCK_MONOTONIC is one clock for every process of the host).
    It travels in each ``messages.Packet``, by its fields."""

    origin_ns: int = 0
    phase_index: int | None = None
    finished: bool = False
    stopping: bool = False
    stopped_ns: int = 0  # the monotonic instant sending stopped (0: it has not)
    next_seq: dict[str, int] = field(default_factory=dict)
    missed: dict[MissedKey, int] = field(default_factory=dict)

    @classmethod
    def of(cls, clock: PlanClock) -> ClockState:
        """A snapshot, taken on the loop that owns ``clock``: its dicts are copies."""
        phase = clock.phase
        return cls(
            clock.origin_ns,
            phase.index if phase is not None else None,
            clock.finished,
            clock.stopping,
            clock.stopped_ns,
            dict(clock.next_seq),
            dict(clock.missed),
        )


class Resumed(Protocol):
    """What a session continuing a run needs of the last one (``ResumeState`` has it)."""

    @property
    def offset_ns(self) -> int: ...
    @property
    def next_seq(self) -> dict[str, int]: ...
    @property
    def last_wall(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat, written and waiting for its commit."""

    offset_ns: int
    missed: dict[MissedKey, int]
    downtime_s: float | None  # set by the first heartbeat after the plan clock ran


class Progress:
    """The session's progress row and events (writer thread)."""

    def __init__(self, resume: Resumed | None, wall: Callable[[], float]) -> None:
        self.resume = resume
        self.wall = wall
        self.session = 0
        self.clock: ClockState | None = None
        self.last_offset = resume.offset_ns if resume else 0
        self.started_offset = self.last_offset
        self.seqs: dict[str, int] = dict(resume.next_seq) if resume else {}
        self.missed: dict[MissedKey, int] = {}  # as committed
        self._frozen_offset: int | None = None
        self._clock_seen = False

    def offset_now(self) -> int | None:
        """The plan clock now (None before it runs); any thread."""
        clock = self.clock
        if clock is None or not clock.origin_ns:
            return None
        return time.perf_counter_ns() - clock.origin_ns

    def load(self, conn: sqlite3.Connection) -> None:
        """This session's number, and the sends not made as the journal holds them."""
        self.session = 1 + (conn.execute("SELECT MAX(session) FROM progress").fetchone()[0] or 0)
        self.missed = {(t, p, r): n for t, p, r, n in conn.execute("SELECT * FROM missed")}

    def rejoin(self, conn: sqlite3.Connection, session: int) -> None:
        """This session's writer started again (the one before died): continue its row, its
        plan clock and seq numbers; its downtime was written already."""
        row = conn.execute(
            "SELECT offset_ns, seqs FROM progress WHERE session = ?", (session,)
        ).fetchone()
        if row is None:
            raise sqlite3.DatabaseError(f"no session {session} to continue")
        self.session = session
        self.last_offset = self.started_offset = int(row[0])
        self.seqs.update(json.loads(row[1]))
        self._clock_seen = True
        self.insert_event(conn, self.wall(), self.last_offset, WriterRestarted(session))

    def begin(self, conn: sqlite3.Connection, now: float, next_id: int) -> None:
        """Inside the opening transaction: the session's row and its first event."""
        conn.execute(
            "INSERT INTO progress VALUES (?,?,?,?,?,?,?,?,?,?,0)",
            (
                self.session,
                __version__,
                os.getpid(),
                now,
                self.started_offset,
                now,
                self.started_offset,
                None,
                json.dumps(self.seqs),
                next_id,
            ),
        )
        host = socket.gethostname()  # where this session ran (the report's header)
        if self.resume is None:
            self.insert_event(conn, now, 0, RunStarted(__version__, host))
        else:
            # the downtime is written when the plan clock runs again (_clock_started)
            started = RunResumed(__version__, self.session, host)
            self.insert_event(conn, now, self.started_offset, started)

    def heartbeat(self, conn: sqlite3.Connection, from_id: int, final: bool) -> Beat:
        """Inside a batch's transaction: the downtime (once), the sends not made that moved,
        and the session's row (plan clock, phase, next seq numbers, rollup mark, stop)."""
        downtime = self._clock_started(conn, final)
        offset, phase_index = self._plan_clock()
        missed = self._missed_changes()
        if missed:
            conn.executemany(
                "INSERT OR REPLACE INTO missed VALUES (?,?,?,?)",
                [(*k, n) for k, n in missed.items()],
            )
        conn.execute(
            "UPDATE progress SET wall = ?, offset_ns = ?, phase_index = ?, seqs = ?, "
            "rollup_from_id = ?, stopped = ? WHERE session = ?",
            (
                self.wall(),
                offset,
                phase_index,
                json.dumps(self.seqs),
                from_id,
                int(final),
                self.session,
            ),
        )
        return Beat(offset, missed, downtime)

    def committed(self, beat: Beat) -> None:
        self.missed.update(beat.missed)
        self.last_offset = beat.offset_ns

    def insert_event(
        self, conn: sqlite3.Connection, wall: float, offset: int | None, event: Event
    ) -> None:
        self.insert_row(conn, (wall, offset, event.kind, event.to_data()))

    def insert_row(self, conn: sqlite3.Connection, row: EventRow) -> None:
        """An event as soakd sent it (or as ``insert_event`` made it)."""
        wall, offset, kind, data = row
        conn.execute(
            "INSERT INTO events (session, wall, offset_ns, kind, data) VALUES (?,?,?,?,?)",
            (self.session, wall, offset, kind, json.dumps(data, default=str)),
        )

    def _clock_started(self, conn: sqlite3.Connection, final: bool) -> float | None:
        """The first time the plan clock runs in this session: stamp the session's start on
        it (wall <-> plan time for the report) and, when resumed, write the downtime: from
        the last heartbeat before the crash or stop to now (soakd's own start-up included).
        A session stopped before its clock ever ran was down all along."""
        if self._clock_seen:
            return None
        clock = self.clock
        running = clock is not None and bool(clock.origin_ns)
        if not running and not final:
            return None
        self._clock_seen = True
        now = self.wall()
        start_wall = now
        if clock is not None and clock.origin_ns:
            ran_ns = time.perf_counter_ns() - clock.origin_ns - self.started_offset
            start_wall = now - max(0, ran_ns) / 1e9
            conn.execute(
                "UPDATE progress SET started_wall = ? WHERE session = ?",
                (start_wall, self.session),
            )
        if self.resume is None:
            return None
        last = self.resume.last_wall
        seconds = max(0.0, start_wall - last)
        self.insert_event(
            conn, start_wall, self.started_offset, Downtime(seconds, last, start_wall)
        )
        return seconds

    def _plan_clock(self) -> tuple[int, int | None]:
        """The plan offset to store: it stops when sending stops, not when the drain ends."""
        clock = self.clock
        if clock is None or not clock.origin_ns:
            return self.last_offset, None
        current = time.perf_counter_ns() - clock.origin_ns
        if self._frozen_offset is None:
            if clock.finished:
                self._frozen_offset = max(current, self.last_offset)
            elif clock.stopping:
                # where sending stopped: every instant before it was sent or counted as not
                # made, so the resume offers none of them again (the last heartbeat before
                # the stop, up to a second earlier, would offer those instants twice)
                stopped = clock.stopped_ns - clock.origin_ns if clock.stopped_ns else 0
                self._frozen_offset = max(self.last_offset, min(stopped, current))
        offset = self._frozen_offset if self._frozen_offset is not None else current
        self.seqs.update(clock.next_seq)
        return offset, clock.phase_index

    def _missed_changes(self) -> dict[MissedKey, int]:
        """The ledger's counts (whole run: it starts from the restored ones) that moved."""
        clock = self.clock
        if clock is None:
            return {}
        counts = clock.missed
        return {k: n for k, n in counts.items() if self.missed.get(k) != n}
