"""Journal opening room: the writer opens (or creates) the database and reads back the state
it continues from. Writer state only (the journal's writer process; store.py).

``open_db`` takes the disk reserve (budget.py), opens the file in WAL mode with the
configured ``synchronous``, creates it (a new run) or migrates it (schema.py), checks that it
holds this run, reads what it holds (``Restored``, for soakd's ``Metrics.restore``; the
aggregates, the series, the next row id, the last packet a restarted writer's session
committed), folds the rows a killed session committed but never rolled up into the
rollups, and starts the session (a new one, or, for a writer started again, the same one
rejoined), all in one transaction. What it returns is open: ``Store`` holds it as it is.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soakd import __version__
from soakd.childlog import ChildLog
from soakd.journal import schema
from soakd.journal.budget import Budget, Reserve
from soakd.journal.counts import WriterCounts
from soakd.journal.messages import Restored, RunInfo, WriterConfig
from soakd.journal.progress import Progress, Resumed
from soakd.journal.records import EventKind
from soakd.journal.rollups import Aggregates, store_window, unfolded_rollups
from soakd.journal.schema import PAGE_SIZE, JournalError

log = ChildLog()

PACKET_KEY = "writer_packet"
"""``meta`` key: the last packet a session's writer committed ({session, seq}): a restarted
writer tells soakd which of the packets it sent the dead one are in the journal."""

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""A probe sample's series: its name and labels (one row of ``series``)."""


@dataclass(slots=True)
class Opened:
    """The journal, open, as the writer found it."""

    conn: sqlite3.Connection
    restored: Restored
    progress: Progress
    agg: Aggregates
    budget: Budget
    reserve: Reserve
    next_id: int  # the next request row's id
    series: dict[SeriesKey, int]
    next_series: int
    packet_seq: int  # the last packet this session committed before this writer (0: none)


def open_db(
    path: Path,
    run: RunInfo,
    cfg: WriterConfig,
    *,
    resume: Resumed | None,
    session: int,
    counts: WriterCounts | None,
    wall: Callable[[], float],
) -> Opened:
    """Open (or create) the journal at ``path``; ``session``: 0 for a new session, else the
    one a restarted writer continues. JournalError when it cannot be used."""
    reserve = Reserve(path.parent)
    reserve.hold()
    new = not path.exists()
    if new and (resume is not None or session):
        reserve.release()
        raise JournalError(f"{path}: the journal vanished before the resume")
    conn = schema.connect(path, readonly=False)
    progress = Progress(resume, wall)
    try:
        try:
            if new:  # rows of 2 KB (512 ITL gaps) half-fill 4 KiB pages; 16 KiB ones hold 7
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {cfg.synchronous.upper()}")
            conn.execute("PRAGMA journal_size_limit = 67108864")  # WAL back to 64 MiB after use
            now = wall()
            if new:
                schema.create(conn, _meta(run, now))
            else:
                schema.migrate(conn)
            meta = schema.check_schema(conn, path, writing=True)
            if meta["run_id"] != run.run_id:
                raise JournalError(f"{path}: holds run {meta['run_id']}, not {run.run_id}")
            budget = Budget(cfg, counts)
            budget.open(conn, path)
            opened = _load(conn, meta, progress, budget, reserve, session)
            conn.execute("BEGIN")
            _repair(conn, opened.agg.window_ns)
            if session:
                progress.rejoin(conn, session)
            else:
                progress.begin(conn, now, opened.next_id)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise JournalError(f"{path}: cannot open the journal: {exc}") from None
    except JournalError:
        conn.close()
        reserve.release()
        raise
    return opened


def _meta(run: RunInfo, now: float) -> dict[str, Any]:
    """A new journal's ``meta``: the run as soakd started it."""
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "soakd_version": __version__,
        "run_id": run.run_id,
        "created_wall": now,
        "created": datetime.fromtimestamp(now, UTC).isoformat(),
        "plan_start": run.plan_start.isoformat(),
        "options": run.options,
        "config": run.config,
        "plan": run.plan,
        "window_ns": run.window_ns,
    }


def _load(
    conn: sqlite3.Connection,
    meta: dict[str, Any],
    progress: Progress,
    budget: Budget,
    reserve: Reserve,
    session: int,
) -> Opened:
    """What the journal holds: the state the writer continues, and ``Restored``."""
    progress.load(conn)
    next_id = 1 + (conn.execute("SELECT MAX(id) FROM requests").fetchone()[0] or 0)
    series: dict[SeriesKey, int] = {}
    next_series = 1
    for sid, name, labels in conn.execute("SELECT id, name, labels FROM series"):
        series[(name, tuple((str(k), str(v)) for k, v in json.loads(labels)))] = sid
        next_series = max(next_series, sid + 1)
    agg = Aggregates(int(meta["window_ns"]))
    totals = agg.load(conn)
    downtime = sum(
        json.loads(d)["seconds"]
        for (d,) in conn.execute("SELECT data FROM events WHERE kind = ?", (EventKind.DOWNTIME,))
    )
    (resumes,) = conn.execute(
        "SELECT COUNT(*) FROM events WHERE kind = ?", (EventKind.RUN_RESUMED,)
    ).fetchone()
    packet = meta.get(PACKET_KEY) or {}
    packet_seq = int(packet["seq"]) if session and packet.get("session") == session else 0
    restored = Restored(
        totals,
        dict(agg.hists),
        downtime,
        resumes,
        dict(progress.missed),
        [(t, n, c) for (t, n), c in agg.notes.items()],
    )
    return Opened(
        conn, restored, progress, agg, budget, reserve, next_id, series, next_series, packet_seq
    )


def _repair(conn: sqlite3.Connection, window_ns: int) -> None:
    """Fold rows a killed session committed but never rolled up into the rollups."""
    start = conn.execute(
        "SELECT MIN(rollup_from_id) FROM progress "
        "WHERE session = (SELECT MAX(session) FROM progress)"
    ).fetchone()[0]
    if start is None:
        return
    found = unfolded_rollups(conn, start, window_ns)
    for key, (stats, wall_min, wall_max, upto) in found.items():
        store_window(conn, key, stats, wall_min, wall_max, upto)
    if found:
        log.info("journal_rollups_repaired", windows=len(found))
