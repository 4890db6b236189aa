"""Journal store room: the writer's side of the journal: the database, what each batch adds
to it, and the rule that makes a failed commit safe to retry. It runs in the journal's writer
process (process.py; a test drives it in its own process), and imports neither the config
models, nor prometheus_client, nor structlog: that process stays small.

Durability (docs/journal.md has the long form):

- WAL makes every commit atomic: after any crash the journal opens at the last commit,
  never half-written.
- A killed process loses nothing committed (the WAL is in the OS page cache); what it loses
  is what it had not committed yet, at most one flush interval (plus what soakd had not
  sent it: one packet interval).
- A power cut loses what the disk never got. With ``synchronous=NORMAL`` SQLite syncs the WAL
  only at checkpoints (every ~1000 pages: minutes of a busy run), so soakd defaults to
  ``synchronous=FULL``, one fsync per commit, which at 2 commits/s costs nothing measurable.

``Store.open`` opens the database (opening.py) and returns a store that holds it open:
no method of it waits for, or checks for, a connection. Each packet soakd sends (``add``)
is folded at once (soakd/measure/fold.py): its rows are built and every outcome is counted
into the batch's ``Fold``. ``cycle`` commits the open batch (rows, samples, events,
aggregates, heartbeat) in one transaction and then hands its fold to the sink, which sends
it to soakd: Metrics never count what the journal does not hold. A commit that fails (disk
full, read-only, I/O error) is rolled back and retried with a back-off; the batch's fold
goes to the sink at once (``committed=False``: measuring never waits for the disk), and so
does every later packet's while commits keep failing, never again once committed; at most
``queue_size`` rows wait for the retry, the rows past that are dropped and counted, their
requests stay in the fold.

A disk that fills and never frees: the writer holds ``journal.reserve`` (budget.py's
``Reserve``) from the start, and lets it go when the final write fails, so the run's final
state (its totals, rollups and the stop) still goes in; if it fails again the last rows
give way (counted in the rollups, not written as rows). Either way a
``journal_write_errors`` event says how long writes failed and how many requests have no
row, and the report and the run's summary say so in their first lines. After every commit
the writer leaves a mark outside the database (mark.py), so commits a damaged write-ahead
log drops are counted, not lost in silence.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from soakd.childlog import ChildLog
from soakd.journal import schema
from soakd.journal.codec import END_NS, outcome_row
from soakd.journal.counts import WriterCounts
from soakd.journal.mark import Mark, MarkFile
from soakd.journal.messages import RunInfo, WriterConfig
from soakd.journal.opening import PACKET_KEY, Opened, open_db
from soakd.journal.progress import ClockState, Resumed
from soakd.journal.records import EventRow, JournalWriteErrors, Retention
from soakd.journal.retention import apply_retention
from soakd.measure.fold import Fold
from soakd.model import Outcome, Sample

log = ChildLog()

MAX_BATCH = 5000  # rows per transaction: a packet that brings more commits at once
RETENTION_EVERY_S = 60.0
IDLE_HEARTBEAT_S = 1.0
RETRY_MAX_S = 30.0
FINAL_ATTEMPTS = 4


class StoreSink(Protocol):
    """Where the store's folds go (the writer process sends them to soakd)."""

    def fold(self, f: Fold, through: int, committed: bool) -> None:
        """A batch's fold, for Metrics and RunStats: committed, or (the disk failing) not
        yet. ``through``: the last packet in it."""

    def committed(self, through: int) -> None:
        """Packets up to ``through`` are committed (their folds went earlier)."""


@dataclass(slots=True)
class _Failing:
    """Since when the writes fail, why, and how many failed so far."""

    error: str
    from_offset_ns: int
    failures: int = 0


@dataclass(slots=True)
class _Batch:
    """Packets folded and waiting for their commit (kept as they are while commits fail)."""

    rows: list[tuple[Any, ...]]
    samples: list[tuple[float, int, float]]
    new_series: list[tuple[int, str, str]]
    events: list[EventRow]
    fold: Fold  # what goes to the sink: the packets' outcomes
    known: Fold  # written, never sent again: re-sent packets soakd counted, tallies
    keep_rows: bool
    through: int = 0  # the last packet in it
    forwarded: bool = False  # its fold went to the sink already (the disk failing)

    @property
    def empty(self) -> bool:
        return not (self.rows or self.fold or self.known or self.samples or self.events)

    def add(self, later: _Batch) -> None:
        """Append a later batch (commits are failing)."""
        self.rows += later.rows
        self.samples += later.samples
        self.new_series += later.new_series
        self.events += later.events
        self.fold.merge(later.fold)
        self.known.merge(later.known)
        self.keep_rows = self.keep_rows and later.keep_rows
        self.through = max(self.through, later.through)


class Store:
    """The journal's writer: ``Store.open``, then ``add`` packets and ``cycle`` every flush
    interval, then ``final``. Single-threaded: one caller at a time."""

    def __init__(
        self,
        path: Path,
        cfg: WriterConfig,
        sink: StoreSink,
        opened: Opened,
        *,
        counts: WriterCounts | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.cfg = cfg
        self.sink = sink
        self.counts = counts
        self._wall = wall
        self._conn = opened.conn
        self.restored = opened.restored  # what the journal held when it was opened
        self.packet_seq = opened.packet_seq  # this session's last packet before this writer
        self._next_id = opened.next_id
        self._series = opened.series
        self._next_series = opened.next_series
        self._agg = opened.agg
        self._budget = opened.budget
        self._progress = opened.progress
        self._reserve = opened.reserve
        self._open: _Batch | None = None
        self._pending: _Batch | None = None
        self._last_commit = 0.0
        self._last_cycle = 0.0
        self._last_retention = 0.0
        self._errors_in_row = 0
        self._retry_at = 0.0
        self._drop_logged = False
        self._failing: _Failing | None = None  # since when writes fail, and why
        self._tallied = 0  # requests soakd's full queue tallied (no row, no window)
        self._mark = MarkFile(path.parent)
        self.unwritten = 0  # records the final write could not keep at all

    @classmethod
    def open(
        cls,
        path: Path,
        run: RunInfo,
        cfg: WriterConfig,
        sink: StoreSink,
        *,
        resume: Resumed | None = None,
        session: int = 0,
        counts: WriterCounts | None = None,
        wall: Callable[[], float] = time.time,
    ) -> Store:
        """The journal at ``path``, opened (or created) for writing (opening.py):
        ``session`` 0 starts a new session, else a restarted writer continues that one.
        JournalError when it cannot be used."""
        opened = open_db(path, run, cfg, resume=resume, session=session, counts=counts, wall=wall)
        store = cls(path, cfg, sink, opened, counts=counts, wall=wall)
        store._update_size()
        return store

    @property
    def session(self) -> int:
        return self._progress.session

    @property
    def clock(self) -> ClockState | None:
        return self._progress.clock

    @clock.setter
    def clock(self, value: ClockState) -> None:
        self._progress.clock = value

    @property
    def waiting(self) -> int:
        """Rows folded and not committed yet."""
        return sum(len(b.rows) for b in (self._open, self._pending) if b is not None)

    # --- what soakd sends -------------------------------------------------------------------

    def add(
        self,
        seq: int,
        outcomes: Iterable[Outcome] = (),
        samples: Iterable[Sample] = (),
        events: Iterable[EventRow] = (),
        tally: Fold | None = None,
        *,
        counted: bool = False,
    ) -> None:
        """One packet: its outcomes folded (and their rows built, while there is room), its
        samples numbered by series, its events. ``tally``: requests soakd could not queue,
        counted by soakd already: into the totals only. ``counted``: a packet soakd sends
        again to a restarted writer whose fold it applied: written, never sent again."""
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(
                [], [], [], [], Fold(), Fold(), self._budget.keep_rows(self._conn)
            )
        batch.through = max(batch.through, seq)
        target = batch.known if counted else batch.fold
        room = self.cfg.queue_size - self.waiting
        progress = self._progress
        clock = progress.clock
        origin = clock.origin_ns if clock is not None else 0
        session, window_ns = progress.session, self._agg.window_ns
        itl = self.cfg.itl if self.cfg.itl_gaps else "none"
        keep, rows, next_id = batch.keep_rows, batch.rows, self._next_id
        unkept = 0
        for o in outcomes:
            row, ordered = outcome_row(o, next_id, session, origin, itl=itl)
            if keep and room > 0:
                rows.append(row)
                target.add(o, next_id, row[END_NS], window_ns, ordered)
                next_id += 1
                room -= 1
            else:
                target.add(o, 0, row[END_NS], window_ns, ordered)
                unkept += keep
        self._next_id = next_id
        if unkept:
            self._drop_rows(unkept)
        for s in samples:
            key = (s.name, s.labels)
            sid = self._series.get(key)
            if sid is None:
                sid = self._series[key] = self._next_series
                self._next_series += 1
                batch.new_series.append((sid, s.name, json.dumps(s.labels)))
            batch.samples.append((s.wall, sid, s.value))
        batch.events += events
        if tally is not None:
            batch.known.merge(tally)
            self._tallied += tally.requests

    def _drop_rows(self, n: int) -> None:
        """Rows there is no room for (commits failing): their requests are in the fold."""
        if self.counts is not None:
            self.counts.dropped.labels("request").inc(n)
        if not self._drop_logged:
            self._drop_logged = True
            log.error(
                "journal_queue_full",
                kind="request",
                queue=n,
                note="rows are dropped from the journal while its writes fail (their "
                "requests stay in the totals, histograms and rollups)",
            )

    # --- commits -----------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        """Whether ``cycle`` has work now: a flush interval passed, or a full batch."""
        return now - self._last_cycle >= self.cfg.flush_interval or (
            self._pending is None and self.waiting >= MAX_BATCH
        )

    def cycle(self, now: float | None = None, *, force: bool = False) -> None:
        """Commit what was added (or, commits failing, hand it over and retry when due);
        with nothing new, a heartbeat once a second (``force``: now)."""
        now = time.monotonic() if now is None else now
        self._last_cycle = now
        batch, self._open = self._open, None
        pending = self._pending
        if pending is not None:  # commits are failing: hand what came over, retry when due
            if batch is not None:
                self._forward(batch)
                pending.add(batch)
            if now < self._retry_at:
                return
            batch = pending
        elif batch is None or batch.empty:
            if now - self._last_commit < IDLE_HEARTBEAT_S and not force:
                if batch is not None:
                    self._open = batch  # nothing new: a heartbeat a second is enough
                return
            if batch is None:
                batch = _Batch([], [], [], [], Fold(), Fold(), self._budget.keep_rows(self._conn))
        try:
            self._commit(batch, final=False)
        except sqlite3.Error as exc:
            self._failed(batch, exc)
            return
        self._last_commit = now
        if self._errors_in_row:
            log.warning("journal_writes_resumed", after_errors=self._errors_in_row)
            self._failed_event(until_end=False)
        self._errors_in_row = 0
        self._pending = None
        if now - self._last_retention >= RETENTION_EVERY_S:
            self._last_retention = now
            self._retention()

    def final(self) -> None:
        """Closing: write everything (a few retries on errors), then every window."""
        batch, self._open = self._open, None
        pending = self._pending
        if pending is not None:
            if batch is not None:
                self._forward(batch)
                pending.add(batch)
            batch = pending
        if batch is None:
            batch = _Batch([], [], [], [], Fold(), Fold(), self._budget.keep_rows(self._conn))
        lean = False
        for attempt in range(1, FINAL_ATTEMPTS + 1):
            try:
                self._commit(batch, final=True)
                break
            except sqlite3.Error as exc:
                self._failed(batch, exc)
                if attempt == FINAL_ATTEMPTS:
                    self.unwritten = len(batch.rows) + len(batch.samples) + len(batch.events)
                    log.error(  # noqa: TRY400  # the error is in the line: no traceback
                        "journal_close_incomplete",
                        unwritten=self.unwritten,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    return
                if attempt == 1:
                    self._failed_event(until_end=True, batch=batch)  # goes in with the rest
                if attempt == 1 and self._reserve.release():
                    log.warning("journal_reserve_released", reason="the final write failed")
                elif not lean:
                    lean = True  # the rows give way to the run's final state (in its windows)
                    log.warning("journal_final_without_rows", reason="the final write failed")
                    if batch.rows and self.counts is not None:
                        self.counts.dropped.labels("request").inc(len(batch.rows))
                    batch.rows = []
                # a timed wait on an Event, not time.sleep (EINVAL under libfaketime)
                threading.Event().wait(0.2 if attempt == 1 else 1.0)
        self._pending = None
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._update_size()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        self._reserve.release()
        self._mark.close()

    def _failed_event(self, *, until_end: bool, batch: _Batch | None = None) -> None:
        """A ``journal_write_errors`` event (in ``batch``, or the next one): how long writes
        failed (``until_end``: to the end of the session), why, and how many requests the
        full queue dropped meanwhile (in the totals, not in the rollups or the rows)."""
        failing = self._failing
        if failing is None:
            return
        self._failing = None
        progress = self._progress
        failed = JournalWriteErrors(
            failing.error,
            failing.from_offset_ns,
            failing.failures,
            progress.offset_now() or progress.last_offset,
            until_end,
            self._tallied,
        )
        event = (self._wall(), progress.offset_now(), failed.kind, failed.to_data())
        if batch is None:
            batch = self._open
            if batch is None:
                keep = self._budget.keep_rows(self._conn)
                batch = self._open = _Batch([], [], [], [], Fold(), Fold(), keep)
        batch.events.append(event)

    def _forward(self, batch: _Batch) -> None:
        if not batch.forwarded:
            batch.forwarded = True
            self.sink.fold(batch.fold, batch.through, committed=False)

    def _failed(self, batch: _Batch, exc: sqlite3.Error) -> None:
        """Disk full, read-only, I/O error: keep the batch, retry later, keep measuring."""
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        self._errors_in_row += 1
        if self._failing is None:
            progress = self._progress
            self._failing = _Failing(
                f"{type(exc).__name__}: {exc}", progress.offset_now() or progress.last_offset
            )
        self._failing.failures = self._errors_in_row
        delay = min(RETRY_MAX_S, 0.5 * 2 ** min(self._errors_in_row, 6))
        self._retry_at = time.monotonic() + delay
        self._pending = batch
        if self.counts is not None:
            self.counts.write_errors.inc()
        if self._errors_in_row == 1 or self._errors_in_row % 20 == 0:
            log.error(
                "journal_write_failed",
                error=f"{type(exc).__name__}: {exc}",
                records=len(batch.rows) + len(batch.samples) + len(batch.events),
                retry_in_s=delay,
                failures=self._errors_in_row,
            )
        self._forward(batch)  # metrics must not wait for the disk

    def _commit(self, batch: _Batch, *, final: bool) -> None:
        """One transaction: rows, samples, events, aggregates, heartbeat. The in-memory
        state moves on only after COMMIT, so a failed batch can be retried as it was."""
        conn = self._conn
        t0 = time.perf_counter()
        agg, progress, budget = self._agg, self._progress, self._budget
        rows, samples, events, keep_rows = batch.rows, batch.samples, batch.events, batch.keep_rows
        next_id = self._next_id
        now_window = (progress.offset_now() or progress.last_offset) // agg.window_ns
        conn.execute("BEGIN")
        stopped = budget.stopped(conn) if budget.rows_kept and not keep_rows else None
        if stopped is not None:
            progress.insert_event(conn, self._wall(), progress.last_offset, stopped)
        if batch.new_series:
            conn.executemany("INSERT INTO series VALUES (?,?,?)", batch.new_series)
        if rows:
            conn.executemany(schema.INSERT_REQUEST, rows)
        if samples:
            conn.executemany("INSERT INTO samples VALUES (?,?,?)", samples)
        for event in events:
            progress.insert_row(conn, event)
        # without rows, every window is stored at each commit (nothing to rebuild them from)
        staged = agg.write(
            conn, (batch.fold, batch.known), next_id - 1, now_window, final or not keep_rows
        )
        beat = progress.heartbeat(conn, staged.rollup_from_id(next_id), final)
        if batch.through:
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                (PACKET_KEY, json.dumps({"session": progress.session, "seq": batch.through})),
            )
        conn.execute("COMMIT")
        # committed: the in-memory state moves on
        progress.committed(beat)
        agg.committed(staged, now_window)
        budget.committed(keep_rows, batch.fold.requests, stopped)
        requests = sum(t[0] for t in agg.totals.values())  # tallies included
        self._mark.write(
            Mark(progress.session, next_id - 1, requests, beat.offset_ns, dict(progress.seqs))
        )
        m = self.counts
        if m is not None:
            if beat.downtime_s:
                m.downtime.inc(beat.downtime_s)
            m.commit.observe(time.perf_counter() - t0)
            m.last_commit.set(self._wall())
            if rows:
                m.records.labels("request").inc(len(rows))
            if samples:
                m.records.labels("sample").inc(len(samples))
            if events:
                m.records.labels("event").inc(len(events))
            self._update_size()
        if batch.forwarded:
            self.sink.committed(batch.through)
        else:
            batch.forwarded = True
            self.sink.fold(batch.fold, batch.through, committed=True)

    def _update_size(self) -> None:
        if self.counts is None:
            return
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{self.path}{suffix}").st_size
        self.counts.size.set(size)
        self._budget.update_free()

    def _retention(self) -> None:
        """Delete old samples/requests by age, then the oldest rows while over max_bytes.
        Totals, histograms and rollups are never deleted: the report stays whole-run."""
        conn = self._conn
        now = self._wall()
        progress = self._progress
        try:
            deleted = apply_retention(conn, self.cfg, now, self._budget.max_bytes)
            if deleted:
                conn.execute("BEGIN")
                progress.insert_event(conn, now, progress.last_offset, Retention(**deleted))
                conn.execute("COMMIT")
                log.info("journal_retention", deleted=deleted)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            log.warning("journal_retention_failed", error=str(exc))
