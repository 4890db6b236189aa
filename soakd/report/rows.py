"""Report room, rows: each target's row over the run and per phase, as values.

A row is put together from parts that each come from a function of their own inputs,
none of which reads what another wrote: the requests (the journal's rollups, totals and
sends not made: ``request_rows``), the probes (``probe_counts``, ``samples.vram``), the
energy and the money (``energy_and_cost``, from the request rows), then the goodput
(decisions.py, from the rows so far). ``measured`` and ``with_goodput`` make each new row
with ``dataclasses.replace``; nothing is filled in place, so no step depends on the order
another ran in (``build_report`` used to fill one row in six passes: ``offered`` needed
``missed`` written first, ``best()`` the goodput ``_verdicts`` wrote).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from soakd.config import TargetCost
from soakd.journal import Rollup
from soakd.journal.reader import Total
from soakd.measure.analysis import (
    JITTER_SLICES,
    GpuEnergy,
    Quantiles,
    TargetStats,
    energy_share,
    ms,
    slice_p99,
    worst_window_jitter,
)
from soakd.measure.cost import cost_line
from soakd.measure.goodput import error_counts
from soakd.report import names
from soakd.report.model import LATENCY_KINDS, GpuRow, Row
from soakd.report.samples import Samples, Vram

JOULES_PER_KWH = 3.6e6
REHEARSAL_NOTE = "a rehearsal: not projected"

Key = tuple[str, str | None]
"""A row's place: (target, phase); phase None: the whole run."""


@dataclass(frozen=True)
class Frame:
    """The plan time the rows cover: targets, phases, their active seconds, the slices."""

    targets: list[str]
    phases: list[str]
    active_s: float
    phase_active: dict[str, float]
    slice_s: float
    window_s: float


@dataclass(frozen=True)
class Rows:
    """Every row: per target over the run, and per phase then target (the report's order)."""

    overall: dict[str, Row]
    by_phase: dict[str, dict[str, Row]]

    def __iter__(self) -> Iterator[Row]:
        yield from self.overall.values()
        for rows in self.by_phase.values():
            yield from rows.values()

    def of(self, target: str) -> tuple[Row, ...]:
        """A target's rows: the whole run, then each phase."""
        return (self.overall[target], *(rows[target] for rows in self.by_phase.values()))

    def scope(self, phase: str | None) -> dict[str, Row]:
        """The rows beside each other: the whole run's, or one phase's."""
        return self.overall if phase is None else self.by_phase[phase]

    def map(self, make: Callable[[Row], Row]) -> Rows:
        """New rows, each made from one of these (the order kept)."""
        return Rows(
            {t: make(r) for t, r in self.overall.items()},
            {p: {t: make(r) for t, r in rows.items()} for p, rows in self.by_phase.items()},
        )


# --- the requests -----------------------------------------------------------------------------


def request_rows(
    frame: Frame,
    rollups: Sequence[Rollup],
    totals: Sequence[Total],
    missed: Mapping[tuple[str, str, str], int],
) -> Rows:
    """The rows of what the requests say: rollups merged per target and per (target,
    phase), OOM answers from the totals, sends not made from the ledger."""
    overall: dict[str, Row] = {}
    by_phase: dict[str, dict[str, Row]] = {p: {} for p in frame.phases}
    oom: dict[tuple[str, str], int] = {}
    for counted in totals:
        key = (counted.target, counted.phase)
        oom[key] = oom.get(key, 0) + counted.oom
    for target in frame.targets:
        mine = [r for r in rollups if r.target == target]
        overall[target] = _row(
            (target, None),
            mine,
            frame.active_s,
            frame,
            sum(n for (t, _), n in oom.items() if t == target),
            _missed(missed, target, None),
        )
        for phase in frame.phases:
            by_phase[phase][target] = _row(
                (target, phase),
                [r for r in mine if r.phase == phase],
                frame.phase_active.get(phase, 0.0),
                frame,
                oom.get((target, phase), 0),
                _missed(missed, target, phase),
            )
    return Rows(overall, by_phase)


def _missed(
    missed: Mapping[tuple[str, str, str], int], target: str, phase: str | None
) -> dict[str, int]:
    """Sends not made by reason, for one target over the run or in one phase."""
    out: dict[str, int] = {}
    for (t, p, reason), n in missed.items():
        if t == target and n and (phase is None or p == phase):
            out[reason] = out.get(reason, 0) + n
    return out


def _row(
    key: Key,
    rollups: list[Rollup],
    active_s: float,
    frame: Frame,
    oom_responses: int,
    missed: dict[str, int],
) -> Row:
    stats = TargetStats()
    slices: dict[int, TargetStats] = {}
    per_slice = max(1, round(frame.slice_s / frame.window_s))
    for r in rollups:
        stats.merge(r.stats)
        s = slices.get(r.window // per_slice)
        if s is None:
            s = slices[r.window // per_slice] = TargetStats()
        s.merge(r.stats)
    counted = error_counts(stats.requests, stats.errors)  # the one basis (goodput.py)
    attempted = stats.requests - counted.excluded
    p99s = {i: v for i, s in slices.items() if (v := slice_p99(s)) is not None}
    jitter, jitter_slices = worst_window_jitter(p99s, JITTER_SLICES)
    return Row(
        key[0],
        key[1],
        active_s=active_s,
        offered=stats.requests + sum(missed.values()),
        missed=sum(missed.values()),
        missed_by_reason=missed,
        requests=stats.requests,
        ok=stats.ok,
        errors_by_kind=dict(sorted(stats.errors.items())),
        errors=counted.failed,
        server_errors=counted.server,
        shed=counted.shed,
        not_judged=counted.excluded,
        error_ratio=counted.error_ratio,
        server_error_ratio=counted.server_error_ratio,
        success_rate=stats.ok / attempted if attempted else None,
        lag_p99_ms=ms(stats.lag.quantile(0.99)),
        output_tokens=stats.output_tokens,
        prompt_tokens=stats.prompt_tokens,
        rps=stats.ok / active_s if active_s > 0 else None,
        attempt_rps=stats.requests / active_s if active_s > 0 else None,
        output_tps=stats.output_tokens / active_s if active_s > 0 else None,
        oom_responses=oom_responses,
        latency_ms={
            kind: Quantiles(
                p50=ms(getattr(stats, kind).quantile(0.5)),
                p95=ms(getattr(stats, kind).quantile(0.95)),
                p99=ms(getattr(stats, kind).quantile(0.99)),
            )
            for kind in LATENCY_KINDS
        },
        jitter=jitter,
        jitter_slices=jitter_slices,
    )


# --- the probes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """A target's restarts and OOM events over the run or a phase (None: no series)."""

    restarts: int | None
    oom_events: int | None


def probe_counts(probe: Samples, frame: Frame) -> dict[Key, Counts]:
    """Each row's restarts and OOM events, from the probes' counters."""
    out: dict[Key, Counts] = {}
    for target in frame.targets:
        restarts = probe.increase(names.TARGET_RESTARTS, {"target": target})
        ooms = probe.increase(names.TARGET_OOM_EVENTS, {"target": target})
        for phase in (None, *frame.phases):
            out[(target, phase)] = Counts(_count(restarts, phase), _count(ooms, phase))
    return out


def _count(per_phase: dict[str, float] | None, phase: str | None) -> int | None:
    """A counter's increase over the run (``phase`` None) or one phase; None: no series."""
    if per_phase is None:
        return None
    return round(sum(per_phase.values()) if phase is None else per_phase.get(phase, 0.0))


# --- energy and money -------------------------------------------------------------------------


@dataclass(frozen=True)
class Money:
    """A row's energy (``analysis.energy_share``) and cost (``cost.cost_line``)."""

    energy_j: float | None
    energy_shared: bool
    tokens_per_joule: float | None
    cost: float | None
    cost_basis: str | None
    cost_per_mtok: float | None
    cost_per_month: float | None


SHARED_NOTE = (
    "targets sharing a GPU share its energy: their tokens per joule is the "
    "pair's (set targets[].cost.gpus to charge GPUs explicitly)"
)


def energy_and_cost(
    rows: Rows,
    targets: list[str],
    costs: Mapping[str, TargetCost],
    gpus: Sequence[GpuEnergy],
    price: float | None,
) -> tuple[dict[Key, Money], list[str]]:
    """Each row's energy and cost, from the request rows; and the note when targets
    share a GPU's energy."""
    out: dict[Key, Money] = {}
    shared = False
    for target in targets:
        for row in rows.of(target):
            tokens = {t: r.output_tokens for t, r in rows.scope(row.phase).items()}
            share = energy_share(target, gpus, tokens, row.phase)
            joules = share.joules if share is not None else None
            split = share.shared if share is not None else False
            shared = shared or split
            energy = None
            if price is not None and joules is not None and not split:
                energy = (joules / JOULES_PER_KWH * price, f"energy at {price:g}/kWh")
            line = cost_line(
                costs.get(target, TargetCost()),
                row.active_s,
                row.prompt_tokens,
                row.output_tokens,
                energy,
            )
            out[(target, row.phase)] = Money(
                joules,
                split,
                share.tokens_per_joule if share is not None else None,
                line.total,
                line.basis,
                line.per_mtok,
                line.per_month,
            )
    return out, [SHARED_NOTE] if shared else []


# --- the row, put together --------------------------------------------------------------------


def measured(row: Row, counts: Counts, vram: Vram | None, money: Money, *, rehearsal: bool) -> Row:
    """The request row with what the probes, the energy and the money say (``vram``: over
    the row's own time, the run or its phase: ``Vram.of``). A rehearsal compresses the
    plan: a month at its load or a slope per hour of its compressed time would be made
    up, so neither is given."""
    peak = vram.peak_bytes if vram is not None else None
    slope = vram.leak_bytes_per_hour if vram is not None else None
    note = vram.leak_note if vram is not None else None
    per_month = money.cost_per_month
    if rehearsal:
        per_month = None
        if slope is not None or note is not None:
            slope, note = None, REHEARSAL_NOTE
    return replace(
        row,
        restarts=counts.restarts,
        oom_events=counts.oom_events,
        vram_peak_bytes=peak,
        leak_bytes_per_hour=slope,
        leak_note=note,
        energy_j=money.energy_j,
        energy_shared=money.energy_shared,
        tokens_per_joule=money.tokens_per_joule,
        cost=money.cost,
        cost_basis=money.cost_basis,
        cost_per_mtok=money.cost_per_mtok,
        cost_per_month=per_month,
    )


def unprojected(gpus: list[GpuRow]) -> list[GpuRow]:
    """A rehearsal's GPU rows: no leak slope (see ``measured``)."""
    return [replace(g, leak_bytes_per_hour=None, leak_note=REHEARSAL_NOTE) for g in gpus]
