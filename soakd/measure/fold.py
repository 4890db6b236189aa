"""Fold room: an outcome folded once into everything soakd counts of it. Pure: no IO.

The journal's writer folds each outcome it gets into a ``Fold`` (one per batch): the totals
Prometheus' counters and the ``totals`` table count, the latency histograms' bucket counts,
one exemplar candidate per histogram bucket, and the ``TargetStats`` of the rollup window
the request ended in. After the batch's commit the same ``Fold`` is what ``Metrics`` and
``RunStats`` apply (``Metrics.apply``, ``RunStats.apply``), once per batch, instead of each
folding every outcome again (docs/architecture.md, "Fold each outcome once").

A request whose row the journal could not take (its queue was full) is only *tallied*
(``Fold.tally``): counted in the totals and the run's counts, kept out of the histograms,
the exemplars and the rollups, as the journal's own histograms never had it.

The histogram buckets are here, not in ``metrics.py``: the journal's writer counts them and
must not import prometheus_client to do it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from soakd.measure.analysis import TargetStats
from soakd.measure.breakdown import context_of, turn_key
from soakd.measure.notes import NoteKey, count_notes
from soakd.model import OK, S_PER_NS, Outcome, status_class

# Buckets in seconds, chosen for LLM serving: a TTFT from 5 ms (a warm GPU, short prompt)
# to a minute (a queue on a 4 GB card); an E2E of up to 10 minutes (long generations).
# fmt: off
TTFT_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0,
    3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)
E2E_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0,
    60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)
LAG_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)
# fmt: on
HISTOGRAM_BUCKETS = {
    "e2e": E2E_BUCKETS,
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "tpot": ITL_BUCKETS,
    "lag": LAG_BUCKETS,
}
"""Per-target latency histogram -> its bounds: ``Metrics`` exports them, the journal keeps
the same bucket counts, so a resumed run continues the histograms exactly."""
EXEMPLAR_KINDS = ("e2e", "ttft")
"""The histograms whose buckets carry a request's trace id (docs/tracing.md)."""

TotalsKey = tuple[str, str, str, str]
"""(target, phase, outcome, status class): one row of the journal's ``totals``."""
HistKey = tuple[str, str]
"""(kind, target): one row of ``histograms``; kind is a key of ``HISTOGRAM_BUCKETS``."""
SplitKey = tuple[str, str, str]
"""(by, target, key): a TTFT histogram broken down ``by`` "context" (the key: a context
bucket) or "turn" (a turn key): soakd/measure/breakdown.py. Not journaled: after a resume
these start again at 0 (docs/metrics.md)."""

WindowKey = tuple[str, str, int]
"""(target, phase, window index): one row of ``rollups``."""
Hist = tuple[list[int], float]
"""Count per bucket (not cumulative; +Inf last) and the sum of the observed values."""
Candidate = tuple[int, float, int]
"""An exemplar candidate: the request's seq, its value (s) and its end (monotonic ns)."""


def count_sorted(counts: list[int], bounds: Sequence[float], values: Sequence[float]) -> None:
    """Add sorted ``values`` to per-bucket ``counts`` (+Inf last): one bisect a bucket, each
    value in the first bucket whose bound is >= it, as prometheus_client counts."""
    below = 0
    for i, bound in enumerate(bounds):
        upto = bisect.bisect_right(values, bound, below)
        counts[i] += upto - below
        below = upto
    counts[-1] += len(values) - below


def add_hist(base: Hist | None, counts: Sequence[int], total: float) -> Hist:
    """``base`` plus more counts and sum (a new value; ``base`` is not changed)."""
    if base is None:
        return list(counts), total
    return [a + b for a, b in zip(base[0], counts, strict=True)], base[1] + total


class Buckets:
    """One histogram's counts being folded: per bucket (+Inf last) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def add(self, value: float) -> int:
        """Count one value; returns its bucket (the first bound >= it)."""
        i = bisect.bisect_left(self.bounds, value)
        self.counts[i] += 1
        self.total += value
        return i

    def add_sorted(self, values: Sequence[float]) -> None:
        count_sorted(self.counts, self.bounds, values)
        self.total += sum(values)

    def hist(self) -> Hist:
        return list(self.counts), self.total


@dataclass(slots=True)
class Window:
    """One rollup (target, phase, window): its stats and wall range. ``dirty``: it holds
    requests not in its stored row yet; ``first_id``: the first of their rows (0: none
    with a row), where a repair after a crash starts; ``upto_id``: rows up to it are in the
    stored row."""

    stats: TargetStats
    wall_min: float
    wall_max: float
    upto_id: int = 0
    first_id: int = 0
    dirty: bool = True

    def merge(self, other: Window) -> None:
        self.stats.merge(other.stats)
        self.wall_min = min(self.wall_min, other.wall_min)
        self.wall_max = max(self.wall_max, other.wall_max)
        if other.first_id and (not self.first_id or other.first_id < self.first_id):
            self.first_id = other.first_id
        self.dirty = self.dirty or other.dirty


@dataclass(slots=True)
class Fold:
    """What a batch of outcomes adds to every count of the run (see the module's doc)."""

    totals: dict[TotalsKey, list[int]] = field(default_factory=dict)
    """[requests, output tokens, prompt tokens, OOM responses] per key."""
    hists: dict[HistKey, Buckets] = field(default_factory=dict)
    exemplars: dict[HistKey, dict[int, Candidate]] = field(default_factory=dict)
    """(kind, target) -> bucket -> the first successful request of the batch in it."""
    windows: dict[WindowKey, Window] = field(default_factory=dict)
    tallied: dict[tuple[str, str], TargetStats] = field(default_factory=dict)
    """(target, phase) -> the counts (no digests) of the requests only tallied."""
    notes: dict[NoteKey, int] = field(default_factory=dict)
    """(target, note) -> answers that carried it (soakd/measure/notes.py)."""
    phases: dict[tuple[str, str], TargetStats] | None = None
    """``by_phase`` as the writer process sent it (``from_doc``: no windows travel)."""
    split: dict[SplitKey, Buckets] = field(default_factory=dict)
    """TTFT by context length and by turn (``SplitKey``), successful requests only."""

    def __bool__(self) -> bool:
        return bool(self.totals or self.notes)

    @property
    def requests(self) -> int:
        return sum(t[0] for t in self.totals.values())

    def add(
        self, o: Outcome, rid: int, end_ns: int, window_ns: int, gaps: Sequence[int] = ()
    ) -> None:
        """Fold one outcome: ``end_ns`` its end on the plan clock (the window it ended
        in), ``rid`` its row id (0: no row), ``gaps`` its ITL gaps sorted (ns)."""
        self._count(o)
        target, sent = o.target, o.sent_ns
        if sent:
            self._observe("lag", target, o.dispatch_lag_ns * S_PER_NS)
        if o.error is None:
            end = o.end_ns
            e2e = (end - sent) * S_PER_NS
            at = self._observe("e2e", target, e2e)
            self._candidate("e2e", target, at, o.seq, e2e, end)
            first = o.first_token_ns
            if first is not None:
                ttft = (first - sent) * S_PER_NS
                at = self._observe("ttft", target, ttft)
                self._candidate("ttft", target, at, o.seq, ttft, end)
                self._split(o, ttft)
            tpot = o.tpot_ns
            if tpot is not None:
                self._observe("tpot", target, tpot * S_PER_NS)
            if gaps:
                self._buckets("itl", target).add_sorted([g * S_PER_NS for g in gaps])
        wkey = (target, o.phase, end_ns // window_ns)
        win = self.windows.get(wkey)
        wall = o.wall_start
        if win is None:
            win = self.windows[wkey] = Window(TargetStats(), wall, wall, first_id=rid)
        else:
            if wall < win.wall_min:
                win.wall_min = wall
            if wall > win.wall_max:
                win.wall_max = wall
            if rid and not win.first_id:
                win.first_id = rid
        win.stats.add(o)

    def tally(self, o: Outcome) -> None:
        """Count ``o`` without folding its latencies: the totals and the run's counts."""
        self._count(o)
        key = (o.target, o.phase)
        stats = self.tallied.get(key)
        if stats is None:
            stats = self.tallied[key] = TargetStats()
        stats.requests += 1
        stats.output_tokens += o.output_tokens or 0  # None: unknown, not counted
        stats.prompt_tokens += o.prompt_tokens or 0
        if o.error is None:
            stats.ok += 1
        else:
            stats.errors[o.error.value] += 1

    def merge(self, other: Fold) -> None:
        """Add ``other`` (a later batch) to this one (folds made here: not ``from_doc``'s)."""
        for key, t in other.totals.items():
            mine = self.totals.get(key)
            if mine is None:
                self.totals[key] = list(t)
            else:
                for i, v in enumerate(t):
                    mine[i] += v
        for hkey, b in other.hists.items():
            have = self.hists.get(hkey)
            if have is None:
                have = self.hists[hkey] = Buckets(b.bounds)
            for i, n in enumerate(b.counts):
                have.counts[i] += n
            have.total += b.total
        for skey, b in other.split.items():
            have = self.split.get(skey)
            if have is None:
                have = self.split[skey] = Buckets(b.bounds)
            for i, n in enumerate(b.counts):
                have.counts[i] += n
            have.total += b.total
        for hkey, cands in other.exemplars.items():
            mine_c = self.exemplars.setdefault(hkey, {})
            for i, cand in cands.items():
                mine_c.setdefault(i, cand)
        for wkey, win in other.windows.items():
            have_w = self.windows.get(wkey)
            if have_w is None:
                self.windows[wkey] = Window(
                    _copy(win.stats), win.wall_min, win.wall_max, win.upto_id, win.first_id
                )
            else:
                have_w.merge(win)
        for pkey, stats in other.tallied.items():
            self.tallied.setdefault(pkey, TargetStats()).merge(stats)
        for nkey, n in other.notes.items():
            self.notes[nkey] = self.notes.get(nkey, 0) + n

    def by_phase(self) -> dict[tuple[str, str], TargetStats]:
        """Per (target, phase): the batch's stats (windows and tallies merged; new objects)."""
        if self.phases is not None:
            return self.phases
        out: dict[tuple[str, str], TargetStats] = {}
        for (target, phase, _), win in self.windows.items():
            out.setdefault((target, phase), TargetStats()).merge(win.stats)
        for key, stats in self.tallied.items():
            out.setdefault(key, TargetStats()).merge(stats)
        return out

    def hist_counts(self) -> dict[HistKey, Hist]:
        return {key: b.hist() for key, b in self.hists.items()}

    def to_doc(self) -> dict[str, list[list[object]]]:
        """What ``Metrics`` and ``RunStats`` apply, as JSON (the writer process sends it):
        totals, buckets, exemplar candidates and ``by_phase``; the windows stay behind."""
        return {
            "totals": [[*k, *v] for k, v in self.totals.items()],
            "hists": [[*k, b.counts, b.total] for k, b in self.hists.items()],
            "exemplars": [
                [*k, bucket, *cand]
                for k, cands in self.exemplars.items()
                for bucket, cand in cands.items()
            ],
            "phases": [[*k, stats.to_state()] for k, stats in self.by_phase().items()],
            "notes": [[*k, n] for k, n in self.notes.items()],
            "split": [[*k, b.counts, b.total] for k, b in self.split.items()],
        }

    @classmethod
    def from_doc(cls, doc: dict[str, list[list[Any]]]) -> Fold:
        f = cls(phases={})
        for target, phase, outcome, sclass, *counts in doc["totals"]:
            f.totals[(target, phase, outcome, sclass)] = [int(n) for n in counts]
        for kind, target, counts, total in doc["hists"]:
            b = f.hists[(kind, target)] = Buckets(HISTOGRAM_BUCKETS[kind])
            b.counts, b.total = [int(n) for n in counts], float(total)
        for kind, target, bucket, seq, value, end in doc["exemplars"]:
            f.exemplars.setdefault((kind, target), {})[int(bucket)] = (int(seq), value, int(end))
        assert f.phases is not None
        for target, phase, state in doc["phases"]:
            f.phases[(target, phase)] = TargetStats.from_state(state)
        for target, note, n in doc.get("notes", ()):
            f.notes[(target, note)] = int(n)
        for by, target, key, counts, total in doc.get("split", ()):
            b = f.split[(by, target, key)] = Buckets(TTFT_BUCKETS)
            b.counts, b.total = [int(n) for n in counts], float(total)
        return f

    def _count(self, o: Outcome) -> None:
        error = o.error
        key = (o.target, o.phase, OK if error is None else error.value, _class(o.status))
        t = self.totals.get(key)
        if t is None:
            t = self.totals[key] = [0, 0, 0, 0]
        t[0] += 1
        t[1] += o.output_tokens or 0  # None: unknown, not counted
        t[2] += o.prompt_tokens or 0
        t[3] += o.oom
        count_notes(o, self.notes)

    def _buckets(self, kind: str, target: str) -> Buckets:
        key = (kind, target)
        b = self.hists.get(key)
        if b is None:
            b = self.hists[key] = Buckets(HISTOGRAM_BUCKETS[kind])
        return b

    def _observe(self, kind: str, target: str, value: float) -> int:
        return self._buckets(kind, target).add(value)

    def _split(self, o: Outcome, ttft: float) -> None:
        """``ttft`` (s) into the request's context-length and turn histograms."""
        context = context_of(o.prompt_tokens)
        if context is not None:
            self._split_buckets(("context", o.target, context)).add(ttft)
        if o.conversation >= 0:
            self._split_buckets(("turn", o.target, turn_key(o.turn))).add(ttft)

    def _split_buckets(self, key: SplitKey) -> Buckets:
        b = self.split.get(key)
        if b is None:
            b = self.split[key] = Buckets(TTFT_BUCKETS)
        return b

    def _candidate(self, kind: str, target: str, at: int, seq: int, value: float, end: int) -> None:
        key = (kind, target)
        cands = self.exemplars.get(key)
        if cands is None:
            cands = self.exemplars[key] = {}
        if at not in cands:
            cands[at] = (seq, value, end)


def fold(outcomes: Iterable[Outcome], window_ns: int = 1_000_000_000) -> Fold:
    """The fold of ``outcomes`` on their own clock (no rows): what ``Metrics`` and
    ``RunStats`` apply; tests and callers outside the journal."""
    f = Fold()
    for o in outcomes:
        f.add(o, 0, o.end_ns, window_ns, sorted(o.itl_ns))
    return f


_CLASSES: dict[int, str] = {}


def _class(status: int) -> str:
    name = _CLASSES.get(status)
    if name is None:
        name = _CLASSES[status] = status_class(status)
    return name


def _copy(stats: TargetStats) -> TargetStats:
    out = TargetStats()
    out.merge(stats)
    return out
