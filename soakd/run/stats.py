"""Stats: the in-memory counts behind the live view, /status and the summary.

Fed the journal's committed folds (soakd/measure/fold.py: each outcome folded once, by the writer),
so it lags the requests by at most one flush, as the metrics do. Bounded memory: per
target a whole-run TargetStats, one per phase, and a 60 s window.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from soakd.measure.analysis import SessionRow, SummaryRow, TargetStats, Window, summary_row
from soakd.measure.fold import Fold
from soakd.measure.goodput import guard_refusal


class RunStats:
    """Totals per target and per (target, phase), plus a recent window: a FoldSink."""

    def __init__(self, targets: list[str], window_s: int = 60) -> None:
        self.targets = targets
        self.by_phase: dict[tuple[str, str], TargetStats] = {}
        self.window = {t: Window(window_s) for t in targets}
        self.started = time.monotonic()

    def apply(self, f: Fold) -> None:
        """A batch's fold: merged into its phases' stats and into this second's window."""
        now = int(time.monotonic())
        for key, stats in f.by_phase().items():
            have = self.by_phase.get(key)
            if have is None:
                self.by_phase[key] = have = TargetStats()
            have.merge(stats)
            window = self.window.get(key[0])
            if window is not None:
                window.add_stats(stats, now)

    @property
    def total(self) -> dict[str, TargetStats]:
        """Per target, the whole session: its phases merged (read rarely, so an outcome is
        added to two stats, its phase's and the window's, not three)."""
        out = {t: TargetStats() for t in self.targets}
        for (target, _), stats in list(self.by_phase.items()):
            out[target].merge(stats)
        return out

    def recent(self) -> dict[str, SummaryRow]:
        """Per target: rates and percentiles over the last window."""
        now = int(time.monotonic())
        rows: dict[str, SummaryRow] = {}
        for target in self.targets:
            stats, seconds = self.window[target].snapshot(now)
            rows[target] = summary_row(stats, seconds)
        return rows

    def overall(
        self, seconds: float | None = None, missed: Mapping[str, Mapping[str, int]] | None = None
    ) -> dict[str, SessionRow]:
        """Per target: whole-session numbers, errors by kind, and what was offered against
        sent (``missed``: sends not made by reason). Rates are over ``seconds``: the active
        plan time (sending), not the process's life."""
        seconds = seconds if seconds is not None else time.monotonic() - self.started
        rows: dict[str, SessionRow] = {}
        total = self.total
        for target in self.targets:
            stats = total[target]
            not_made = dict((missed or {}).get(target, {}))
            # goodput and goodput_rps: added once the run is over (app.py)
            rows[target] = {
                **summary_row(stats, seconds),  # type: ignore[typeddict-item]
                "offered": stats.requests + sum(not_made.values()),
                "missed": sum(not_made.values()),
                "missed_by_reason": not_made,
                "shed": sum(n for k, n in stats.errors.items() if guard_refusal(k)),
                "errors_by_kind": dict(stats.errors),
            }
        return rows
