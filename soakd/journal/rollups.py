"""Journal rollups room: what the writer keeps beside the rows, and how.

Each batch's outcomes are folded once (``soakd.measure.fold.Fold``): the totals Prometheus'
counters restart from (and each target's notes, soakd/measure/notes.py), the latency histograms'
bucket counts, and the ``TargetStats`` of each (target, phase, window) the batch's
requests completed in. ``Aggregates`` holds the
running values on the writer thread; it writes a batch's share inside the batch's
transaction and moves on only after the commit (``committed``), so a failed transaction is
retried from the same state. Windows are stored once they are over (two windows back: late
requests still land); ``unfolded_rollups`` rebuilds what a killed writer committed as rows
but never rolled up.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from soakd.journal.codec import copy_stats, outcome_from_row, stats_from_blob, stats_to_blob
from soakd.journal.schema import request_columns
from soakd.measure.analysis import TargetStats
from soakd.measure.fold import Fold, Hist, HistKey, TotalsKey, Window, WindowKey, add_hist
from soakd.measure.notes import NoteKey
from soakd.model import Plan

__all__ = ["Aggregates", "Staged", "rollup_window_ns", "store_window", "unfolded_rollups"]


def rollup_window_ns(plan: Plan) -> int:
    """The journal's aggregation window: 1 s for a short run, up to 60 s (72 h -> 4320
    windows), so a report has ~1000 points of history whatever the run's length."""
    seconds = min(60, max(1, round(plan.duration_ns / 1e9 / 1000)))
    return seconds * 1_000_000_000


@dataclass(slots=True)
class Staged:
    """A batch's aggregates, written in its transaction and applied after the commit."""

    totals: dict[TotalsKey, list[int]]
    hists: dict[HistKey, Hist]
    notes: dict[NoteKey, int]
    windows: dict[WindowKey, Window]
    stored: set[WindowKey]
    last_id: int

    def rollup_from_id(self, next_id: int) -> int:
        """The first row id not in a stored window (where a repair starts)."""
        return min(
            (w.first_id for k, w in self.windows.items() if w.first_id and k not in self.stored),
            default=next_id,
        )


class Aggregates:
    """The writer thread's running totals, histogram buckets and open windows."""

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self.totals: dict[TotalsKey, list[int]] = {}
        self.hists: dict[HistKey, Hist] = {}
        self.windows: dict[WindowKey, Window] = {}
        self.notes: dict[NoteKey, int] = {}

    def load(self, conn: sqlite3.Connection) -> list[tuple[str, str, str, str, int, int, int, int]]:
        """Read the stored totals, notes and histograms; returns the totals as rows."""
        totals = []
        for row in conn.execute("SELECT * FROM totals"):
            self.totals[(row[0], row[1], row[2], row[3])] = [row[4], row[5], row[6], row[7]]
            totals.append((row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7]))
        for kind, target, counts, total in conn.execute("SELECT * FROM histograms"):
            self.hists[(kind, target)] = (json.loads(counts), total)
        for target, note, n in conn.execute("SELECT target, note, count FROM notes"):
            self.notes[(target, note)] = n
        return totals

    def write(
        self,
        conn: sqlite3.Connection,
        folds: tuple[Fold, ...],
        last_id: int,
        now_window: int,
        final: bool,
    ) -> Staged:
        """Inside the batch's transaction: what ``folds`` add to the totals (requests only
        tallied included), the histogram buckets and the windows, and the windows that are
        over (every one with news when ``final``)."""
        new_totals: dict[TotalsKey, list[int]] = {}
        for part in folds:
            for key, d in part.totals.items():
                base = new_totals.get(key) or self.totals.get(key, [0, 0, 0, 0])
                new_totals[key] = [a + b for a, b in zip(base, d, strict=True)]
        if new_totals:
            conn.executemany(
                "INSERT OR REPLACE INTO totals VALUES (?,?,?,?,?,?,?,?)",
                [(*key, *t) for key, t in new_totals.items()],
            )
        new_notes: dict[NoteKey, int] = {}
        for part in folds:
            for nkey, n in part.notes.items():
                new_notes[nkey] = new_notes.get(nkey, self.notes.get(nkey, 0)) + n
        if new_notes:
            conn.executemany(
                "INSERT OR REPLACE INTO notes VALUES (?,?,?)",
                [(*k, n) for k, n in new_notes.items()],
            )
        new_hists: dict[HistKey, Hist] = {}
        for part in folds:
            for hkey, b in part.hists.items():
                sofar = new_hists.get(hkey) or self.hists.get(hkey)
                new_hists[hkey] = add_hist(sofar, b.counts, b.total)
        for hkey, (counts, total) in new_hists.items():
            conn.execute(
                "INSERT OR REPLACE INTO histograms VALUES (?,?,?,?)",
                (*hkey, json.dumps(counts), total),
            )
        staged: dict[WindowKey, Window] = {}
        for part in folds:
            for wkey, dwin in part.windows.items():
                have = staged.get(wkey)
                if have is None:
                    win = self.windows.get(wkey) or self._load_window(conn, wkey)
                    if win is None:
                        have = Window(TargetStats(), dwin.wall_min, dwin.wall_max)
                    else:
                        have = Window(copy_stats(win.stats), win.wall_min, win.wall_max)
                        have.upto_id, have.first_id, have.dirty = win.upto_id, win.first_id, False
                    staged[wkey] = have
                have.merge(dwin)
        for wkey, win in self.windows.items():
            if win.dirty and wkey not in staged:
                staged[wkey] = win
        stored = set()
        for wkey, win in staged.items():
            if win.dirty and (final or wkey[2] <= now_window - 2):
                store_window(conn, wkey, win.stats, win.wall_min, win.wall_max, last_id)
                stored.add(wkey)
        return Staged(new_totals, new_hists, new_notes, staged, stored, last_id)

    def committed(self, staged: Staged, now_window: int) -> None:
        """The transaction committed: the running values move on."""
        self.totals.update(staged.totals)
        self.hists.update(staged.hists)
        self.notes.update(staged.notes)
        for wkey, win in staged.windows.items():
            if wkey in staged.stored:
                win.upto_id, win.first_id, win.dirty = staged.last_id, 0, False
            self.windows[wkey] = win
        for wkey in [k for k, w in self.windows.items() if not w.dirty and k[2] < now_window - 3]:
            del self.windows[wkey]  # stored and quiet: the database has it

    def _load_window(self, conn: sqlite3.Connection, key: WindowKey) -> Window | None:
        row = conn.execute(
            "SELECT upto_id, wall_min, wall_max, stats FROM rollups "
            "WHERE target = ? AND phase = ? AND window = ?",
            key,
        ).fetchone()
        if row is None:
            return None
        return Window(stats_from_blob(row[3]), row[1], row[2], row[0], 0, dirty=False)


def store_window(
    conn: sqlite3.Connection,
    key: WindowKey,
    stats: TargetStats,
    wall_min: float,
    wall_max: float,
    upto_id: int,
) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO rollups VALUES (?,?,?,?,?,?,?)",
        (*key, upto_id, wall_min, wall_max, stats_to_blob(stats)),
    )


def unfolded_rollups(
    conn: sqlite3.Connection, from_id: int, window_ns: int
) -> dict[WindowKey, tuple[TargetStats, float, float, int]]:
    """Windows holding rows that are not in their stored rollup (a killed writer's last
    windows): stored stats plus the missing rows, with the wall range and last id."""
    conn.row_factory = sqlite3.Row
    try:
        out: dict[WindowKey, tuple[TargetStats, float, float, int]] = {}
        upto: dict[WindowKey, int] = {}
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for row in conn.execute(
            f"SELECT {request_columns(version)} FROM requests WHERE id >= ? ORDER BY id",  # noqa: S608
            (from_id,),
        ):
            key = (row["target"], row["phase"], row["end_ns"] // window_ns)
            if key not in upto:
                stored = conn.execute(
                    "SELECT upto_id, wall_min, wall_max, stats FROM rollups "
                    "WHERE target = ? AND phase = ? AND window = ?",
                    key,
                ).fetchone()
                upto[key] = stored[0] if stored is not None else 0
                if stored is not None:
                    out[key] = (stats_from_blob(stored[3]), stored[1], stored[2], stored[0])
            if row["id"] <= upto[key]:
                continue
            stats, wmin, wmax, _ = out.get(key) or (TargetStats(), row["wall"], row["wall"], 0)
            stats.add(outcome_from_row(row))
            out[key] = (stats, min(wmin, row["wall"]), max(wmax, row["wall"]), row["id"])
        return {k: v for k, v in out.items() if v[3] > upto[k]}
    finally:
        conn.row_factory = None
