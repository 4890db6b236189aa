"""Journal integrity room: whether a journal can be trusted, what it lost, and what a
damaged one still holds.

- ``damage``: SQLite's ``quick_check`` of each table (every page read once: ~1.2 s for a
  million rows, docs/journal.md), run before a resume, a report and an export. A damaged
  journal is one line naming the damaged tables (``damaged_error``), never a traceback
  halfway through a report.
- ``Mark``: the last commit, kept outside the database too (``journal.mark``, rewritten
  after every commit). WAL makes a commit atomic, not indestructible: a damaged, truncated
  or deleted ``journal.db-wal`` drops every commit after the damage, silently, and the
  database left is consistent with itself (its heartbeat and totals go back too). Only
  something outside it can tell: ``lost`` compares the mark with the database.
- ``salvage``: every readable row of a damaged journal copied into a new one (the report
  and the export read that, with a note of what was lost).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soakd.config import format_duration
from soakd.journal.mark import MARK_FILE as MARK_FILE
from soakd.journal.mark import Mark as Mark
from soakd.journal.mark import MarkFile as MarkFile
from soakd.journal.mark import read_mark as read_mark
from soakd.journal.records import EventKind
from soakd.journal.schema import APPLICATION_ID, JournalDamaged, connect
from soakd.journal.stored import StoredCore, read_core

SALVAGED_FILE = "journal.salvaged.db"
GRAIN = 16
"""A range of row ids this short that cannot be read is counted lost without splitting it
further (a damaged 16 KiB page holds ~100 request rows)."""
"""The run record a report cannot do without."""
NEAR_DAMAGE = 1000
"""Rows this close (in ids) to an unreadable range are decoded before they are kept: a
damaged page can still be read, wrongly."""
MAX_PROBES = 100_000
"""Range reads a salvage tries per table before it stops searching (a damaged root or
index page fails every read under it: the search would not end)."""


# --- damage ------------------------------------------------------------------------------


def damage(conn: sqlite3.Connection) -> dict[str, str]:
    """{table: SQLite's first complaint} for each table whose pages do not check out
    (``PRAGMA quick_check(table)``: b-tree structure, cell bounds, row order); empty when
    the journal is whole. ``sqlite_schema`` when not even the table list can be read."""
    try:
        tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
    except sqlite3.DatabaseError as exc:
        return {"sqlite_schema": str(exc)}
    found: dict[str, str] = {}
    for name in tables:
        try:
            rows = conn.execute(f'PRAGMA quick_check("{name}")').fetchall()
        except sqlite3.DatabaseError as exc:
            found[name] = str(exc)
            continue
        if rows != [("ok",)]:
            lines = [ln for r in rows for ln in str(r[0]).splitlines() if not ln.startswith("***")]
            found[name] = lines[0] if lines else "damaged"
    return found


def damaged_error(path: Path, found: dict[str, str], *, resume: bool = False) -> JournalDamaged:
    """The one line for a damaged journal: which tables, SQLite's first word on it, and
    what can be done."""
    run_dir = path.parent
    first = next(iter(found.values()))
    if "sqlite_schema" in found or "meta" in found:
        what = "its table list or its run record (meta) cannot be read: nothing can be salvaged"
        return JournalDamaged(f"{path} is damaged ({first}): {what}")
    return JournalDamaged(
        f"{path} is damaged: {', '.join(found)} cannot be read whole ({first}); "
        + ("a damaged journal is not continued (start a new --run-dir); " if resume else "")
        + f"`soakd report {run_dir} --salvage` (and `soakd export ... --salvage`) read what "
        "is readable"
    )


def check_whole(conn: sqlite3.Connection, path: Path, *, resume: bool = False) -> None:
    """JournalError (one line) when the journal's pages do not check out."""
    found = damage(conn)
    if found:
        raise damaged_error(path, found, resume=resume)


# --- the mark ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loss:
    """What the journal committed and no longer holds (the mark against the database)."""

    rows: int  # request rows
    requests: int  # requests in the totals
    offset_ns: int  # the plan clock the journal had reached (the mark's)
    held_offset_ns: int  # ... and the one the database says

    def describe(self) -> str:
        return (
            f"the journal lost {self.rows:,} request row(s) and {self.requests:,} request(s) "
            "from its totals that it had committed, from "
            f"{format_duration(self.held_offset_ns / 1e9)} to "
            f"{format_duration(self.offset_ns / 1e9)} of plan time: its write-ahead log "
            "(journal.db-wal) was damaged, truncated or removed; the figures leave them out"
        )


def emptied(path: Path, mark: Mark | None) -> JournalDamaged | None:
    """For a journal that reads as no soakd journal at all: when its mark says it had
    committed rows, the error that says what happened (its WAL went before any
    checkpoint), not "not a soakd journal"."""
    if mark is None or not (mark.last_id or mark.requests):
        return None
    return JournalDamaged(
        f"{path} holds none of the run: its write-ahead log (journal.db-wal) is missing or "
        f"damaged, and every commit went with it ({mark.last_id:,} request rows, "
        f"{mark.requests:,} requests, {format_duration(mark.offset_ns / 1e9)} of plan time, "
        f"by its mark, {MARK_FILE}); nothing can be salvaged"
    )


def lost(conn: sqlite3.Connection, mark: Mark | None) -> Loss | None:
    """What ``mark`` says was committed and the database does not hold (read the mark
    first: it is written after each commit, so a database read later is never behind a
    mark it did not lose)."""
    if mark is None:
        return None
    last_id = conn.execute("SELECT MAX(id) FROM requests").fetchone()[0]
    requests = conn.execute("SELECT COALESCE(SUM(requests), 0) FROM totals").fetchone()[0]
    held = conn.execute("SELECT COALESCE(MAX(offset_ns), 0) FROM progress").fetchone()[0]
    retention = conn.execute(
        "SELECT 1 FROM events WHERE kind = ? LIMIT 1", (EventKind.RETENTION,)
    ).fetchone()
    rows = 0
    if last_id is not None or retention is None:  # retention may have emptied the table
        rows = max(0, mark.last_id - int(last_id or 0))
    gone = max(0, mark.requests - int(requests))
    if not rows and not gone:
        return None
    return Loss(rows, gone, mark.offset_ns, int(held))


# --- salvage -----------------------------------------------------------------------------


@dataclass
class Salvaged:
    """What a salvage read, per table: rows copied and (about) how many could not be."""

    path: Path
    read: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    whole_lost: list[str] = field(default_factory=list)  # small tables that could not be read

    def describe(self) -> str:
        parts = []
        for table, n in self.read.items():
            miss = self.lost.get(table, 0)
            parts.append(f"{table} {n:,}" + (f" (about {miss:,} lost)" if miss else ""))
        lost = f"; unreadable: {', '.join(self.whole_lost)}" if self.whole_lost else ""
        return (
            "read with --salvage: journal.db is damaged; rows read: "
            + ", ".join(parts)
            + lost
            + f"; the figures cover what was readable (a copy: {self.path})"
        )


def salvage(src: Path, dst: Path) -> Salvaged:
    """Copy every readable row of the journal ``src`` into a new journal ``dst`` (replaced).
    Rowid tables are read by id ranges, a range that fails split in two until the damaged
    pages are fenced off; rollup windows the same per target and phase. JournalError when
    not even the table list and the run record (meta) can be read."""
    conn = connect(src, readonly=True)
    try:
        try:
            tables = conn.execute(
                "SELECT name, sql FROM sqlite_schema WHERE type = 'table'"
            ).fetchall()
            meta = conn.execute("SELECT key, value FROM meta").fetchall()
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            run = read_core({str(k): json.loads(v) for k, v in meta})
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            raise JournalDamaged(
                f"{src} is damaged beyond salvage: its table list or its run record (meta: "
                f"the run id, config and plan) cannot be read ({exc})"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            dst.unlink()
        out = sqlite3.connect(f"file:{dst}", uri=True, isolation_level=None)
        try:
            # each statement its own transaction (after a read of a damaged page fails,
            # SQLite refuses every later write of an open transaction), kept in memory:
            # a copy needs no fsync
            out.execute("PRAGMA page_size = 16384")
            out.execute("PRAGMA journal_mode = MEMORY")
            out.execute("PRAGMA synchronous = OFF")
            out.execute("ATTACH DATABASE ? AS src", (f"file:{src}?mode=ro",))
            for _, sql in tables:
                out.execute(sql)
            out.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            out.execute(f"PRAGMA user_version = {version}")
            result = Salvaged(dst)
            out.executemany("INSERT INTO meta VALUES (?, ?)", meta)
            result.read["meta"] = len(meta)
            for name, sql in tables:
                if name == "meta":
                    continue
                if "WITHOUT ROWID" not in sql.upper():
                    bound = _id_bound(conn, name, read_mark(src.parent))
                    failed = _copy_by_rowid(out, name, result, bound)
                    if name == "requests" and failed:
                        _drop_undecodable(out, result, failed)
                elif name == "rollups":
                    _copy_rollups(conn, out, run, result)
                else:
                    _copy_whole(conn, out, name, result)
        finally:
            out.close()
    finally:
        conn.close()
    return result


def _copy_whole(src: sqlite3.Connection, out: sqlite3.Connection, name: str, s: Salvaged) -> None:
    """A small table (totals, histograms, missed): all of it, or noted as unreadable."""
    try:
        rows = src.execute(f'SELECT * FROM "{name}"').fetchall()  # noqa: S608
    except sqlite3.DatabaseError:
        s.whole_lost.append(name)
        return
    if rows:
        marks = ",".join("?" * len(rows[0]))
        out.executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)  # noqa: S608
    s.read[name] = len(rows)


def _id_bound(conn: sqlite3.Connection, name: str, mark: Mark | None) -> int:
    """The highest id a table can hold, when its own pages cannot say (or say nonsense):
    the last request id the writer committed (its mark), else the requests the totals
    count (ids never pass it); other tables are searched whole."""
    if name == "requests":
        if mark is not None and mark.last_id:
            return mark.last_id
        with contextlib.suppress(sqlite3.DatabaseError):
            total = conn.execute("SELECT SUM(requests) FROM totals").fetchone()[0]
            if total is not None:
                return int(total)
    return 1 << 62


def _copy_by_rowid(
    out: sqlite3.Connection, name: str, s: Salvaged, bound: int
) -> list[tuple[int, int]]:
    """Every readable row of a rowid table (``src``, attached to ``out``), copied by id
    ranges inside SQLite. The ids are dense (retention deletes the oldest only), so a range
    that fails, or comes back with holes (a damaged page can end a read early without an
    error), is split in two until it is GRAIN ids short. Returns those short ranges."""
    cols = ", ".join(f'"{r[1]}"' for r in out.execute(f'PRAGMA src.table_info("{name}")'))
    # (+rowid: checked again row by row: a damaged parent page can send a read to the
    # wrong leaf, whose rows belong to another range)
    copy = (
        f'INSERT OR IGNORE INTO main."{name}" (rowid, {cols}) SELECT rowid, {cols} '  # noqa: S608
        f'FROM src."{name}" WHERE rowid BETWEEN ?1 AND ?2 AND +rowid BETWEEN ?1 AND ?2'
    )
    have = f'SELECT COUNT(*) FROM main."{name}" WHERE rowid BETWEEN ? AND ?'  # noqa: S608
    try:
        lo, hi = out.execute(f'SELECT MIN(rowid), MAX(rowid) FROM src."{name}"').fetchone()  # noqa: S608
    except sqlite3.DatabaseError:
        lo, hi = 1, bound  # the ends themselves are unreadable: search up to the bound
    if lo is None:
        s.read[name] = 0
        return []
    hi = min(hi, bound)  # a damaged last page can say any id
    lo = max(lo, 1)  # so can a damaged page on the way to the first: ids start at 1
    failed: list[tuple[int, int]] = []
    stack = [(lo, hi)]
    probes = 0
    while stack:
        a, b = stack.pop()
        probes += 1
        if probes > MAX_PROBES:
            s.whole_lost.append(f"{name}: the search stopped at id {a - 1} (index pages damaged)")
            break
        try:
            out.execute(copy, (a, b))  # all of the range, or (rolled back) none
            if out.execute(have, (a, b)).fetchone()[0] == b - a + 1:
                continue  # whole
        except sqlite3.DatabaseError:
            pass
        if b - a < GRAIN:
            failed.append((a, b))
            continue
        mid = (a + b) // 2
        stack += [(mid + 1, b), (a, mid)]  # the lower half first: ids stay in order
    read = out.execute(f'SELECT COUNT(*) FROM main."{name}"').fetchone()[0]  # noqa: S608
    s.read[name] = read
    lost = sum(b - a + 1 - out.execute(have, (a, b)).fetchone()[0] for a, b in failed)
    if lost:
        s.lost[name] = lost
    return failed


def _drop_undecodable(out: sqlite3.Connection, s: Salvaged, near: list[tuple[int, int]]) -> None:
    """Request rows read next to the damage whose fields do not decode (an error kind,
    ITL gaps): deleted from the copy, counted lost (the export would stumble on them)."""
    from soakd.journal.codec import outcome_from_row
    from soakd.journal.schema import request_columns

    version = int(out.execute("PRAGMA user_version").fetchone()[0])
    out.row_factory = sqlite3.Row
    bad = []
    select = f"SELECT {request_columns(version)} FROM main.requests WHERE id BETWEEN ? AND ?"  # noqa: S608
    try:
        for a, b in near:
            for row in out.execute(select, (a - NEAR_DAMAGE, b + NEAR_DAMAGE)):
                try:
                    outcome_from_row(row)
                except (ValueError, TypeError, KeyError, IndexError, OverflowError):
                    bad.append((row["id"],))
    finally:
        out.row_factory = None
    if bad:
        out.executemany("DELETE FROM main.requests WHERE id = ?", bad)
        s.read["requests"] -= len(bad)
        s.lost["requests"] = s.lost.get("requests", 0) + len(bad)


def _decodable(rows: list[Any]) -> tuple[list[Any], int]:
    """Rollup rows whose stats blob decodes, and how many did not."""
    from soakd.journal.codec import stats_from_blob

    good = []
    for row in rows:
        try:
            stats_from_blob(row[6])
        except (ValueError, TypeError, KeyError, zlib.error):
            continue
        good.append(row)
    return good, len(rows) - len(good)


def _copy_rollups(
    src: sqlite3.Connection, out: sqlite3.Connection, run: StoredCore, s: Salvaged
) -> None:
    """Rollup windows per (target, phase) of the run's config and plan, by window ranges
    (split in two when they fail, as rows are)."""
    undecodable = 0
    try:
        rows = src.execute("SELECT * FROM rollups").fetchall()
    except sqlite3.DatabaseError:
        rows = None
    if rows is not None:
        rows, undecodable = _decodable(rows)
        out.executemany("INSERT INTO rollups VALUES (?,?,?,?,?,?,?)", rows)
        s.read["rollups"] = len(rows)
        if undecodable:
            s.whole_lost.append(f"{undecodable} rollup window(s) (undecodable)")
        return
    targets = [t.name for t in run.config.targets]
    window_ns = run.window_ns or 1_000_000_000
    # the windows each phase can have: its spans of plan time (a request may end a
    # little after its phase: one span's worth of late windows is searched too)
    spans = [(p.name, p.start_ns // window_ns, p.end_ns // window_ns) for p in run.plan.phases]
    damaged = False
    for target in targets:
        for phase, first, end in spans:
            stack = [(first, end + max(2, end - first))]
            while stack:
                a, b = stack.pop()
                try:
                    got = src.execute(
                        "SELECT * FROM rollups WHERE target = ? AND phase = ? "
                        "AND window BETWEEN ? AND ?",
                        (target, phase, a, b),
                    ).fetchall()
                except sqlite3.DatabaseError:
                    if a == b:
                        damaged = True
                    else:
                        mid = (a + b) // 2
                        stack += [(mid + 1, b), (a, mid)]
                    continue
                got, n = _decodable(got)
                undecodable += n
                out.executemany("INSERT OR IGNORE INTO rollups VALUES (?,?,?,?,?,?,?)", got)
    s.read["rollups"] = out.execute("SELECT COUNT(*) FROM rollups").fetchone()[0]
    if damaged or undecodable:  # how many windows is unknown; their requests: totals - rollups
        s.whole_lost.append("some rollup windows (the report counts the requests they held)")


def salvage_path(run_dir: Path) -> Path:
    """Where a salvage writes its copy: beside the journal, or in the temp directory when
    the run dir cannot be written."""
    if os.access(run_dir, os.W_OK):
        return run_dir / SALVAGED_FILE
    import tempfile

    return Path(tempfile.mkdtemp(prefix="soakd-salvage-")) / SALVAGED_FILE
