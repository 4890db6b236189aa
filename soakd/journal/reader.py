"""Journal reader room: read-only access for the report, the export and the tests.

Safe while a run writes (WAL readers never block the writer). ``rollups()`` folds in what a
killed writer committed as rows but never rolled up, in memory, so a report on a crashed
run is whole. Opening checks the journal (integrity.py): a damaged one is a JournalError
naming the damage, or with ``salvage`` a copy of what is readable, read instead
(``salvaged`` says what it holds); ``loss`` is what a damaged write-ahead log took.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from soakd.journal.codec import stats_from_blob
from soakd.journal.integrity import (
    Loss,
    Salvaged,
    damage,
    damaged_error,
    emptied,
    lost,
    read_mark,
    salvage_path,
)
from soakd.journal.integrity import salvage as salvage_journal
from soakd.journal.records import Logged, read_event
from soakd.journal.rollups import unfolded_rollups
from soakd.journal.schema import (
    JOURNAL_FILE,
    JournalDamaged,
    JournalError,
    check_schema,
    connect,
    request_columns,
)
from soakd.journal.stored import StoredRun, read_stored
from soakd.measure.analysis import JITTER_SLICES, JITTER_WINDOW_S, TargetStats

MERGE_SLICE_NS = round(JITTER_WINDOW_S / JITTER_SLICES * 1e9)
"""The report's jitter slices (5 minutes) on a run that reached 2 jitter windows (2 h)."""


class Total(NamedTuple):
    """One row of the ``totals`` table: the counts of one (target, phase, outcome, status
    class), dropped outcomes included."""

    target: str
    phase: str
    outcome: str
    status_class: str
    requests: int
    output_tokens: int
    prompt_tokens: int
    oom: int


class StoredSession(NamedTuple):
    """One row of the ``progress`` table: a session of the run, as its last heartbeat
    (or its close) left it."""

    session: int
    version: str  # the soakd that ran it
    pid: int
    started_wall: float
    started_offset_ns: int
    wall: float
    offset_ns: int  # the plan clock
    phase_index: int | None
    seqs: str  # JSON: target -> the next seq (a resume reads it)
    rollup_from_id: int
    stopped: int  # 1: closed cleanly


@dataclass
class Rollup:
    """A stored window's stats, for the report."""

    target: str
    phase: str
    window: int
    wall_min: float
    wall_max: float
    stats: TargetStats


class JournalReader:
    """Read-only access for the report and the export; safe while a run writes.

    ``salvage``: a damaged journal is copied, every readable row, and the copy is read
    (``salvaged``); without it a damaged journal is a JournalError."""

    def __init__(self, run_dir: Path, *, salvage: bool = False) -> None:
        path = run_dir / JOURNAL_FILE if run_dir.is_dir() else run_dir
        if not path.exists():
            raise JournalError(f"{run_dir}: no journal ({JOURNAL_FILE}) there")
        self.path = path
        self.salvaged: Salvaged | None = None
        self.loss: Loss | None = None
        mark = read_mark(path.parent)  # before the database: never ahead of what it holds
        self.conn = connect(path, readonly=True)
        try:
            self.meta = check_schema(self.conn, path, writing=False)
        except JournalDamaged as exc:
            if not salvage:
                self.conn.close()
                raise
            found = {"meta": str(exc)}
        except JournalError as exc:  # not a soakd journal: unless its mark says it was one
            self.conn.close()
            raise (emptied(path, mark) or exc) from None
        else:
            found = damage(self.conn)
        if found and not salvage:
            self.conn.close()
            raise damaged_error(path, found)
        if found:
            self.conn.close()
            self.salvaged = salvage_journal(path, salvage_path(path.parent))
            self.conn = connect(self.salvaged.path, readonly=True)
            self.meta = check_schema(self.conn, self.salvaged.path, writing=False)
        else:
            self.loss = lost(self.conn, mark)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @cached_property
    def stored(self) -> StoredRun:
        """The run its ``meta`` stored, typed (stored.py); JournalError when unreadable."""
        return read_stored(self.meta, self.path)

    @property
    def window_ns(self) -> int:
        return self.stored.window_ns

    def sessions(self) -> list[StoredSession]:
        cols = ", ".join(StoredSession._fields)
        query = f"SELECT {cols} FROM progress ORDER BY session"  # noqa: S608 (the fields)
        return [StoredSession(*row) for row in self.conn.execute(query)]

    def events(self) -> list[Logged]:
        """Every event, typed (records.py), in the order it was journaled."""
        return [
            Logged(s, w, o, read_event(k, json.loads(d)))
            for s, w, o, k, d in self.conn.execute(
                "SELECT session, wall, offset_ns, kind, data FROM events ORDER BY id"
            )
        ]

    def missed(self) -> dict[tuple[str, str, str], int]:
        """(target, phase, reason) -> planned sends not made (empty for a v1 journal)."""
        try:
            rows = self.conn.execute("SELECT target, phase, reason, count FROM missed")
            return {(t, p, r): n for t, p, r, n in rows}
        except sqlite3.OperationalError:  # v1: no such table
            return {}

    def notes(self) -> list[tuple[str, str, int]]:
        """(target, note, count) rows: what the targets' answers carried (soakd/measure/notes.py);
        empty before v4."""
        try:
            return list(self.conn.execute("SELECT target, note, count FROM notes"))
        except sqlite3.OperationalError:  # before v4: no such table
            return []

    def totals(self) -> list[Total]:
        return [
            Total(a, b, c, d, int(e), int(f), int(g), int(h))
            for a, b, c, d, e, f, g, h in self.conn.execute("SELECT * FROM totals")
        ]

    def span_ns(self, slice_ns: int = MERGE_SLICE_NS) -> int:
        """The coarsest window a report over this journal can use: ``slice_ns`` (the
        jitter's 5-minute slices) once the plan clock and the plan both reached two jitter
        windows (2 h: the report then judges whole hours in 5-minute slices) and the
        journal's window divides it; else the journal's window."""
        window = self.window_ns
        two = round(2 * JITTER_WINDOW_S * 1e9)
        plan_end_ns = self.stored.plan.end_ns
        reached = self.conn.execute("SELECT MAX(offset_ns) FROM progress").fetchone()[0] or 0
        long_run = min(reached, plan_end_ns) >= two
        return slice_ns if long_run and slice_ns % window == 0 else window

    def rollups(self, *, span_ns: int | None = None) -> list[Rollup]:
        """Every window, with what a killed writer left unrolled folded in (in memory).
        ``span_ns`` (a multiple of the journal's window): consecutive windows merged into
        windows that long (``window`` then counts spans), as they are read, so memory
        holds the merged ones only (a 72 h run: 1/5 of its 60 s windows at 300 s)."""
        window_ns = self.window_ns
        per = max(1, (span_ns or window_ns) // window_ns)
        unfolded: dict[tuple[str, str, int], Rollup] = {}
        last = self.conn.execute(
            "SELECT rollup_from_id, stopped FROM progress ORDER BY session DESC LIMIT 1"
        ).fetchone()
        if last is not None and not last[1]:  # not cleanly closed (or still running)
            for key, (stats, wmin, wmax, _) in unfolded_rollups(
                self.conn, last[0], window_ns
            ).items():
                unfolded[key] = Rollup(*key, wmin, wmax, stats)
        found: dict[tuple[str, str, int], Rollup] = {}

        def add(r: Rollup) -> None:
            key = (r.target, r.phase, r.window // per)
            have = found.get(key)
            if have is None:
                found[key] = Rollup(*key, r.wall_min, r.wall_max, r.stats)
                return
            have.stats.merge(r.stats)
            have.wall_min = min(have.wall_min, r.wall_min)
            have.wall_max = max(have.wall_max, r.wall_max)

        for target, phase, window, wmin, wmax, blob in self.conn.execute(
            "SELECT target, phase, window, wall_min, wall_max, stats FROM rollups"
        ):
            if (target, phase, window) not in unfolded:  # that one holds it, and more
                add(Rollup(target, phase, window, wmin, wmax, self._stats(blob, window)))
        for r in unfolded.values():
            add(r)
        return sorted(found.values(), key=lambda r: (r.window, r.target, r.phase))

    def _stats(self, blob: bytes, window: int) -> TargetStats:
        """A window's stats; JournalDamaged when its blob does not decode (a damaged page
        whose structure still checks out)."""
        try:
            return stats_from_blob(blob)
        except (ValueError, TypeError, KeyError, zlib.error) as exc:
            raise damaged_error(
                self.path, {"rollups": f"window {window} does not decode: {exc}"}
            ) from None

    def series(self) -> dict[int, tuple[str, dict[str, str]]]:
        return {
            sid: (name, dict(json.loads(labels)))
            for sid, name, labels in self.conn.execute("SELECT id, name, labels FROM series")
        }

    def samples(self, names: tuple[str, ...]) -> dict[int, list[tuple[float, float]]]:
        """Readings of the series with these names, by series id, in time order."""
        ids = [sid for sid, (name, _) in self.series().items() if name in names]
        out: dict[int, list[tuple[float, float]]] = {sid: [] for sid in ids}
        if not ids:
            return out
        marks = ",".join("?" * len(ids))
        for sid, wall, value in self.conn.execute(
            f"SELECT series, wall, value FROM samples WHERE series IN ({marks}) ORDER BY rowid",  # noqa: S608
            ids,
        ):
            out[sid].append((wall, value))
        return out

    @property
    def version(self) -> int:
        """The journal's schema version (``PRAGMA user_version``)."""
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def request_rows(self, *, itl: bool = True) -> Iterator[sqlite3.Row]:
        """Every request row, streamed (constant memory), in commit order; any schema
        version reads the same columns (``itl_hist`` NULL before v3). ITL gaps of a row:
        ``codec.row_itl_ns``."""
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        cols = request_columns(self.version, itl=itl)
        cur.execute(f"SELECT {cols} FROM requests ORDER BY id")  # noqa: S608
        while True:
            chunk = cur.fetchmany(1000)
            if not chunk:
                return
            yield from chunk
