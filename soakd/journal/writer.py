"""Journal writer room: the ``Journal`` sink, its writer thread, and the queue between them.

One writer thread owns the database. The event loop only appends to a bounded deque
(``record``/``sample``/``event``: a length check and an append, never IO, never a
lock wait); the thread drains it every ``flush_interval`` (0.5 s) into one
transaction. Durability (docs/journal.md has the long form):

- WAL makes every commit atomic: after any crash the journal opens at the last
  commit, never half-written.
- A killed process loses nothing committed (the WAL is in the OS page cache); what it
  loses is the batch in memory, at most one flush interval.
- A power cut loses what the disk never got. With ``synchronous=NORMAL`` SQLite syncs
  the WAL only at checkpoints (every ~1000 pages: minutes of a busy run), so that is
  not "the last second"; soakd therefore defaults to ``synchronous=FULL``, one fsync
  per commit, which at 2 commits/s costs nothing measurable (docs/journal.md).

Prometheus counters are fed *after* the commit (the writer hands committed outcomes
back to the loop), so the counters Prometheus scrapes never exceed what the journal
holds, and a resumed run that restores them from the journal cannot step backwards
(which Prometheus would read as a reset and turn into a spike in every rate).

The queue between the loop and the thread, both ways, is ``HandOff`` (handoff.py); the
session's heartbeat and events are ``Progress`` (progress.py); the totals, histogram
buckets and rollup windows are ``Aggregates`` (rollups.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from soakd import __version__
from soakd.config import JournalConfig
from soakd.journal import schema
from soakd.journal.budget import Budget
from soakd.journal.codec import outcome_row
from soakd.journal.handoff import HandOff
from soakd.journal.progress import PlanClock, Progress
from soakd.journal.resume import Restored, ResumeState, take_lock
from soakd.journal.retention import apply_retention
from soakd.journal.rollups import (
    Aggregates,
    Deltas,
    NoteKey,
    add_notes,
    store_window,
    unfolded_rollups,
)
from soakd.journal.schema import JOURNAL_FILE, PAGE_SIZE, JournalError
from soakd.metrics import JournalMetrics
from soakd.model import Outcome, Sample, status_class
from soakd.types import OutcomeSink

log = structlog.get_logger()

MAX_BATCH = 5000  # records per transaction; more wait for the next one
RETENTION_EVERY_S = 60.0
IDLE_HEARTBEAT_S = 1.0
RETRY_MAX_S = 30.0
YIELD_EVERY = 32
"""Records the writer encodes between two ``os.sched_yield()`` calls (0: never yield).

The writer thread runs Python (encoding rows, folding digests) while holding the GIL. The
event loop, woken by a token, must then wait for the GIL, and on a busy or pinned core for
the CPU too: every timestamp it takes meanwhile is late (TTFT p99 +11 ms at 64 streams with
the client on one core, docs/benchmarks.md "Many cores"). ``sched_yield`` releases the GIL
and the CPU every few dozen records, so the loop waits for at most one slice."""


@dataclass(frozen=True)
class RunInfo:
    """What the journal stores about the run when it creates it."""

    run_id: str
    config: dict[str, Any]
    plan: dict[str, Any]
    plan_start: datetime
    options: dict[str, float | None]
    window_ns: int


@dataclass(slots=True)
class _Batch:
    """One transaction's worth of records (kept as it was when its commit fails)."""

    items: list[Any]
    forwarded: bool = False  # its outcomes went to Metrics already (a failed commit)


class Journal:
    """The run's journal: an OutcomeSink (``record``), a sample sink (``sample``), events.

    ``forward``: where committed outcomes go next (Metrics), on the loop that opened the
    journal. A full queue or a failing disk never stops the measurement: those outcomes
    are forwarded at once and counted (``soakd_journal_dropped_records_total``,
    ``soakd_journal_write_errors_total``)."""

    def __init__(
        self,
        path: Path,
        run: RunInfo,
        cfg: JournalConfig | None = None,
        *,
        metrics: JournalMetrics | None = None,
        forward: OutcomeSink | None = None,
        resume: ResumeState | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.run = run
        self.cfg = cfg or JournalConfig()
        self.metrics = metrics
        self._forward = forward
        self._resume = resume
        self._wall = wall
        limit = self.cfg.queue_size
        self._handoff = HandOff(limit, min(MAX_BATCH, limit // 2), forward)
        self._q = self._handoff.records  # the hot path's one attribute lookup
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._dropped: dict[tuple[str, str, str, str], tuple[int, int, int, int]] = {}
        self._dropped_notes: dict[NoteKey, int] = {}
        self._drop_logged = False
        self.restored: Restored | None = None
        self.downtime_s = 0.0
        # writer-thread state
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._next_id = 1
        self._next_series = 1
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._agg = Aggregates(run.window_ns)
        self._budget = Budget(self.cfg, metrics)
        self._progress = Progress(resume, wall)
        self._pending: _Batch | None = None
        self._last_commit = 0.0
        self._last_retention = 0.0
        self._errors_in_row = 0
        self._retry_at = 0.0

    @property
    def session(self) -> int:
        """This session's number (1 for a new run; 0 before ``start``)."""
        return self._progress.session

    # --- lifecycle (loop side) ---------------------------------------------------------------

    def start(self) -> None:
        """Open (or create) the database in the writer thread; raises JournalError."""
        if self._handoff.loop is None:
            with contextlib.suppress(RuntimeError):
                self._handoff.loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._main, name="soakd-journal", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            self._thread.join()
            err = self._open_error
            if isinstance(err, JournalError):
                raise err
            raise JournalError(f"{self.path}: cannot open the journal: {err}") from err
        m, restored = self.metrics, self.restored
        if m is not None:
            m.queue_depth.set_function(self._q.__len__)
            if restored is not None:  # continue the run's own counters too
                m.downtime.inc(restored.downtime_s)
                m.resumes.inc(restored.resumes + (self._resume is not None))

    def attach(self, clock: PlanClock) -> None:
        """Read the plan clock from the runner: offsets of rows, heartbeats, seq numbers."""
        self._progress.clock = clock

    def close(self, completed: bool = False) -> None:
        """Write everything still queued, the final heartbeat and the stop event; blocks."""
        if self._closed:
            return
        self.event("run_stopped", completed=completed)
        self._closed = True
        self._stop.set()
        self._handoff.wake.set()
        if self._thread is not None:
            self._thread.join()
        self._handoff.pump()

    async def aclose(self, completed: bool = False) -> None:
        if self._closed:
            return
        await asyncio.to_thread(self.close, completed)
        self._handoff.pump()

    # --- the hot path (loop side) --------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        """OutcomeSink: enqueue, or (queue full, journal closed) count and forward now."""
        q = self._q
        n = len(q)
        h = self._handoff
        if n < h.limit and not self._closed:
            if self._errors_in_row and self._forward is not None:
                h.forward_early(outcome)  # the disk is failing
            q.append(outcome)
            if n == h.wake_at:
                h.wake.set()
            return
        if self._closed:  # after the run: nothing left to journal it
            if self._forward is not None:
                self._forward.record(outcome)
            return
        self._drop("request")
        o = outcome
        key = (o.target, o.phase, o.outcome, status_class(o.status))
        d = self._dropped.get(key, (0, 0, 0, 0))
        self._dropped[key] = (
            d[0] + 1,
            d[1] + o.output_tokens,
            d[2] + (o.prompt_tokens or 0),
            d[3] + o.oom,
        )
        if o.usage_rejected or o.usage_mismatch or o.retry_after_unreadable:
            notes = dict(self._dropped_notes)  # replaced, never mutated (as _dropped)
            add_notes(notes, o)
            self._dropped_notes = notes
        if self._forward is not None:
            self._forward.record(outcome)

    def sample(self, sample: Sample) -> None:
        """A probe reading (the probes' ``emit``)."""
        if len(self._q) < self._handoff.limit and not self._closed:
            self._q.append(sample)
        else:
            self._drop("sample")

    def event(self, kind: str, **data: Any) -> None:
        """A run event (phase change, stop...). Events are rare: never dropped."""
        if self._closed:
            return
        self._q.append(("event", self._wall(), self._progress.offset_now(), kind, data))

    def _drop(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.dropped.labels(kind).inc()
        if not self._drop_logged:
            self._drop_logged = True
            log.error(
                "journal_queue_full",
                kind=kind,
                queue=len(self._q),
                note="records are dropped from the journal (metrics go on); "
                "the disk may be too slow or stalled",
            )

    # --- the writer thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._open()
        except BaseException as exc:  # handed to start(), which raises it
            self._open_error = exc
            self._ready.set()
            self._unlock()
            return
        self._ready.set()
        wake = self._handoff.wake
        try:
            interval = self.cfg.flush_interval
            while not self._stop.is_set():
                if len(self._q) < MAX_BATCH or self._pending is not None:
                    wake.wait(interval)  # a backlog of full batches: no pause
                wake.clear()
                self._cycle()
            self._final()
        except Exception:
            log.exception("journal_writer_failed")
        finally:
            with contextlib.suppress(sqlite3.Error):
                if self._conn is not None:
                    self._conn.close()
            self._unlock()

    def _lock(self) -> None:
        fd = take_lock(self.path.parent)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open(self) -> None:
        self._lock()
        new = not self.path.exists()
        if new and self._resume is not None:
            raise JournalError(f"{self.path}: the journal vanished before the resume")
        conn = self._conn = schema.connect(self.path, readonly=False)
        if new:  # rows of 2 KB (512 ITL gaps) half-fill 4 KiB pages; 16 KiB ones hold 7
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.cfg.synchronous.upper()}")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # WAL back to 64 MiB after use
        now = self._wall()
        if new:
            r = self.run
            schema.create(
                conn,
                {
                    "schema_version": schema.SCHEMA_VERSION,
                    "soakd_version": __version__,
                    "run_id": r.run_id,
                    "created_wall": now,
                    "created": datetime.fromtimestamp(now, UTC).isoformat(),
                    "plan_start": r.plan_start.isoformat(),
                    "options": r.options,
                    "config": r.config,
                    "plan": r.plan,
                    "window_ns": r.window_ns,
                },
            )
        else:
            schema.migrate(conn)
        meta = schema.check_schema(conn, self.path, writing=True)
        if meta["run_id"] != self.run.run_id:
            raise JournalError(f"{self.path}: holds run {meta['run_id']}, not {self.run.run_id}")
        self._agg.window_ns = int(meta["window_ns"])
        self._budget.open(conn, self.path)
        self._load_state(conn)
        conn.execute("BEGIN")
        self._repair(conn)
        self._progress.begin(conn, now, self._next_id)
        conn.execute("COMMIT")
        self._update_size()

    def _load_state(self, conn: sqlite3.Connection) -> None:
        progress = self._progress
        progress.load(conn)
        self._next_id = 1 + (conn.execute("SELECT MAX(id) FROM requests").fetchone()[0] or 0)
        for sid, name, labels in conn.execute("SELECT id, name, labels FROM series"):
            skey = (name, tuple((str(k), str(v)) for k, v in json.loads(labels)))
            self._series[skey] = sid
            self._next_series = max(self._next_series, sid + 1)
        totals = self._agg.load(conn)
        downtime = sum(
            json.loads(d)["seconds"]
            for (d,) in conn.execute("SELECT data FROM events WHERE kind = 'downtime'")
        )
        resumes = conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'run_resumed'").fetchone()
        self.restored = Restored(
            totals,
            dict(self._agg.hists),
            downtime,
            resumes[0],
            dict(progress.missed),
            [(t, n, c) for (t, n), c in self._agg.notes.items()],
        )

    def _repair(self, conn: sqlite3.Connection) -> None:
        """Fold rows a killed session committed but never rolled up into the rollups."""
        start = conn.execute(
            "SELECT MIN(rollup_from_id) FROM progress "
            "WHERE session = (SELECT MAX(session) FROM progress)"
        ).fetchone()[0]
        if start is None:
            return
        found = unfolded_rollups(conn, start, self._agg.window_ns)
        for key, (stats, wall_min, wall_max, upto) in found.items():
            store_window(conn, key, stats, wall_min, wall_max, upto)
        if found:
            log.info("journal_rollups_repaired", windows=len(found))

    # --- one flush ---------------------------------------------------------------------------

    def _cycle(self) -> None:
        now = time.monotonic()
        if self._pending is not None and now < self._retry_at:
            return
        batch = self._pending or self._take()
        if not batch.items and now - self._last_commit < IDLE_HEARTBEAT_S:
            return  # nothing new: a heartbeat a second is enough (and spares the disk)
        try:
            self._commit(batch, final=False)
        except sqlite3.Error as exc:
            self._failed(batch, exc)
            return
        self._last_commit = now
        if self._errors_in_row:
            log.warning("journal_writes_resumed", after_errors=self._errors_in_row)
        self._errors_in_row = 0
        self._pending = None
        if now - self._last_retention >= RETENTION_EVERY_S:
            self._last_retention = now
            self._retention()

    def _take(self) -> _Batch:
        return _Batch(self._handoff.take(MAX_BATCH))

    def _final(self) -> None:
        """Closing: write everything queued (a few retries on errors), then every window."""
        attempts = 0
        while True:
            batch = self._pending or self._take()
            last = not self._q
            try:
                self._commit(batch, final=last)
            except sqlite3.Error as exc:
                self._failed(batch, exc)
                attempts += 1
                if attempts >= 3:
                    lost = len(batch.items) + len(self._q)
                    log.exception("journal_close_incomplete", unwritten=lost)
                    return
                time.sleep(1.0)
                continue
            self._pending = None
            if last:
                break
        with contextlib.suppress(sqlite3.Error):
            assert self._conn is not None
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._update_size()

    def _failed(self, batch: _Batch, exc: sqlite3.Error) -> None:
        """Disk full, read-only, I/O error: keep the batch, retry later, keep measuring."""
        with contextlib.suppress(sqlite3.Error):
            assert self._conn is not None
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        for key in [k for k, sid in self._series.items() if sid >= self._next_series]:
            del self._series[key]
        self._errors_in_row += 1
        delay = min(RETRY_MAX_S, 0.5 * 2 ** min(self._errors_in_row, 6))
        self._retry_at = time.monotonic() + delay
        self._pending = batch
        if self.metrics is not None:
            self.metrics.write_errors.inc()
        if self._errors_in_row == 1 or self._errors_in_row % 20 == 0:
            log.error(
                "journal_write_failed",
                error=f"{type(exc).__name__}: {exc}",
                records=len(batch.items),
                retry_in_s=delay,
                failures=self._errors_in_row,
            )
        if not batch.forwarded:  # metrics must not wait for the disk
            batch.forwarded = True
            self._handoff.give_back([o for o in batch.items if type(o) is Outcome])

    def _commit(self, batch: _Batch, *, final: bool) -> None:
        """One transaction: rows, samples, events, aggregates, heartbeat. The in-memory
        state moves on only after COMMIT, so a failed batch can be retried as it was."""
        conn = self._conn
        assert conn is not None
        t0 = time.perf_counter()
        rows: list[tuple[Any, ...]] = []
        samples: list[tuple[float, int, float]] = []
        events: list[tuple[float, int | None, str, dict[str, Any]]] = []
        new_series: list[tuple[int, str, str]] = []
        outcomes: list[Outcome] = []
        next_id = self._next_id
        next_series = self._next_series
        deltas = Deltas()
        agg, progress = self._agg, self._progress
        clock = progress.clock
        origin = clock.origin_ns if clock is not None else 0
        session, window_ns = progress.session, agg.window_ns
        itl = self.cfg.itl if self.cfg.itl_gaps else "none"
        budget = self._budget
        keep_rows = budget.keep_rows(conn)  # near journal.max_bytes: rollups only
        every = YIELD_EVERY
        for i, item in enumerate(batch.items, 1):
            if every and not i % every:
                os.sched_yield()  # the loop's turn (YIELD_EVERY)
            kind = type(item)
            if kind is Outcome:
                row, ordered = outcome_row(item, next_id, session, origin, itl=itl)
                deltas.add(item, row, ordered, window_ns)
                rows.append(row)
                outcomes.append(item)
                next_id += keep_rows
            elif kind is Sample:
                key = (item.name, item.labels)
                sid = self._series.get(key)
                if sid is None:
                    sid = self._series[key] = next_series
                    next_series += 1
                    new_series.append((sid, item.name, json.dumps(item.labels)))
                samples.append((item.wall, sid, item.value))
            else:
                _, wall, offset, name, data = item
                events.append((wall, offset, name, data))
        last_id = next_id - 1
        now_window = (progress.offset_now() or progress.last_offset) // window_ns
        conn.execute("BEGIN")
        stopped = budget.stopped(conn) if budget.rows_kept and not keep_rows else None
        if stopped is not None:
            progress.insert_event(conn, self._wall(), progress.last_offset, "rows_stopped", stopped)
        if new_series:
            conn.executemany("INSERT INTO series VALUES (?,?,?)", new_series)
        if rows and keep_rows:
            conn.executemany(schema.INSERT_REQUEST, rows)
        if samples:
            conn.executemany("INSERT INTO samples VALUES (?,?,?)", samples)
        for wall, offset, name, data in events:
            progress.insert_event(conn, wall, offset, name, data)
        # dropped outcomes are in the totals too (Metrics counted them); the loop replaces
        # the values of _dropped, never mutates them
        # without rows, every window is stored at each commit (nothing to rebuild them from)
        staged = agg.write(
            conn,
            deltas,
            dict(self._dropped),
            last_id,
            now_window,
            final or not keep_rows,
            self._dropped_notes,
        )
        beat = progress.heartbeat(conn, staged.rollup_from_id(next_id), final)
        conn.execute("COMMIT")
        # committed: the in-memory state moves on
        progress.committed(beat)
        self._next_id = next_id
        self._next_series = next_series
        agg.committed(staged, now_window)
        budget.committed(keep_rows, len(rows), stopped)
        downtime = beat.downtime_s
        if downtime is not None:
            self.downtime_s = downtime
        m = self.metrics
        if m is not None:
            if downtime:
                m.downtime.inc(downtime)
            m.commit.observe(time.perf_counter() - t0)
            m.last_commit.set(self._wall())
            if rows and keep_rows:
                m.records.labels("request").inc(len(rows))
            if samples:
                m.records.labels("sample").inc(len(samples))
            if events:
                m.records.labels("event").inc(len(events))
            self._update_size()
        if not batch.forwarded:
            batch.forwarded = True
            self._handoff.give_back(outcomes)

    def _update_size(self) -> None:
        if self.metrics is None:
            return
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{self.path}{suffix}").st_size
        self.metrics.size.set(size)
        self._budget.update_free()

    # --- retention -----------------------------------------------------------------------------

    def _retention(self) -> None:
        """Delete old samples/requests by age, then the oldest rows while over max_bytes.
        Totals, histograms and rollups are never deleted: the report stays whole-run."""
        cfg = self.cfg
        conn = self._conn
        assert conn is not None
        now = self._wall()
        progress = self._progress
        try:
            deleted = apply_retention(conn, cfg, now, self._budget.max_bytes)
            if deleted:
                conn.execute("BEGIN")
                progress.insert_event(conn, now, progress.last_offset, "retention", deleted)
                conn.execute("COMMIT")
                log.info("journal_retention", deleted=deleted)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            log.warning("journal_retention_failed", error=str(exc))


async def open_journal(
    run_dir: Path,
    run: RunInfo,
    cfg: JournalConfig | None = None,
    *,
    metrics: JournalMetrics | None = None,
    forward: OutcomeSink | None = None,
    resume: ResumeState | None = None,
) -> Journal:
    """Open or create ``run_dir/journal.db`` and start its writer (async factory)."""
    journal = Journal(
        run_dir / JOURNAL_FILE, run, cfg, metrics=metrics, forward=forward, resume=resume
    )
    journal._handoff.loop = asyncio.get_running_loop()  # committed outcomes come back here
    await asyncio.to_thread(journal.start)  # opening may fold a crashed session's rows in
    return journal
