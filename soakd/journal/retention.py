"""Journal retention room: deleting old probe samples and request rows in very long runs.

By age (``keep_samples``, ``keep_requests``), then the oldest rows while the used size is
over ``max_bytes``. Totals, histograms and rollups are never deleted, so the report stays
whole-run and a resume still restores the counters; only the export loses rows.
"""

from __future__ import annotations

import sqlite3

from soakd.config import JournalConfig

RETENTION_TABLES = ("samples", "requests")


def wanted(cfg: JournalConfig) -> bool:
    """Whether the config asks for any retention at all."""
    return not (cfg.keep_samples is None and cfg.keep_requests is None and cfg.max_bytes is None)


def apply_retention(conn: sqlite3.Connection, cfg: JournalConfig, now: float) -> dict[str, int]:
    """Delete what ``cfg`` no longer keeps; rows deleted per table (tables with none left
    out). Each delete is its own transaction; raises sqlite3.Error."""
    deleted: dict[str, int] = {}
    for table, keep in (("samples", cfg.keep_samples), ("requests", cfg.keep_requests)):
        if keep is not None:
            deleted[table] = _delete_before(conn, table, now - keep)
    if cfg.max_bytes is not None:
        for _ in range(20):
            page_size, pages, free = (
                conn.execute(f"PRAGMA {p}").fetchone()[0]
                for p in ("page_size", "page_count", "freelist_count")
            )
            if (pages - free) * page_size <= cfg.max_bytes * 0.9:
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
