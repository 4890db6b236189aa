"""Journal retention room: deleting old probe samples and request rows in very long runs.

By age (``keep_samples``, ``keep_requests``), then the oldest rows while the used size is
over the journal's budget (``journal.max_bytes`` or its default, budget.py; request rows
stopped at 90 % of it, so what grows by then is probe samples), down to 95 % of it.
Totals, histograms and rollups are never deleted, so the report stays whole-run and a
resume still restores the counters; only the export loses rows.
"""

from __future__ import annotations

import sqlite3
from typing import Protocol

from soakd.journal.budget import used_bytes


class Keep(Protocol):
    """What retention reads of ``journal:`` (``JournalConfig``, or the writer's copy)."""

    @property
    def keep_samples(self) -> float | None: ...
    @property
    def keep_requests(self) -> float | None: ...


RETENTION_TABLES = ("samples", "requests")


def apply_retention(
    conn: sqlite3.Connection, cfg: Keep, now: float, max_bytes: int
) -> dict[str, int]:
    """Delete what ``cfg`` and the budget no longer keep; rows deleted per table (tables
    with none left out). Each delete is its own transaction; raises sqlite3.Error."""
    deleted: dict[str, int] = {}
    for table, keep in (("samples", cfg.keep_samples), ("requests", cfg.keep_requests)):
        if keep is not None:
            deleted[table] = _delete_before(conn, table, now - keep)
    if used_bytes(conn) > max_bytes:
        for _ in range(20):
            if used_bytes(conn) <= max_bytes * 0.95:
                break
            oldest = _oldest_table(conn)
            if oldest is None:
                break
            deleted[oldest] = deleted.get(oldest, 0) + _delete_oldest(conn, oldest)
    return {k: v for k, v in deleted.items() if v}


def _delete_before(conn: sqlite3.Connection, table: str, cutoff: float) -> int:
    # rows are appended in time order: find the first one to keep by rowid
    row = conn.execute(
        f"SELECT rowid FROM {table} WHERE wall >= ? ORDER BY rowid LIMIT 1",  # noqa: S608
        (cutoff,),
    ).fetchone()
    top = row[0] if row else conn.execute(f"SELECT MAX(rowid) + 1 FROM {table}").fetchone()[0]  # noqa: S608
    if top is None:
        return 0
    conn.execute("BEGIN")
    n: int = conn.execute(f"DELETE FROM {table} WHERE rowid < ?", (top,)).rowcount  # noqa: S608
    conn.execute("COMMIT")
    return n


def _oldest_table(conn: sqlite3.Connection) -> str | None:
    oldest = []
    for table in RETENTION_TABLES:
        row = conn.execute(f"SELECT wall FROM {table} ORDER BY rowid LIMIT 1").fetchone()  # noqa: S608
        if row is not None:
            oldest.append((row[0], table))
    return min(oldest)[1] if oldest else None


def _delete_oldest(conn: sqlite3.Connection, table: str) -> int:
    lo, hi = conn.execute(f"SELECT MIN(rowid), MAX(rowid) FROM {table}").fetchone()  # noqa: S608
    if lo is None:
        return 0
    top = lo + max(1000, (hi - lo) // 20)  # the oldest 5 %
    conn.execute("BEGIN")
    n: int = conn.execute(f"DELETE FROM {table} WHERE rowid < ?", (top,)).rowcount  # noqa: S608
    conn.execute("COMMIT")
    return n
