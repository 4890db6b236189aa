"""Journal budget room: ``journal.max_bytes``, the disk the journal may use, and what the
writer does near it.

- The budget is ``journal.max_bytes``, or by default the journal's size at the run's first
  start plus half the free space of its file system then, at most ``AUTO_CAP`` (20 GB). The
  default is computed once and kept in ``meta`` (``journal_budget``), so a resume does not
  grant itself half of what is left again.
- Once the journal's used size reaches ``ROWS_AT`` (90 %) of it, the writer stops writing
  per-request rows for the rest of the session: every request still goes into the totals,
  the histogram buckets and the rollups (stored at every commit from then on, so a kill
  loses no more than a flush), which the report reads anyway. It logs it once
  (``journal_rows_stopped``), records a ``rows_stopped`` event, and exports it
  (``soakd_journal_rows_kept`` 0, ``soakd_journal_rows_dropped_total``).
- Beyond the budget itself, retention deletes the oldest rows (retention.py).
- A disk that fills and never frees: the writer holds ``journal.reserve`` (``Reserve``,
  ``RESERVE_BYTES`` of real blocks) from the start, and lets it go when the final write
  fails, so the run's final state still goes in (store.py).

Writer state only (the journal's writer process).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Protocol

from soakd.childlog import ChildLog
from soakd.journal.counts import WriterCounts
from soakd.journal.records import RowsStopped

log = ChildLog()

AUTO_CAP = 20_000_000_000  # the default budget's ceiling: 72 h of 300 B rows at 900 req/s
AUTO_SHARE = 0.5  # of the free space at the first start
ROWS_AT = 0.9  # of the budget: per-request rows stop here
RESERVE_FILE = "journal.reserve"
RESERVE_BYTES = 4 << 20
"""Disk held back from the start for the run's final state: its totals, rollup windows,
heartbeat and events take a few dozen 16 KiB pages (their WAL frames, then the
checkpoint), far less than this."""


def used_bytes(conn: sqlite3.Connection) -> int:
    """Pages in use (free pages left out: SQLite reuses them), in bytes."""
    page_size, pages, free = (
        conn.execute(f"PRAGMA {p}").fetchone()[0]
        for p in ("page_size", "page_count", "freelist_count")
    )
    return int((pages - free) * page_size)


def disk_free(path: Path) -> int | None:
    """Bytes free for an unprivileged writer on ``path``'s file system (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class BudgetConfig(Protocol):
    """What the budget reads of ``journal:`` (``JournalConfig``, or the writer's copy)."""

    @property
    def max_bytes(self) -> int | None: ...


class Budget:
    """The session's view of the budget: ``open`` once, ``keep_rows`` before each batch."""

    def __init__(self, cfg: BudgetConfig, metrics: WriterCounts | None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.max_bytes = cfg.max_bytes or AUTO_CAP
        self.rows_kept = True
        self.path: Path | None = None

    def open(self, conn: sqlite3.Connection, path: Path) -> None:
        """The budget for this journal (the stored default, or compute and store it)."""
        self.path = path
        if self.cfg.max_bytes is not None:
            self.max_bytes = self.cfg.max_bytes
        else:
            row = conn.execute("SELECT value FROM meta WHERE key = 'journal_budget'").fetchone()
            if row is not None:
                self.max_bytes = int(json.loads(row[0]))
            else:
                free = disk_free(path.parent) or 0
                self.max_bytes = int(min(AUTO_CAP, used_bytes(conn) + AUTO_SHARE * free))
                conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('journal_budget', ?)",
                    (json.dumps(self.max_bytes),),
                )
        m = self.metrics
        if m is not None:
            m.max_bytes.set(self.max_bytes)
            m.rows_kept.set(1)

    def keep_rows(self, conn: sqlite3.Connection) -> bool:
        """Whether the next batch writes its request rows (False for good, once over)."""
        return self.rows_kept and used_bytes(conn) < ROWS_AT * self.max_bytes

    def stopped(self, conn: sqlite3.Connection) -> RowsStopped:
        """The ``rows_stopped`` event (inside the batch's transaction)."""
        return RowsStopped(used_bytes(conn), self.max_bytes)

    def committed(self, keep_rows: bool, rows: int, event: RowsStopped | None) -> None:
        """The batch committed: the mode moves on; ``rows`` request rows were (not) kept."""
        m = self.metrics
        if not keep_rows and m is not None:
            m.rows_dropped.inc(rows)
        if event is None:
            return
        self.rows_kept = False
        if m is not None:
            m.rows_kept.set(0)
        log.warning(
            "journal_rows_stopped",
            used_bytes=event.used_bytes,
            max_bytes=event.max_bytes,
            note="the journal is near journal.max_bytes: per-request rows are no longer "
            "written this session; totals, histograms and rollups go on (the report "
            "stays whole), the export ends here",
        )

    def update_free(self) -> None:
        """``soakd_journal_disk_free_bytes`` (with the size gauge, after each commit)."""
        if self.metrics is None or self.path is None:
            return
        free = disk_free(self.path.parent)
        if free is not None:
            self.metrics.disk_free.set(free)


class Reserve:
    """``journal.reserve``: ``RESERVE_BYTES`` of the disk, held from the start for the final
    write of a run whose disk fills up, given back when that write fails (or at the end)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RESERVE_FILE
        self.held = False

    def hold(self) -> None:
        """Take the reserve now (real blocks, not a sparse file); a disk already full only
        logs it: the run goes on without one."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.path.unlink()
            log.warning("journal_reserve_not_taken", error=exc.strerror)
            return
        self.held = True

    def release(self) -> bool:
        """Give the reserve back to the disk; True when there was one."""
        if not self.held:
            return False
        self.held = False
        with contextlib.suppress(OSError):
            self.path.unlink()
        return True
