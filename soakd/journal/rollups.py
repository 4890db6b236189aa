"""Journal rollups room: what the writer aggregates beside the rows, and how.

Per batch, ``Deltas`` collects the totals Prometheus' counters restart from (and each
target's notes, soakd/notes.py), the latency histograms' bucket counts, and the
``TargetStats`` of each (target, phase, window) the batch's requests completed in.
``Aggregates`` holds the running values on the writer thread; it writes a batch's share
inside the batch's transaction and moves on only after the commit (``committed``), so a
failed transaction is retried from the same state.
Windows are stored once they are over (two windows back: late requests still land);
``unfolded_rollups`` rebuilds what a killed writer committed as rows but never rolled up.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from soakd.analysis import TargetStats
from soakd.buckets import Hist, add_hist, observe
from soakd.journal.codec import copy_stats, outcome_from_row, stats_from_blob, stats_to_blob
from soakd.journal.schema import request_columns
from soakd.metrics import HISTOGRAM_BUCKETS
from soakd.model import S_PER_NS, Outcome, Plan, status_class
from soakd.notes import notes_of

TotalsKey = tuple[str, str, str, str]
"""(target, phase, outcome, status class): one row of ``totals``."""
HistKey = tuple[str, str]
"""(kind, target): one row of ``histograms``; kind is a key of ``HISTOGRAM_BUCKETS``."""
WindowKey = tuple[str, str, int]
"""(target, phase, window index): one row of ``rollups``."""
NoteKey = tuple[str, str]
"""(target, note): one row of ``notes``."""


def rollup_window_ns(plan: Plan) -> int:
    """The journal's aggregation window: 1 s for a short run, up to 60 s (72 h -> 4320
    windows), so a report has ~1000 points of history whatever the run's length."""
    seconds = min(60, max(1, round(plan.duration_ns / 1e9 / 1000)))
    return seconds * 1_000_000_000


@dataclass(slots=True)
class Window:
    """One rollup (target, phase, window) the writer holds in memory."""

    stats: TargetStats
    wall_min: float
    wall_max: float
    upto_id: int = 0  # rows of this window with id <= upto_id are in its stored row
    first_id: int = 0  # the first row not in the stored row yet (0: nothing unstored)


@dataclass(slots=True)
class Deltas:
    """What one batch adds to the aggregates."""

    totals: dict[TotalsKey, list[int]] = field(default_factory=dict)
    hists: dict[HistKey, Hist] = field(default_factory=dict)
    windows: dict[WindowKey, Window] = field(default_factory=dict)
    notes: dict[NoteKey, int] = field(default_factory=dict)

    def add(self, o: Outcome, row: tuple[Any, ...], ordered: list[int], window_ns: int) -> None:
        """Count one outcome, stored as ``row`` (``codec.outcome_row``, with its sorted gaps)."""
        rid, end_ns, ttft, tpot = row[0], row[8], row[10], row[12]
        # totals, as Metrics counts them
        tkey = (o.target, o.phase, o.outcome, status_class(o.status))
        t = self.totals.get(tkey)
        if t is None:
            t = self.totals[tkey] = [0, 0, 0, 0]
        t[0] += 1
        t[1] += o.output_tokens
        t[2] += o.prompt_tokens or 0
        t[3] += o.oom
        if o.usage_rejected or o.usage_mismatch or o.retry_after_unreadable:
            add_notes(self.notes, o)
        # histogram buckets, as Metrics observes them
        hists = self.hists
        if o.sent_ns:
            _observe(hists, "lag", o.target, [o.dispatch_lag_ns * S_PER_NS])
        if o.error is None:
            _observe(hists, "e2e", o.target, [o.e2e_ns * S_PER_NS])
            if ttft is not None:
                _observe(hists, "ttft", o.target, [ttft * S_PER_NS])
            if tpot is not None:
                _observe(hists, "tpot", o.target, [tpot * S_PER_NS])
            if ordered:
                _observe(hists, "itl", o.target, [g * S_PER_NS for g in ordered])
        # the rollup window it completed in
        wkey = (o.target, o.phase, end_ns // window_ns)
        win = self.windows.get(wkey)
        if win is None:
            win = self.windows[wkey] = Window(
                TargetStats(), o.wall_start, o.wall_start, first_id=rid
            )
        win.stats.add(o)
        win.wall_min = min(win.wall_min, o.wall_start)
        win.wall_max = max(win.wall_max, o.wall_start)


def add_notes(notes: dict[NoteKey, int], o: Outcome) -> None:
    """Count the notes of ``o`` into ``notes``."""
    for note in notes_of(o):
        key = (o.target, note)
        notes[key] = notes.get(key, 0) + 1


@dataclass(slots=True)
class Staged:
    """A batch's aggregates, written in its transaction and applied after the commit."""

    deltas: Deltas
    totals: dict[TotalsKey, list[int]]
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
        deltas: Deltas,
        dropped: dict[TotalsKey, tuple[int, int, int, int]],
        last_id: int,
        now_window: int,
        final: bool,
        dropped_notes: dict[NoteKey, int] | None = None,
    ) -> Staged:
        """Inside the batch's transaction: totals and notes (dropped outcomes too: Metrics
        counted them), histogram buckets, and the windows that are over (all of them when
        final)."""
        new_totals: dict[TotalsKey, list[int]] = {}
        for key, d in deltas.totals.items():
            base = self.totals.get(key, [0, 0, 0, 0])
            new_totals[key] = [a + b for a, b in zip(base, d, strict=True)]
        for key in set(new_totals) | set(dropped):
            total = new_totals.get(key) or self.totals.get(key, [0, 0, 0, 0])
            extra = dropped.get(key, (0, 0, 0, 0))
            conn.execute(
                "INSERT OR REPLACE INTO totals VALUES (?,?,?,?,?,?,?,?)",
                (*key, *(a + b for a, b in zip(total, extra, strict=True))),
            )
        new_notes = {k: self.notes.get(k, 0) + n for k, n in deltas.notes.items()}
        dropped_notes = dropped_notes or {}
        for nkey in set(new_notes) | set(dropped_notes):
            n = new_notes.get(nkey, self.notes.get(nkey, 0)) + dropped_notes.get(nkey, 0)
            conn.execute("INSERT OR REPLACE INTO notes VALUES (?,?,?)", (*nkey, n))
        for hkey, (counts, total_s) in deltas.hists.items():
            merged = add_hist(self.hists.get(hkey), counts, total_s)
            conn.execute(
                "INSERT OR REPLACE INTO histograms VALUES (?,?,?,?)",
                (*hkey, json.dumps(merged[0]), merged[1]),
            )
        staged: dict[WindowKey, Window] = {}
        for wkey, dwin in deltas.windows.items():
            win = self.windows.get(wkey) or self._load_window(conn, wkey)
            if win is None:
                staged[wkey] = dwin
                continue
            stats = copy_stats(win.stats)
            stats.merge(dwin.stats)
            staged[wkey] = Window(
                stats,
                min(win.wall_min, dwin.wall_min),
                max(win.wall_max, dwin.wall_max),
                win.upto_id,
                win.first_id or dwin.first_id,
            )
        for wkey, win in self.windows.items():
            if win.first_id and wkey not in staged:
                staged[wkey] = Window(
                    win.stats, win.wall_min, win.wall_max, win.upto_id, win.first_id
                )
        stored = set()
        for wkey, win in staged.items():
            if win.first_id and (final or wkey[2] <= now_window - 2):
                store_window(conn, wkey, win.stats, win.wall_min, win.wall_max, last_id)
                stored.add(wkey)
        return Staged(deltas, new_totals, new_notes, staged, stored, last_id)

    def committed(self, staged: Staged, now_window: int) -> None:
        """The transaction committed: the running values move on."""
        self.totals.update(staged.totals)
        self.notes.update(staged.notes)
        for hkey, (counts, total) in staged.deltas.hists.items():
            self.hists[hkey] = add_hist(self.hists.get(hkey), counts, total)
        for wkey, win in staged.windows.items():
            if wkey in staged.stored:
                win.upto_id, win.first_id = staged.last_id, 0
            self.windows[wkey] = win
        for wkey in [
            k for k, w in self.windows.items() if not w.first_id and k[2] < now_window - 3
        ]:
            del self.windows[wkey]  # stored and quiet: the database has it

    def _load_window(self, conn: sqlite3.Connection, key: WindowKey) -> Window | None:
        row = conn.execute(
            "SELECT upto_id, wall_min, wall_max, stats FROM rollups "
            "WHERE target = ? AND phase = ? AND window = ?",
            key,
        ).fetchone()
        if row is None:
            return None
        return Window(stats_from_blob(row[3]), row[1], row[2], row[0], 0)


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


def _observe(hists: dict[HistKey, Hist], kind: str, target: str, values: list[float]) -> None:
    observe(hists, (kind, target), HISTOGRAM_BUCKETS[kind], values)


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
