"""Report room: the journal alone -> the side-by-side table that decides between the targets.

``build_report`` reads a run directory's journal (no Prometheus needed) into a ``Report``
of plain numbers; ``render_markdown``, ``render_html`` (one self-contained file, inline
SVG plots written here: no plotting dependency), ``render_json`` and ``terminal_summary``
only format it. Definitions (docs/journal.md has them in full):

- Percentiles come from the journal's rollups (``Digest``, within ~1 %), whole run and
  per phase; latency percentiles count successful requests only, as the histograms do.
- P99 jitter: ``analysis.jitter``, the one definition the alert uses too: stdev / mean of
  the twelve 5-minute P99 E2Es of an hour of plan time, the worst hour shown; a run
  shorter than 2 h is one window of twelve equal slices. A slice counts with >= 20
  successful requests, and at least 3 slices are needed.
- Leak slope: Theil-Sen slope of the memory series over plan time (bytes/hour).
- Energy: the increase of ``soakd_gpu_energy_joules_total`` (or power integrated) of the
  GPUs charged to a target: ``cost.gpus``, else the GPUs its process was seen on, else
  every GPU when there is only one target.
- Cost: soakd/cost.py (hourly price or energy, hardware amortisation, token prices);
  per million output tokens and per month at the measured load.
- Goodput, verdicts and the baseline comparison: soakd/goodput.py and soakd/verdicts.py
  (docs/slo.md); this module only wires and renders them.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from soakd.analysis import (
    JITTER_MIN_OK,
    JITTER_MIN_SLICES,
    JITTER_SLICES,
    JITTER_WINDOW_S,
    TargetStats,
    fmt_ms,
    slice_p99,
    worst_window_jitter,
)
from soakd.config import Compare, Slo, TargetCost
from soakd.cost import cost_line
from soakd.goodput import Tally, journal_tallies
from soakd.journal import JournalReader, Rollup
from soakd.probes.leak import theil_sen
from soakd.slowest import DEFAULT_N, SlowRequest, slowest, slowest_sections
from soakd.verdicts import CompareVerdict, Verdict, compare, eligible_for_best, judge
from soakd.verdicts import overall as overall_verdict

NS = 1e9
HOUR_S = 3600.0
PLOT_POINTS = 200
LEAK_POINTS = 120

SAMPLE_NAMES = (
    "soakd_gpu_memory_used_bytes",
    "soakd_gpu_process_memory_bytes",
    "soakd_gpu_energy_joules_total",
    "soakd_gpu_power_watts",
    "soakd_target_restarts_total",
    "soakd_target_oom_events_total",
    # the guard gateways soakd ran (soakd/probes/gateways.py journals them on change)
    "soakd_gateway_breaker_transitions_total",
    "soakd_gateway_concurrency_limit",
    "soakd_gateway_rejections_total",
)

# --- the report's data ------------------------------------------------------------------------


@dataclass
class Row:
    """One target over the whole run or over one phase. None: not measured."""

    target: str
    phase: str | None
    active_s: float = 0.0
    offered: int = 0  # open-loop instants planned (sent or not) + closed-loop sends
    missed: int = 0  # planned sends not made (soakd_sends_missed_total)
    missed_by_reason: dict[str, int] = field(default_factory=dict)
    requests: int = 0  # sent: each one ends as one outcome
    ok: int = 0
    shed: int = 0  # refused by the guard gateway (shed_* outcomes), not the server's failure
    success_rate: float | None = None
    errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    oom_responses: int = 0
    oom_events: int | None = None
    restarts: int | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    rps: float | None = None
    output_tps: float | None = None
    goodput: float | None = None  # share of sent requests within every SLO (soakd/goodput.py)
    goodput_rps: float | None = None
    error_ratio: float | None = None  # as slo.error_ratio counts it
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    lag_p99_ms: float | None = None  # soakd's own dispatch lag: high = client-limited
    jitter: float | None = None
    jitter_slices: int = 0
    vram_peak_bytes: float | None = None
    leak_bytes_per_hour: float | None = None
    leak_note: str | None = None  # why there is no slope ("too short to tell")
    energy_j: float | None = None
    energy_shared: bool = False
    tokens_per_joule: float | None = None
    cost: float | None = None
    cost_per_mtok: float | None = None
    cost_per_month: float | None = None
    cost_basis: str | None = None


@dataclass
class GpuRow:
    gpu: str
    peak_used_bytes: float | None
    leak_bytes_per_hour: float | None
    energy_j: float | None
    mean_power_w: float | None
    targets: list[str]
    leak_note: str | None = None


@dataclass
class GuardRow:
    """What the guard gateway in front of a target did in one phase."""

    phase: str
    target: str
    modes: str  # the features the phase switched on ("vram_breaker, adaptive"...)
    breaker_openings: dict[str, int]  # breaker -> times it opened
    shed: dict[str, int]  # shed_* kind -> requests soakd counted so
    rejections: dict[str, int]  # the gateway's own count, by its reason
    limit_min: float | None  # concurrency limit over the phase
    limit_max: float | None


@dataclass
class Series:
    """One line of a plot: x in plan hours, y in the plot's unit (None breaks the line)."""

    label: str
    points: list[tuple[float, float | None]]
    group: str = ""  # lines of one group (a target, a GPU) share a colour
    dashed: bool = False


@dataclass
class Report:
    run_id: str
    created: str
    versions: list[str]
    sessions: int
    completed: bool
    active_s: float
    plan_s: float
    downtime_s: float
    downtimes: list[dict[str, float]]
    targets: list[str]
    phases: list[str]
    overall: dict[str, Row]
    by_phase: dict[str, dict[str, Row]]
    gpus: list[GpuRow]
    guard: list[GuardRow]
    best: dict[str, list[str]]
    plots: dict[str, list[Series]]
    notes: list[str]
    currency: str
    slice_s: float
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by target, whole run
    phase_verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    comparison: CompareVerdict | None = None
    passed: bool | None = None  # None: nothing judged (no slo, no compare)
    # target -> phase -> its slowest requests, with trace ids (soakd/slowest.py)
    slowest: dict[str, dict[str, list[SlowRequest]]] = field(default_factory=dict)


METRIC_COLUMNS: list[tuple[str, str, str | None]] = [
    # key, title, better: "min" | "max" | None
    ("offered", "offered", None),
    ("missed", "sends not made", None),
    ("requests", "sent", None),
    ("goodput", "goodput (within SLO)", "max"),
    ("goodput_rps", "goodput (req/s)", "max"),
    ("success_rate", "success rate", "max"),
    ("errors", "errors", "min"),
    ("error_ratio", "error ratio (SLO)", "min"),
    ("shed", "shed by the guard", None),
    ("oom_events", "OOM events", "min"),
    ("oom_responses", "OOM error responses", "min"),
    ("restarts", "restarts", "min"),
    ("ttft.p50", "TTFT p50", "min"),
    ("ttft.p95", "TTFT p95", "min"),
    ("ttft.p99", "TTFT p99", "min"),
    ("itl.p50", "ITL p50", "min"),
    ("itl.p95", "ITL p95", "min"),
    ("itl.p99", "ITL p99", "min"),
    ("tpot.p50", "TPOT p50", "min"),
    ("tpot.p95", "TPOT p95", "min"),
    ("tpot.p99", "TPOT p99", "min"),
    ("e2e.p50", "E2E p50", "min"),
    ("e2e.p95", "E2E p95", "min"),
    ("e2e.p99", "E2E p99", "min"),
    ("jitter", "P99 jitter", "min"),
    ("rps", "throughput (req/s)", "max"),
    ("output_tps", "output tokens/s", "max"),
    ("lag_p99_ms", "dispatch lag p99", None),
    ("vram_peak_bytes", "VRAM peak", "min"),
    ("leak_bytes_per_hour", "VRAM leak slope", "min"),
    ("tokens_per_joule", "tokens per joule", "max"),
    ("cost_per_mtok", "cost per M output tokens", "min"),
    ("cost_per_month", "cost per month at this load", "min"),
]
TERMINAL_COLUMNS = (
    "offered",
    "missed",
    "requests",
    "goodput",
    "goodput_rps",
    "success_rate",
    "errors",
    "shed",
    "oom_events",
    "restarts",
    "ttft.p50",
    "ttft.p99",
    "itl.p50",
    "itl.p99",
    "tpot.p50",
    "e2e.p50",
    "e2e.p99",
    "jitter",
    "rps",
    "output_tps",
    "vram_peak_bytes",
    "tokens_per_joule",
    "cost_per_mtok",
    "cost_per_month",
)
# per phase: the same, less what only the whole run has (a GPU's VRAM peak, a monthly bill)
PHASE_COLUMNS = frozenset(TERMINAL_COLUMNS) - {"vram_peak_bytes", "cost_per_month"}
NOT_RANKED = frozenset({"goodput", "goodput_rps", "success_rate", "errors", "error_ratio"})
"""Rows where any target may be marked best; on every other row only targets that pass the
error criterion and succeeded on most requests compete (soakd/verdicts.py)."""


def value_of(row: Row, key: str) -> float | None:
    if "." in key:
        kind, q = key.split(".")
        return row.latency_ms.get(kind, {}).get(q)
    value = getattr(row, key)
    return None if value is None else float(value)


# --- building --------------------------------------------------------------------------------


@dataclass
class _Session:
    started_wall: float
    started_offset: float  # seconds of plan time
    wall: float
    offset: float


class _Timeline:
    """Maps wall-clock readings onto plan time (sessions) and plan time onto phases."""

    def __init__(self, sessions: list[_Session], phases: list[tuple[str, float, float]]) -> None:
        self.sessions = sessions
        self.phases = phases

    def offset(self, wall: float) -> float | None:
        for s in self.sessions:
            if s.started_wall - 1.0 <= wall <= s.wall + 5.0:
                return max(s.started_offset, s.started_offset + wall - s.started_wall)
        return None

    def phase(self, offset_s: float) -> str | None:
        for name, start, end in self.phases:
            if start <= offset_s < end:
                return name
        return self.phases[-1][0] if self.phases and offset_s >= self.phases[-1][2] else None


def build_report(
    run_dir: Path,
    *,
    energy_price_per_kwh: float | None = None,
    judge_by: dict[str, Any] | None = None,
    slowest_n: int = DEFAULT_N,
) -> Report:
    """Everything the report says, from the journal in ``run_dir`` (read-only).
    ``judge_by``: another config document whose slo, compare, costs and report sections
    replace the run's own (``soakd report --config``)."""
    with JournalReader(run_dir) as reader:
        meta = reader.meta
        sessions = reader.sessions()
        events = reader.events()
        totals = reader.totals()
        rollups = reader.rollups()
        missed = reader.missed()
        series = reader.series()
        samples = reader.samples(SAMPLE_NAMES)
        window_s = reader.window_ns / NS
        config = meta.get("config", {})
        if judge_by is not None:
            config = decisions_from(config, judge_by)
        targets = [t["name"] for t in config.get("targets", [])]
        for r in rollups:
            if r.target not in targets:
                targets.append(r.target)
        slos, spec, slo_note = _decision_config(config, targets)
        tallies = {t: journal_tallies(reader.conn, t, slos[t]) for t in targets}
        slow = slowest(reader, slowest_n, rollups)
    plan_phases = [
        (p["name"], p["start_ns"] / NS, p["end_ns"] / NS) for p in meta["plan"]["phases"]
    ]
    reached = max((s["offset_ns"] for s in sessions), default=0) / NS
    plan_s = plan_phases[-1][2] if plan_phases else 0.0
    active_s = min(reached, plan_s) if plan_s else reached
    phase_names = list(dict.fromkeys(name for name, start, _ in plan_phases if start < active_s))
    for r in rollups:
        if r.phase not in phase_names:
            phase_names.append(r.phase)
    phase_active: dict[str, float] = {}
    for name, start, end in plan_phases:
        phase_active[name] = phase_active.get(name, 0.0) + max(0.0, min(end, active_s) - start)
    timeline = _Timeline(
        [
            _Session(s["started_wall"], s["started_offset_ns"] / NS, s["wall"], s["offset_ns"] / NS)
            for s in sessions
        ],
        plan_phases,
    )
    downtimes = [
        {
            "offset_h": (e["offset_ns"] or 0) / NS / HOUR_S,
            "seconds": float(e["data"].get("seconds", 0.0)),
        }
        for e in events
        if e["kind"] == "downtime"
    ]
    completed = any(e["kind"] == "run_stopped" and e["data"].get("completed") for e in events)
    jitter_window_s = JITTER_WINDOW_S if active_s >= 2 * JITTER_WINDOW_S else active_s
    slice_s = max(window_s, jitter_window_s / JITTER_SLICES)
    slice_s = max(window_s, round(slice_s / window_s) * window_s)

    # requests: rollups merged per target, per (target, phase), per window
    overall: dict[str, Row] = {}
    by_phase: dict[str, dict[str, Row]] = {p: {} for p in phase_names}
    oom_rows: dict[tuple[str, str], int] = {}
    for target, phase, _, _, _, _, _, oom in totals:
        oom_rows[(target, phase)] = oom_rows.get((target, phase), 0) + oom
    for target in targets:
        mine = [r for r in rollups if r.target == target]
        overall[target] = _row(target, None, mine, active_s, slice_s, window_s)
        overall[target].oom_responses = sum(v for (t, _), v in oom_rows.items() if t == target)
        for phase in phase_names:
            row = _row(
                target,
                phase,
                [r for r in mine if r.phase == phase],
                phase_active.get(phase, 0.0),
                slice_s,
                window_s,
            )
            row.oom_responses = oom_rows.get((target, phase), 0)
            by_phase[phase][target] = row
        for (t, phase, reason), n in missed.items():
            if t != target or not n:
                continue
            for hit in (overall[target], by_phase.get(phase, {}).get(target)):
                if hit is not None:
                    hit.missed += n
                    hit.missed_by_reason[reason] = hit.missed_by_reason.get(reason, 0) + n
        for row in (overall[target], *(by_phase[p][target] for p in phase_names)):
            row.offered = row.requests + row.missed

    # probes: restarts, OOM events, VRAM, energy
    notes: list[str] = []
    probe = _Probes(series, samples, timeline)
    for target in targets:
        rows = [overall[target], *(by_phase[p][target] for p in phase_names)]
        for counter, attr in (
            ("soakd_target_restarts_total", "restarts"),
            ("soakd_target_oom_events_total", "oom_events"),
        ):
            per_phase = probe.increase(counter, {"target": target})
            if per_phase is not None:
                for row in rows:
                    total = (
                        sum(per_phase.values())
                        if row.phase is None
                        else per_phase.get(row.phase, 0.0)
                    )
                    setattr(row, attr, round(total))
    gpus = probe.gpus(targets, config)
    guard = _guard_rows(probe, by_phase, targets, phase_names, config, events)
    _vram(overall, targets, probe, gpus)
    price = energy_price_per_kwh
    if price is None:
        price = config.get("report", {}).get("energy_price_per_kwh")
    currency = str(config.get("report", {}).get("currency", "$"))
    _energy_and_cost(overall, by_phase, targets, config, gpus, probe, price, notes)
    if slo_note:
        notes.append(slo_note)
    verdicts, phase_verdicts = _verdicts(overall, by_phase, targets, slos, tallies)
    comparison = compare(spec, overall, verdicts) if spec is not None else None
    journaled = {t: tallies[t][0] for t in targets}
    short = {t: n for t in targets if (n := overall[t].requests - _counted(journaled[t])) > 0}
    if short:
        notes.append(
            "goodput and the error ratio count the journaled request rows: "
            + ", ".join(
                f"{t} has {n} fewer (retention or dropped records)" for t, n in short.items()
            )
        )
    if not samples or not any(samples.values()):
        notes.append(
            "no probe samples in the journal: OOM events, restarts, VRAM and "
            "energy are not measured"
        )
    dropped = sum(t[4] for t in totals) - sum(r.requests for r in overall.values())
    if dropped > 0:
        notes.append(
            f"{dropped} request(s) were counted but not journaled (queue full or "
            "write errors): percentiles leave them out"
        )
    retention = [e for e in events if e["kind"] == "retention"]
    if retention:
        notes.append(
            "retention deleted old rows; totals, percentiles and plots still cover "
            "the whole run (rollups are kept), the export does not"
        )

    notes += _client_limits(overall, targets, config)
    eligible = {t for t in targets if eligible_for_best(overall[t], verdicts.get(t))}
    best = _best(overall, targets, eligible)
    plots = _plots(rollups, targets, window_s, probe, gpus)
    return Report(
        run_id=meta["run_id"],
        created=str(meta.get("created", "")),
        versions=sorted({s["version"] for s in sessions}),
        sessions=len(sessions),
        completed=completed,
        active_s=active_s,
        plan_s=plan_s,
        downtime_s=sum(d["seconds"] for d in downtimes),
        downtimes=downtimes,
        targets=targets,
        phases=phase_names,
        overall=overall,
        by_phase=by_phase,
        gpus=gpus,
        guard=guard,
        best=best,
        plots=plots,
        notes=notes,
        currency=currency,
        slice_s=slice_s,
        verdicts=verdicts,
        phase_verdicts=phase_verdicts,
        comparison=comparison,
        passed=overall_verdict(verdicts.values(), comparison),
        slowest=slow,
    )


DECISION_KEYS = ("slo", "compare", "report")
TARGET_DECISION_KEYS = ("slo", "cost")


def decisions_from(stored: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The run's config with what decides (slo, compare, costs, report) taken from
    ``other``; targets are matched by name, targets ``other`` lacks keep none of it."""
    out = dict(stored)
    for key in DECISION_KEYS:
        out[key] = other.get(key)
    theirs = {t.get("name"): t for t in other.get("targets", [])}
    out["targets"] = [
        {
            **t,
            **{k: (theirs.get(t.get("name")) or {}).get(k) for k in TARGET_DECISION_KEYS},
        }
        for t in stored.get("targets", [])
    ]
    return out


def _counted(t: Tally) -> int:
    return t.sent + t.excluded + t.unsent


def _decision_config(
    config: dict[str, Any], targets: list[str]
) -> tuple[dict[str, Slo], Compare | None, str | None]:
    """The stored config's slo (per target, overrides applied) and compare sections."""
    try:
        base = Slo.model_validate(config.get("slo") or {})
        by_name = {t["name"]: t for t in config.get("targets", [])}
        slos = {
            t: Slo.model_validate(by_name.get(t, {}).get("slo") or {}).over(base) for t in targets
        }
        raw = config.get("compare")
        spec = Compare.model_validate(raw) if raw else None
    except ValidationError as exc:
        return (
            {t: Slo() for t in targets},
            None,
            f"the run's slo/compare config could not be read ({exc.error_count()} error(s)): "
            "no verdicts",
        )
    if spec is not None and not {spec.baseline, spec.candidate} <= set(targets):
        return slos, None, "compare names a target the run does not have: no comparison"
    return slos, spec, None


def _verdicts(
    overall: dict[str, Row],
    by_phase: dict[str, dict[str, Row]],
    targets: list[str],
    slos: dict[str, Slo],
    tallies: dict[str, tuple[Tally, dict[str, Tally]]],
) -> tuple[dict[str, Verdict], dict[str, dict[str, Verdict]]]:
    """Goodput into the rows, and each target judged over the run and per phase."""
    verdicts: dict[str, Verdict] = {}
    phase_verdicts: dict[str, dict[str, Verdict]] = {p: {} for p in by_phase}
    for t in targets:
        whole, phases = tallies[t]
        pairs = [(overall[t], whole)] + [(by_phase[p][t], phases.get(p, Tally())) for p in by_phase]
        for row, tally in pairs:
            v = judge(t, row.phase, slos[t], row, tally)
            row.goodput, row.goodput_rps, row.error_ratio = v.goodput, v.goodput_rps, v.error_ratio
            if row.phase is None:
                verdicts[t] = v
            else:
                phase_verdicts[row.phase][t] = v
    return verdicts, phase_verdicts


def _row(
    target: str,
    phase: str | None,
    rollups: list[Rollup],
    active_s: float,
    slice_s: float,
    window_s: float,
) -> Row:
    stats = TargetStats()
    slices: dict[int, TargetStats] = {}
    per_slice = max(1, round(slice_s / window_s))
    for r in rollups:
        stats.merge(r.stats)
        s = slices.get(r.window // per_slice)
        if s is None:
            s = slices[r.window // per_slice] = TargetStats()
        s.merge(r.stats)
    row = Row(target, phase, active_s=active_s, requests=stats.requests, ok=stats.ok)
    row.success_rate = stats.ok / stats.requests if stats.requests else None
    row.errors = stats.requests - stats.ok
    row.errors_by_kind = dict(sorted(stats.errors.items()))
    row.shed = sum(n for kind, n in row.errors_by_kind.items() if kind.startswith("shed_"))
    lag = stats.lag.quantile(0.99)
    row.lag_p99_ms = None if lag is None else lag / 1e6
    row.output_tokens = stats.output_tokens
    row.prompt_tokens = stats.prompt_tokens
    if active_s > 0:
        row.rps = stats.requests / active_s
        row.output_tps = stats.output_tokens / active_s
    for kind in ("ttft", "itl", "tpot", "e2e"):
        digest = getattr(stats, kind)
        row.latency_ms[kind] = {
            q: None if (v := digest.quantile(x)) is None else v / 1e6
            for q, x in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        }
    p99s = {i: v for i, s in slices.items() if (v := slice_p99(s)) is not None}
    row.jitter, row.jitter_slices = worst_window_jitter(p99s, JITTER_SLICES)
    return row


def _guard_rows(
    probe: _Probes,
    by_phase: dict[str, dict[str, Row]],
    targets: list[str],
    phases: list[str],
    config: dict[str, Any],
    events: list[dict[str, Any]],
) -> list[GuardRow]:
    """Per phase and guarded target: the modes the phase set, breaker openings, the sheds
    soakd counted and the gateway's own rejections, the concurrency limit's range."""
    guarded = [t["name"] for t in config.get("targets", []) if t.get("gateway") is not None]
    guarded += [t for t in targets if t not in guarded and any(
        k.startswith("shed_") for row in (p.get(t) for p in by_phase.values()) if row
        for k in row.errors_by_kind)]
    modes: dict[tuple[str, str], str] = {}
    state: dict[str, dict[str, bool]] = {}  # a phase changes the features it names only
    current = None
    for e in events:
        if e["kind"] == "phase":
            current = e["data"].get("name")
        elif e["kind"] == "gateway_modes" and current is not None:
            target = e["data"].get("target", "")
            flags = state.setdefault(target, {})
            flags.update({k: v for k, v in e["data"].items() if isinstance(v, bool)})
            modes[(current, target)] = ", ".join(k for k, v in flags.items() if v) or "none"
    rows = []
    for target in guarded:
        openings: dict[str, dict[str, float]] = {}
        for labels, _ in probe.find("soakd_gateway_breaker_transitions_total",
                                    {"target": target, "to": "open"}):
            b = labels.get("breaker", "?")
            openings[b] = probe.increase("soakd_gateway_breaker_transitions_total",
                                         {"target": target, "to": "open", "breaker": b}) or {}
        rejected: dict[str, dict[str, float]] = {}
        for labels, _ in probe.find("soakd_gateway_rejections_total", {"target": target}):
            reason = labels.get("reason", "?")
            rejected[reason] = probe.increase("soakd_gateway_rejections_total",
                                              {"target": target, "reason": reason}) or {}
        limits: dict[str, list[float]] = {}
        for _, points in probe.find("soakd_gateway_concurrency_limit", {"target": target}):
            pts = sorted(points)  # journaled on change: a step function of plan time
            for name, start, end in probe.timeline.phases:
                before = [v for t, v in pts if t < start]
                inside = [v for t, v in pts if start <= t < end]
                values = ([before[-1]] if before else []) + inside
                if values:
                    limits.setdefault(name, []).extend(values)
        for phase in phases:
            row = by_phase.get(phase, {}).get(target)
            shed = {k: n for k, n in (row.errors_by_kind if row else {}).items()
                    if k.startswith("shed_")}
            lim = limits.get(phase, [])
            rows.append(GuardRow(
                phase, target, modes.get((phase, target), "-"),
                {b: round(v.get(phase, 0.0)) for b, v in openings.items()},
                shed,
                {r: n for r, v in rejected.items() if (n := round(v.get(phase, 0.0)))},
                min(lim) if lim else None, max(lim) if lim else None,
            ))
    return rows


DEFAULT_LAG_LIMIT_S = 0.1


def _client_limits(
    overall: dict[str, Row], targets: list[str], config: dict[str, Any]
) -> list[str]:
    """Say so when soakd itself was the bottleneck: its dispatch lag past the limit, or
    planned sends it could not make in time. Those latency figures are the client's."""
    limits = config.get("alert_limits") or {}
    limit_s = float(limits.get("dispatch_lag") or DEFAULT_LAG_LIMIT_S)
    notes = []
    for t in targets:
        row = overall[t]
        late = row.missed_by_reason.get("late", 0)
        lagged = row.lag_p99_ms is not None and row.lag_p99_ms > limit_s * 1e3
        if lagged or late:
            why = []
            if lagged:
                lag = _ms(row.lag_p99_ms or 0)
                why.append(f"dispatch lag p99 {lag} (limit {_ms(limit_s * 1e3)})")
            if late:
                why.append(f"{late:,} planned sends too late to make")
            notes.append(
                f"CLIENT-LIMITED: soakd could not keep up with {t}'s schedule "
                f"({'; '.join(why)}): its latency and rate figures measure soakd as much as "
                "the target (give soakd more CPU, or lower the load)"
            )
    for t in targets:
        row = overall[t]
        if row.missed_by_reason.get("in_flight_cap"):
            notes.append(
                f"{t}: {row.missed_by_reason['in_flight_cap']:,} planned sends found "
                "max_in_flight requests already out and were not made (the target could "
                "not keep up with the offered rate)"
            )
    return notes


class _Probes:
    """Probe samples by series, placed on plan time."""

    def __init__(
        self,
        series: dict[int, tuple[str, dict[str, str]]],
        samples: dict[int, list[tuple[float, float]]],
        timeline: _Timeline,
    ) -> None:
        self.timeline = timeline
        self.by_name: dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]] = {}
        for sid, points in samples.items():
            name, labels = series[sid]
            placed = [(off, v) for w, v in points if (off := timeline.offset(w)) is not None]
            if placed:
                self.by_name.setdefault(name, []).append((labels, placed))

    def find(
        self, name: str, match: dict[str, str]
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        return [
            (lbl, pts)
            for lbl, pts in self.by_name.get(name, [])
            if all(lbl.get(k) == v for k, v in match.items())
        ]

    def increase(self, name: str, match: dict[str, str]) -> dict[str, float] | None:
        """A counter's increase per phase, summed over matching series; None: no series.
        A drop is a restart of soakd (its probe counters start at 0 again)."""
        found = self.find(name, match)
        if not found:
            return None
        out: dict[str, float] = {}
        for _, points in found:
            prev = 0.0
            for offset, value in points:
                inc = value - prev if value >= prev else value
                prev = value
                if inc > 0:
                    phase = self.timeline.phase(offset) or "?"
                    out[phase] = out.get(phase, 0.0) + inc
        return out

    def power_energy(self, gpu: str) -> dict[str, float] | None:
        """Joules per phase from power readings (trapezoids; gaps over 30 s skipped)."""
        found = self.find("soakd_gpu_power_watts", {"gpu": gpu})
        if not found:
            return None
        out: dict[str, float] = {}
        for _, points in found:
            for (t0, p0), (t1, p1) in itertools.pairwise(points):
                if 0 < t1 - t0 <= 30:
                    phase = self.timeline.phase((t0 + t1) / 2) or "?"
                    out[phase] = out.get(phase, 0.0) + (p0 + p1) / 2 * (t1 - t0)
        return out

    def gpus(self, targets: list[str], config: dict[str, Any]) -> list[GpuRow]:
        names = sorted(
            {
                lbl.get("gpu", "?")
                for name in (
                    "soakd_gpu_memory_used_bytes",
                    "soakd_gpu_energy_joules_total",
                    "soakd_gpu_power_watts",
                    "soakd_gpu_process_memory_bytes",
                )
                for lbl, _ in self.by_name.get(name, [])
            }
        )
        charged: dict[str, list[str]] = {g: [] for g in names}
        configured = {
            t["name"]: (t.get("cost") or {}).get("gpus") for t in config.get("targets", [])
        }
        for target in targets:
            gpus = configured.get(target)
            if gpus is None:
                gpus = sorted(
                    {
                        lbl["gpu"]
                        for lbl, pts in self.find(
                            "soakd_gpu_process_memory_bytes", {"target": target}
                        )
                        if any(v > 0 for _, v in pts)
                    }
                )
            if not gpus and (len(targets) == 1 or target == _dcgm_owner(config)):
                gpus = names
            for g in gpus:
                charged.setdefault(g, []).append(target)
        rows = []
        for g in sorted(charged):
            used = self.find("soakd_gpu_memory_used_bytes", {"gpu": g})
            values = [v for _, pts in used for _, v in pts]
            energy = self.increase("soakd_gpu_energy_joules_total", {"gpu": g})
            if energy is None:
                energy = self.power_energy(g)
            power = [v for _, pts in self.find("soakd_gpu_power_watts", {"gpu": g}) for _, v in pts]
            rows.append(
                GpuRow(
                    gpu=g,
                    peak_used_bytes=max(values) if values else None,
                    leak_bytes_per_hour=_leak([p for _, pts in used for p in pts]),
                    leak_note=_leak_note([p for _, pts in used for p in pts]),
                    energy_j=sum(energy.values()) if energy is not None else None,
                    mean_power_w=statistics.fmean(power) if power else None,
                    targets=charged[g],
                )
            )
        self.energy_by_phase = {
            g.gpu: (
                self.increase("soakd_gpu_energy_joules_total", {"gpu": g.gpu})
                or self.power_energy(g.gpu)
                or {}
            )
            for g in rows
        }
        return rows


LEAK_MIN_SPAN_S = 1800.0
"""A memory slope over less than this is no finding: a load step in a 3-minute rehearsal
extrapolates to gigabytes an hour. Shorter series say "too short to tell"."""
TOO_SHORT = "too short to tell"


def _dcgm_owner(config: dict[str, Any]) -> str | None:
    """The target whose own page the GPU readings came from: with ``gpu.source: dcgm`` and
    no ``dcgm_url``, the first simulator target (as the probe picks it); with a
    ``dcgm_url``, the target whose server answers on that host and port."""
    gpu = config.get("gpu") or {}
    if gpu.get("source") != "dcgm":
        return None
    targets = config.get("targets") or []
    url = gpu.get("dcgm_url")
    if not url:
        return next((t["name"] for t in targets if t.get("simulator")), None)
    host = urlsplit(url).netloc
    return next((t["name"] for t in targets
                 if host and host in (urlsplit(t.get("base_url") or "").netloc,
                                      urlsplit(t.get("metrics_url") or "").netloc)), None)


def _leak_note(points: Sequence[tuple[float, float]]) -> str | None:
    """Why a series gives no slope although it has samples (None: it gives one, or has none)."""
    if len(points) < 2:
        return None
    span = max(t for t, _ in points) - min(t for t, _ in points)
    return TOO_SHORT if span < LEAK_MIN_SPAN_S else None


def _leak(points: Sequence[tuple[float, float]]) -> float | None:
    """Theil-Sen slope in bytes/hour over plan time, on at most LEAK_POINTS bin means;
    None under six samples or under LEAK_MIN_SPAN_S of them."""
    if len(points) < 6:
        return None
    pts = sorted(points)
    span = pts[-1][0] - pts[0][0]
    if span < LEAK_MIN_SPAN_S:
        return None
    width = span / LEAK_POINTS
    bins: dict[int, list[tuple[float, float]]] = {}
    for t, v in pts:
        bins.setdefault(min(LEAK_POINTS - 1, int((t - pts[0][0]) / width)), []).append((t, v))
    ts = [statistics.fmean(t for t, _ in b) for b in bins.values()]
    vs = [statistics.fmean(v for _, v in b) for b in bins.values()]
    slope = theil_sen(ts, vs)
    return None if slope is None else slope * HOUR_S


def _vram(overall: dict[str, Row], targets: list[str], probe: _Probes, gpus: list[GpuRow]) -> None:
    for target in targets:
        found = probe.find("soakd_gpu_process_memory_bytes", {"target": target})
        if found:
            peaks = [max(v for _, v in pts) for _, pts in found]
            overall[target].vram_peak_bytes = sum(peaks)
            longest = max(found, key=lambda f: len(f[1]))[1]
            overall[target].leak_bytes_per_hour = _leak(longest)
            overall[target].leak_note = _leak_note(longest)
            continue
        mine = [g for g in gpus if g.targets == [target]]
        if mine:
            peaks = [g.peak_used_bytes for g in mine if g.peak_used_bytes is not None]
            overall[target].vram_peak_bytes = sum(peaks) if peaks else None
            slopes = [g.leak_bytes_per_hour for g in mine if g.leak_bytes_per_hour is not None]
            overall[target].leak_bytes_per_hour = sum(slopes) if slopes else None
            overall[target].leak_note = next((g.leak_note for g in mine if g.leak_note), None)


def _energy_and_cost(
    overall: dict[str, Row],
    by_phase: dict[str, dict[str, Row]],
    targets: list[str],
    config: dict[str, Any],
    gpus: list[GpuRow],
    probe: _Probes,
    price: float | None,
    notes: list[str],
) -> None:
    costs: dict[str, TargetCost] = {}
    for t in config.get("targets", []):
        try:
            costs[t["name"]] = TargetCost.model_validate(t.get("cost") or {})
        except ValidationError:
            costs[t["name"]] = TargetCost()
            notes.append(f"targets[{t['name']}].cost could not be read: not costed")
    shared = False
    for target in targets:
        mine = [g for g in gpus if target in g.targets and g.energy_j is not None]
        sharers = sorted({t for g in mine for t in g.targets})
        rows = [overall[target], *(by_phase[p][target] for p in by_phase)]
        for row in rows:
            if mine:
                if row.phase is None:
                    joules = sum(g.energy_j or 0.0 for g in mine)
                else:
                    joules = sum(probe.energy_by_phase[g.gpu].get(row.phase, 0.0) for g in mine)
                tokens = sum(
                    (overall[t] if row.phase is None else by_phase[row.phase][t]).output_tokens
                    for t in sharers
                )
                row.energy_j = joules
                row.energy_shared = len(sharers) > 1
                shared = shared or row.energy_shared
                row.tokens_per_joule = tokens / joules if joules > 0 else None
            energy = None
            if price is not None and row.energy_j is not None and not row.energy_shared:
                energy = (row.energy_j / 3.6e6 * price, f"energy at {price:g}/kWh")
            line = cost_line(
                costs.get(target, TargetCost()),
                row.active_s,
                row.prompt_tokens,
                row.output_tokens,
                energy,
            )
            row.cost, row.cost_basis = line.total, line.basis
            row.cost_per_mtok, row.cost_per_month = line.per_mtok, line.per_month
    if shared:
        notes.append(
            "targets sharing a GPU share its energy: their tokens per joule is the "
            "pair's (set targets[].cost.gpus to charge GPUs explicitly)"
        )


LATENCY_TIE = 0.02
"""Percentiles closer than this (relative) are a tie: each digest is within ~1 %."""


def _best(
    overall: dict[str, Row], targets: list[str], eligible: set[str] | None = None
) -> dict[str, list[str]]:
    """Per metric, the target(s) with the better value, when there is a contest. Outside
    NOT_RANKED only ``eligible`` targets compete (a target that failed most requests is
    never best on latency)."""
    best: dict[str, list[str]] = {}
    for key, _, better in METRIC_COLUMNS:
        if better is None:
            continue
        pool = (
            targets
            if eligible is None or key in NOT_RANKED
            else [t for t in targets if t in eligible]
        )
        values = {t: v for t in pool if (v := value_of(overall[t], key)) is not None}
        if len(values) < 2 or len(set(values.values())) < 2:
            continue
        ranked = sorted(values.values(), reverse=better == "max")
        pick, runner_up = ranked[0], ranked[1]
        if "." in key and abs(runner_up - pick) <= LATENCY_TIE * max(abs(pick), 1e-12):
            continue
        best[key] = [t for t, v in values.items() if v == pick]
    return best


def _plots(
    rollups: list[Rollup], targets: list[str], window_s: float, probe: _Probes, gpus: list[GpuRow]
) -> dict[str, list[Series]]:
    """Binned time series over plan time (hours): at most PLOT_POINTS per line."""
    if not rollups:
        return {}
    top = max(r.window for r in rollups) + 1
    per_bin = max(1, math.ceil(top / PLOT_POINTS))
    bin_s = per_bin * window_s
    plots: dict[str, list[Series]] = {
        k: [] for k in ("latency", "ttft", "throughput", "errors", "vram")
    }
    for target in targets:
        bins: dict[int, TargetStats] = {}
        for r in rollups:
            if r.target == target:
                b = bins.get(r.window // per_bin)
                if b is None:
                    b = bins[r.window // per_bin] = TargetStats()
                b.merge(r.stats)
        xs = sorted(bins)

        def line(
            get: Callable[[TargetStats], float | None],
            xs: list[int] = xs,
            bins: dict[int, TargetStats] = bins,
        ) -> list[tuple[float, float | None]]:
            return [((i + 0.5) * bin_s / HOUR_S, get(bins[i])) for i in xs]

        def q(kind: str, x: float) -> Callable[[TargetStats], float | None]:
            def get(s: TargetStats) -> float | None:
                v = getattr(s, kind).quantile(x)
                return None if v is None else v / 1e6

            return get

        plots["latency"] += [
            Series(f"{target} E2E p50", line(q("e2e", 0.5)), target, dashed=True),
            Series(f"{target} E2E p99", line(q("e2e", 0.99)), target),
        ]
        plots["ttft"] += [
            Series(f"{target} TTFT p99", line(q("ttft", 0.99)), target),
            Series(f"{target} ITL p99", line(q("itl", 0.99)), target, dashed=True),
        ]
        plots["throughput"].append(
            Series(f"{target} output tok/s", line(lambda s: s.output_tokens / bin_s), target)
        )
        plots["errors"].append(
            Series(f"{target} errors/min", line(lambda s: (s.requests - s.ok) / bin_s * 60), target)
        )
        for _, pts in probe.find("soakd_gpu_process_memory_bytes", {"target": target}):
            plots["vram"].append(
                Series(f"{target} process", _binned(pts, bin_s, 1 / 2**30), target)
            )
    for g in gpus:
        for _, pts in probe.find("soakd_gpu_memory_used_bytes", {"gpu": g.gpu}):
            plots["vram"].append(
                Series(f"GPU {g.gpu} used", _binned(pts, bin_s, 1 / 2**30), "", dashed=True)
            )
    return {k: v for k, v in plots.items() if v}


def _binned(
    points: list[tuple[float, float]], bin_s: float, scale: float
) -> list[tuple[float, float | None]]:
    bins: dict[int, float] = {}
    for t, v in points:
        i = int(t // bin_s)
        bins[i] = max(bins.get(i, v), v)
    return [((i + 0.5) * bin_s / HOUR_S, v * scale) for i, v in sorted(bins.items())]


# --- formatting ------------------------------------------------------------------------------


def fmt_value(key: str, value: float | None, currency: str = "$") -> str:
    if value is None:
        return "-"
    if key in ("offered", "missed", "requests", "errors", "shed", "oom_events", "oom_responses",
               "restarts"):
        return f"{value:,.0f}"
    if key in ("success_rate", "goodput"):
        return f"{value * 100:.2f} %" if value < 1 else "100 %"
    if key == "error_ratio":
        return f"{value * 100:.3g} %"
    if "." in key or key == "lag_p99_ms":
        return _ms(value)
    if key == "jitter":
        return f"{value * 100:.1f} %"
    if key in ("rps", "output_tps", "goodput_rps"):
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    if key == "vram_peak_bytes":
        return _bytes(value)
    if key == "leak_bytes_per_hour":
        return f"{_bytes(value, signed=True)}/h"
    if key == "tokens_per_joule":
        return f"{value:.3g}"
    if key in ("cost_per_mtok", "cost_per_month"):
        return f"{currency}{value:,.3g}" if value < 1000 else f"{currency}{value:,.0f}"
    return f"{value:g}"


def _ms(value: float) -> str:
    return fmt_ms(value)


def _bytes(value: float, signed: bool = False) -> str:
    sign = "-" if value < 0 else ("+" if signed and value > 0 else "")
    v = abs(value)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{sign}{v / size:.2f} {unit}"
    return f"{sign}{v:.0f} B"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _header_lines(rep: Report) -> list[str]:
    state = "completed" if rep.completed else "not completed (stopped or still running)"
    lines = [
        f"run {rep.run_id}, created {rep.created}, {state}",
        f"active {_duration(rep.active_s)} of a {_duration(rep.plan_s)} plan in "
        f"{rep.sessions} session(s); downtime {_duration(rep.downtime_s)}; "
        f"soakd {', '.join(rep.versions)}",
    ]
    return lines


def _columns(keys: Iterable[str] | None = None) -> list[tuple[str, str, str | None]]:
    return [c for c in METRIC_COLUMNS if keys is None or c[0] in keys]


def _gpu_leak(g: GpuRow) -> str:
    text = fmt_value("leak_bytes_per_hour", g.leak_bytes_per_hour)
    return g.leak_note if text == "-" and g.leak_note else text


def _cell(rep: Report, row: Row, key: str, marked: bool) -> str:
    text = fmt_value(key, value_of(row, key), rep.currency)
    if key == "leak_bytes_per_hour" and text == "-" and row.leak_note:
        text = row.leak_note
    if key == "tokens_per_joule" and row.energy_shared and text != "-":
        text += " (shared)"
    if key == "cost_per_mtok" and row.cost_basis and text != "-" and not marked:
        text += f" ({row.cost_basis})"
    return text + (" ✓" if marked else "")


def _definitions(rep: Report) -> list[str]:
    slices = _duration(rep.slice_s)
    return [
        "Latency percentiles: successful requests only; from the journal's digests "
        "(within ~1 %). TTFT: send to the first content token; ITL: gaps between content "
        "chunks; TPOT: (E2E - TTFT) / (output tokens - 1).",
        f"P99 jitter: stdev / mean of the P99 E2E of {JITTER_SLICES} consecutive {slices} "
        f"slices of plan time, the worst hour (slices with >= {JITTER_MIN_OK} successful "
        f"requests, at least {JITTER_MIN_SLICES}); the P99E2EJitterHigh alert's definition.",
        "Throughput: over active plan time (downtime excluded). ✓ marks the better value; "
        "outside goodput, success and errors, only targets that pass the error criterion "
        "and succeeded on most of their requests compete.",
        "Goodput: requests sent (less those soakd cut at the drain deadline) that succeeded "
        "within every latency SLO of the target, over all of them; error ratio (SLO): 5xx, "
        "transport errors, timeouts and broken streams over the requests that reached the "
        "server (429 and 4xx refusals count against goodput only). docs/slo.md.",
        "Cost per month: the run's cost rate at the measured load x 730 h.",
        "The guard, phase by phase: features on as the phase left them; sheds as soakd "
        "counted them (shed_* outcomes, the phase they were sent in); the gateway's own "
        "breaker openings and rejections as read from it every probes.scrape_interval, in "
        "the phase of the read (so they may lag into the next phase).",
    ]


Section = tuple[str, list[str], list[list[str]]]
"""A titled table (title, header, rows of cells), rendered alike in md, html and terminal."""


def _result(passed: bool | None, note: str = "") -> str:
    if passed is None:
        return f"not judged ({note})" if note else "not judged"
    return "pass" if passed else "FAIL"


def fmt_criterion(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return _ms(value * 1000)
    if unit == "ratio":
        return f"{value * 100:.3g} %"
    if unit == "bytes":  # decimal, as slo.vram_peak is usually written (3.9GB)
        return f"{value / 1e9:.3g} GB" if value >= 1e8 else f"{value / 1e6:.3g} MB"
    return f"{value:,.0f}"


def verdict_title(rep: Report) -> str:
    if rep.passed is None:
        return "Verdict: none (no slo or compare block in the run's config, or nothing measured)"
    return "Verdict: PASS" if rep.passed else "Verdict: FAIL"


def verdict_sections(rep: Report) -> list[Section]:
    """The decision, first: each target against its SLO, then the baseline comparison."""
    out: list[Section] = []
    rows: list[list[str]] = []
    for t in rep.targets:
        v = rep.verdicts.get(t)
        if v is None or not v.criteria:
            continue
        rows.append([t, "all criteria", "", "", _result(v.passed).upper()])
        rows += [
            [
                t,
                c.name,
                fmt_criterion(c.unit, c.measured),
                fmt_criterion(c.unit, c.limit),
                _result(c.passed, c.note),
            ]
            for c in v.criteria
        ]
    out.append((verdict_title(rep), ["target", "criterion", "measured", "limit", "result"], rows))
    cmp = rep.comparison
    if cmp is not None:
        title = (
            f"Candidate {cmp.candidate} against baseline {cmp.baseline}: "
            f"{_result(cmp.passed).upper()}"
        )
        crows = []
        for d in cmp.deltas:
            unit = (
                "s"
                if d.key.endswith(("_p99", "_p50"))
                else ("ratio" if d.key in ("error_ratio", "goodput") else "rate")
            )
            value = (
                (fmt_criterion(unit, d.baseline), fmt_criterion(unit, d.candidate))
                if unit != "rate"
                else tuple("-" if x is None else f"{x:.4g}/s" for x in (d.baseline, d.candidate))
            )
            change = "-" if d.relative is None else f"{d.relative * 100:+.1f} %"
            if d.relative is None and d.delta is not None:
                change = f"{d.delta:+.4g}"
            allowed = f"{d.limit * 100:g} %" if d.limit_kind == "relative" else f"{d.limit:g}"
            crows.append([d.key, value[0], value[1], change, allowed, _result(d.passed, d.note)])
        out.append(
            (
                title,
                ["metric", "baseline", "candidate", "change", "allowed regression", "result"],
                crows,
            )
        )
    return out


def phase_verdict_section(rep: Report, phase: str) -> Section | None:
    verdicts = rep.phase_verdicts.get(phase, {})
    rows = []
    for t in rep.targets:
        v = verdicts.get(t)
        if v is None or not v.criteria:
            continue
        failed = ", ".join(
            f"{c.name} {fmt_criterion(c.unit, c.measured)} > {fmt_criterion(c.unit, c.limit)}"
            for c in v.failed
        )
        why = "no requests" if not v.sent else "nothing measurable"
        rows.append([t, _result(v.passed, why if v.passed is None else ""), failed or "-"])
    if not rows:
        return None
    return (f"Verdicts in phase {phase}", ["target", "verdict", "failed criteria"], rows)


def cost_section(rep: Report) -> Section | None:
    rows = [
        [
            t,
            r.cost_basis or "-",
            fmt_value("cost_per_mtok", r.cost_per_mtok, rep.currency),
            fmt_value("cost_per_month", r.cost_per_month, rep.currency),
            fmt_value("output_tps", r.output_tps),
        ]
        for t in rep.targets
        if (r := rep.overall[t]).cost_basis
    ]
    if not rows:
        return None
    return (
        "Cost at the measured load",
        ["target", "priced as", "per M output tokens", "per month", "output tokens/s"],
        rows,
    )


def guard_section(rep: Report) -> Section | None:
    """The guard gateway, phase by phase (the edge plan's load-shedding stages)."""
    def counts(d: dict[str, int], strip: str = "") -> str:
        return ", ".join(f"{k.removeprefix(strip)} {n:,}" for k, n in sorted(d.items()) if n) or "0"

    rows = []
    for g in rep.guard:
        lo, hi = g.limit_min, g.limit_max
        limit = "-" if lo is None else (f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}")
        rows.append([g.phase, g.target, g.modes, counts(g.breaker_openings),
                     counts(g.shed, "shed_"), counts(g.rejections), limit])
    if not rows:
        return None
    return (
        "The guard, phase by phase",
        ["phase", "target", "features on", "breaker openings", "shed (soakd counted)",
         "gateway rejections", "concurrency limit"],
        rows,
    )


def _md_section(section: Section, level: str = "##") -> list[str]:
    title, header, rows = section
    out = ["", f"{level} {title}", ""]
    if not rows:
        return out[:-1]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _html_section(section: Section, level: str = "h2") -> str:
    e = html.escape
    title, header, rows = section
    out = [f"<{level}>{e(title)}</{level}>"]
    if rows:
        out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            cells = "".join(
                f'<td class="fail">{e(c)}</td>' if c == "FAIL" else f"<td>{e(c)}</td>" for c in row
            )
            out.append(f"<tr>{cells}</tr>")
        out.append("</table>")
    return "".join(out)


def render_markdown(rep: Report) -> str:
    out = [f"# soakd report: {rep.run_id}", ""]
    out += [f"- {line}" for line in _header_lines(rep)]
    for section in verdict_sections(rep):
        out += _md_section(section)
    out += ["", "## Targets side by side", ""]
    out += _md_table(rep, rep.overall, _columns())
    for extra in (cost_section(rep), guard_section(rep)):
        if extra is not None:
            out += _md_section(extra)
    kinds = sorted({k for r in rep.overall.values() for k in r.errors_by_kind})
    if kinds:
        out += [
            "",
            "## Errors by kind",
            "",
            "| kind | " + " | ".join(rep.targets) + " |",
            "|---|" + "---:|" * len(rep.targets),
        ]
        for kind in kinds:
            out.append(
                f"| {kind} | "
                + " | ".join(str(rep.overall[t].errors_by_kind.get(kind, 0)) for t in rep.targets)
                + " |"
            )
    for phase in rep.phases:
        rows = rep.by_phase[phase]
        active = next(iter(rows.values())).active_s if rows else 0.0
        out += ["", f"## Phase {phase} ({_duration(active)} active)", ""]
        out += _md_table(rep, rows, _columns(PHASE_COLUMNS), marks=False)
        verdicts = phase_verdict_section(rep, phase)
        if verdicts is not None:
            out += _md_section(verdicts, "###")
    if rep.gpus:
        out += [
            "",
            "## GPUs",
            "",
            "| GPU | peak used | leak slope | energy | mean power | charged to |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for g in rep.gpus:
            out.append(
                f"| {g.gpu} | {fmt_value('vram_peak_bytes', g.peak_used_bytes)} | "
                f"{_gpu_leak(g)} | "
                f"{'-' if g.energy_j is None else f'{g.energy_j / 3.6e6:.3f} kWh'} | "
                f"{'-' if g.mean_power_w is None else f'{g.mean_power_w:.0f} W'} | "
                f"{', '.join(g.targets) or '-'} |"
            )
    if rep.downtimes:
        out += ["", "## Downtime", ""]
        out += [
            f"- at {d['offset_h']:.3f} h of plan time: down {_duration(d['seconds'])}"
            for d in rep.downtimes
        ]
    for section in slowest_sections(rep.slowest, rep.phases):
        out += _md_section(section)
    out += ["", "## Notes", ""] + [f"- {n}" for n in rep.notes + _definitions(rep)]
    return "\n".join(out) + "\n"


def _md_table(
    rep: Report,
    rows: dict[str, Row],
    columns: list[tuple[str, str, str | None]],
    marks: bool = True,
) -> list[str]:
    lines = ["| metric | " + " | ".join(rep.targets) + " |", "|---|" + "---:|" * len(rep.targets)]
    for key, title, _ in columns:
        cells = []
        for t in rep.targets:
            row = rows.get(t)
            marked = marks and t in rep.best.get(key, [])
            text = "-" if row is None else _cell(rep, row, key, marked)
            cells.append(f"**{text}**" if marked else text)
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def render_json(rep: Report) -> str:
    doc = asdict(rep)
    doc["columns"] = [{"key": k, "title": t, "better": b} for k, t, b in METRIC_COLUMNS]
    return json.dumps(doc, indent=2, default=str) + "\n"


# --- HTML with inline SVG --------------------------------------------------------------------

_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)
_PLOT_TITLES = {
    "latency": ("End-to-end latency", "ms"),
    "ttft": ("TTFT and ITL, p99", "ms"),
    "throughput": ("Throughput", "output tokens/s"),
    "vram": ("GPU memory", "GiB"),
    "errors": ("Errors", "per minute"),
}
_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 10px;border-bottom:1px solid #eee}
td{text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f5f5f5}.best{background:#e3f5e1;font-weight:600}
.fail{background:#fbe3e1;font-weight:600}
.meta{color:#555}.plots{display:flex;flex-wrap:wrap;gap:12px}
svg{background:#fff;border:1px solid #e4e4e4}svg text{font-size:11px;fill:#333}
.notes li{color:#444}
"""


def render_html(rep: Report) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>soakd report {e(rep.run_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>soakd report: {e(rep.run_id)}</h1>",
    ]
    parts += [f'<p class="meta">{e(line)}</p>' for line in _header_lines(rep)]
    parts += [_html_section(section) for section in verdict_sections(rep)]
    parts.append("<h2>Targets side by side</h2>")
    parts.append(_html_table(rep, rep.overall, _columns()))
    for extra in (cost_section(rep), guard_section(rep)):
        if extra is not None:
            parts.append(_html_section(extra))
    kinds = sorted({k for r in rep.overall.values() for k in r.errors_by_kind})
    if kinds:
        parts.append(
            "<h2>Errors by kind</h2><table><tr><th>kind</th>"
            + "".join(f"<th>{e(t)}</th>" for t in rep.targets)
            + "</tr>"
        )
        for kind in kinds:
            parts.append(
                f"<tr><td>{e(kind)}</td>"
                + "".join(
                    f"<td>{rep.overall[t].errors_by_kind.get(kind, 0)}</td>" for t in rep.targets
                )
                + "</tr>"
            )
        parts.append("</table>")
    if rep.plots:
        parts.append('<h2>Over time</h2><div class="plots">')
        markers = [(d["offset_h"], f"down {_duration(d['seconds'])}") for d in rep.downtimes]
        for key, series in rep.plots.items():
            title, unit = _PLOT_TITLES.get(key, (key, ""))
            parts.append(svg_chart(title, unit, series, markers))
        parts.append("</div>")
    for phase in rep.phases:
        rows = rep.by_phase[phase]
        active = next(iter(rows.values())).active_s if rows else 0.0
        parts.append(f"<h2>Phase {e(phase)} ({_duration(active)} active)</h2>")
        parts.append(_html_table(rep, rows, _columns(PHASE_COLUMNS), marks=False))
        verdicts = phase_verdict_section(rep, phase)
        if verdicts is not None:
            parts.append(_html_section(verdicts, "h3"))
    if rep.gpus:
        parts.append(
            "<h2>GPUs</h2><table><tr><th>GPU</th><th>peak used</th><th>leak slope"
            "</th><th>energy</th><th>mean power</th><th>charged to</th></tr>"
        )
        for g in rep.gpus:
            energy = "-" if g.energy_j is None else f"{g.energy_j / 3.6e6:.3f} kWh"
            power = "-" if g.mean_power_w is None else f"{g.mean_power_w:.0f} W"
            parts.append(
                f"<tr><td>{e(g.gpu)}</td><td>{fmt_value('vram_peak_bytes', g.peak_used_bytes)}"
                f"</td><td>{e(_gpu_leak(g))}</td>"
                f"<td>{energy}</td><td>{power}</td><td>{e(', '.join(g.targets) or '-')}</td>"
                "</tr>"
            )
        parts.append("</table>")
    parts += [_html_section(s) for s in slowest_sections(rep.slowest, rep.phases)]
    parts.append('<h2>Notes</h2><ul class="notes">')
    parts += [f"<li>{e(n)}</li>" for n in rep.notes + _definitions(rep)]
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"


def _html_table(
    rep: Report,
    rows: dict[str, Row],
    columns: list[tuple[str, str, str | None]],
    marks: bool = True,
) -> str:
    e = html.escape
    out = [
        "<table><tr><th>metric</th>" + "".join(f"<th>{e(t)}</th>" for t in rep.targets) + "</tr>"
    ]
    for key, title, _ in columns:
        cells = []
        for t in rep.targets:
            row = rows.get(t)
            marked = marks and t in rep.best.get(key, [])
            text = "-" if row is None else _cell(rep, row, key, marked)
            cells.append(f'<td class="best">{e(text)}</td>' if marked else f"<td>{e(text)}</td>")
        out.append(f"<tr><td>{e(title)}</td>{''.join(cells)}</tr>")
    out.append("</table>")
    return "".join(out)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    return ticks


def svg_chart(
    title: str,
    unit: str,
    series: list[Series],
    markers: Sequence[tuple[float, str]] = (),
    width: int = 520,
    height: int = 260,
) -> str:
    """A line chart as inline SVG: x in plan hours (minutes or seconds for short runs)."""
    e = html.escape
    left, right, top, bottom = 60, 24, 28, 62
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in series for x, y in s.points if y is not None]
    ys = [y for s in series for _, y in s.points if y is not None]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title)}">',
        f'<text x="{left}" y="16" font-weight="600">{e(title)} ({e(unit)})</text>',
    ]
    if not xs:
        out.append(f'<text x="{left + 10}" y="{top + ph / 2}">no data</text></svg>')
        return "".join(out)
    x_hi = max(max(xs), *(m[0] for m in markers)) if markers else max(xs)
    xunit, xscale = "hours", 1.0
    if x_hi < 2:
        xunit, xscale = ("minutes", 60.0) if x_hi >= 2 / 60 else ("seconds", 3600.0)
    x0, x1 = 0.0, x_hi * xscale or 1.0
    y0, y1 = 0.0, max(ys) * 1.08 or 1.0

    def px(x: float) -> float:
        return left + (x * xscale - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    for t in _nice_ticks(y0, y1):
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _nice_ticks(x0, x1):
        x = left + (t - x0) / (x1 - x0) * pw
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#888"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{t:g}</text>')
    out.append(
        f'<text x="{left + pw / 2}" y="{top + ph + 30}" text-anchor="middle">'
        f"plan time ({xunit})</text>"
    )
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    for x, label in markers:
        mx = px(x)
        out.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{top}" y2="{top + ph}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
        out.append(f'<text x="{mx + 3:.1f}" y="{top + 12}" fill="#666">{e(label)}</text>')
    legend_x, legend_y = left, top + ph + 46
    groups = list(dict.fromkeys(s.group or s.label for s in series))
    for i, s in enumerate(series):
        color = _COLORS[groups.index(s.group or s.label) % len(_COLORS)]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        for segment in _segments(s.points):
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in segment)
            if len(segment) == 1:
                x, y = segment[0]
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" fill="{color}"/>')
            else:
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{color}" '
                    f'stroke-width="1.6"{dash}/>'
                )
        lx = legend_x + (i % 3) * (pw // 3)
        ly = legend_y + (i // 3) * 14
        out.append(
            f'<line x1="{lx}" x2="{lx + 16}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 20}" y="{ly}">{e(s.label)}</text>')
    out.append("</svg>")
    svg = "".join(out)
    extra = max(0, (len(series) - 1) // 3) * 14
    if extra:  # more legend rows than the frame holds: grow it
        svg = svg.replace(
            f'height="{height}" viewBox="0 0 {width} {height}"',
            f'height="{height + extra}" viewBox="0 0 {width} {height + extra}"',
            1,
        )
    return svg


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    segs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if segs[-1]:
                segs.append([])
        else:
            segs[-1].append((x, y))
    return [s for s in segs if s]


# --- terminal ----------------------------------------------------------------------------------


def terminal_summary(rep: Report) -> list[Any]:
    """Rich renderables for ``soakd run``'s end and ``soakd report --format text``."""
    from rich.table import Table
    from rich.text import Text

    head = Text("\n".join(_header_lines(rep)))
    table = Table(title="targets side by side (✓ better)", title_justify="left")
    table.add_column("metric")
    for t in rep.targets:
        table.add_column(t, justify="right")
    for key, title, _ in _columns(TERMINAL_COLUMNS):
        cells = []
        for t in rep.targets:
            marked = t in rep.best.get(key, [])
            text = _cell(rep, rep.overall[t], key, marked)
            cells.append(Text(text, style="bold green" if marked else ""))
        table.add_row(title, *cells)
    out: list[Any] = [head]
    for title, header, rows in verdict_sections(rep):
        if not rows:
            out.append(Text(title, style="bold"))
            continue
        vt = Table(title=title, title_justify="left", title_style="bold")
        for i, h in enumerate(header):
            vt.add_column(h, justify="left" if i in (0, 1) else "right")
        for row in rows:
            vt.add_row(
                *(
                    Text(
                        c,
                        style="bold red" if c == "FAIL" else ("bold green" if c == "PASS" else ""),
                    )
                    for c in row
                )
            )
        out.append(vt)
    out.append(table)
    guard = guard_section(rep)
    if guard is not None:
        title, header, rows = guard
        gt = Table(title=title, title_justify="left")
        for h in header:
            gt.add_column(h)
        for row in rows:
            gt.add_row(*row)
        out.append(gt)
    kinds = sorted({k for r in rep.overall.values() for k in r.errors_by_kind})
    if kinds:
        errors = Table(title="errors by kind", title_justify="left")
        errors.add_column("kind")
        for t in rep.targets:
            errors.add_column(t, justify="right")
        for kind in kinds:
            errors.add_row(
                kind, *(str(rep.overall[t].errors_by_kind.get(kind, 0)) for t in rep.targets)
            )
        out.append(errors)
    out += [Text(f"note: {note}", style="dim") for note in rep.notes]
    return out


def write_report(
    run_dir: Path, fmt: str, out: Path | None, energy_price_per_kwh: float | None = None
) -> str:
    """Build and render; writes ``out`` atomically when given, returns the text."""
    rep = build_report(run_dir, energy_price_per_kwh=energy_price_per_kwh)
    return write_built(rep, fmt, out)


def write_built(rep: Report, fmt: str, out: Path | None) -> str:
    """Render a built report; writes ``out`` atomically when given, returns the text."""
    render = {"md": render_markdown, "html": render_html, "json": render_json}[fmt]
    text = render(rep)
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    return text


def check_lines(rep: Report) -> list[str]:
    """``soakd report --check``'s plain-text verdict: one line per target and comparison,
    each failing criterion with its measured value and limit."""
    lines = [verdict_title(rep)]
    for t in rep.targets:
        v = rep.verdicts.get(t)
        if v is None or not v.criteria:
            continue
        failed = "; ".join(
            f"{c.name} {fmt_criterion(c.unit, c.measured)} (limit {fmt_criterion(c.unit, c.limit)}"
            f"{', ' + c.note if c.note else ''})"
            for c in v.failed
        )
        goodput = fmt_value("goodput", v.goodput)
        lines.append(
            f"{t}: {_result(v.passed).upper()}, goodput {goodput}"
            + (f": {failed}" if failed else "")
        )
    cmp = rep.comparison
    if cmp is not None:
        worse = "; ".join(
            f"{d.key} {'-' if d.regression is None else f'{d.regression:.4g}'} "
            f"(allowed {d.limit:g}{' relative' if d.limit_kind == 'relative' else ''})"
            for d in cmp.deltas
            if d.passed is False
        )
        lines.append(
            f"compare {cmp.candidate} against {cmp.baseline}: "
            f"{_result(cmp.passed).upper()}" + (f": {worse}" if worse else "")
        )
    return lines


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
