"""Report room, build: the journal in a run directory -> a ``Report`` of plain numbers.

Reads the journal (read-only) and wires the pure parts: ``analysis`` (jitter, leak slope,
best, energy attribution), ``cost``, ``goodput`` and ``verdicts``. The renderers only
format what this returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from soakd.analysis import (
    JITTER_SLICES,
    JITTER_WINDOW_S,
    LATENCY_TIE,
    GpuEnergy,
    Quantiles,
    TargetStats,
    best_of,
    energy_share,
    fmt_ms,
    ms,
    slice_p99,
    worst_window_jitter,
)
from soakd.config import Compare, Slo, TargetCost, format_duration
from soakd.cost import cost_line
from soakd.goodput import Tally, error_counts, journal_tallies
from soakd.journal import JournalReader, Loss, Rollup, records
from soakd.journal.records import Logged, each
from soakd.model import NS_PER_S, MissReason
from soakd.notes import by_target, describe
from soakd.report import names
from soakd.report.failing import failing_notes
from soakd.report.model import (
    LATENCY_KINDS,
    METRIC_COLUMNS,
    NOT_RANKED,
    Doc,
    Downtime,
    GpuRow,
    Report,
    Row,
    value_of,
)
from soakd.report.plots import plots, slo_lines
from soakd.report.prompt_tokens import prompt_notes, prompt_tokens
from soakd.report.samples import Samples, Session, Timeline, guard_rows, vram
from soakd.report.tested import served_tokens, what_was_tested
from soakd.slowest import DEFAULT_N, slowest
from soakd.verdicts import CompareVerdict, Verdict, compare, eligible_for_best, judge
from soakd.verdicts import overall as overall_verdict

HOUR_S = 3600.0
JOULES_PER_KWH = 3.6e6


def _rows_stopped_notes(events: list[Logged]) -> list[str]:
    """A note per session that stopped writing request rows near the journal's budget."""
    return [
        f"session {row.session} stopped writing per-request rows at "
        f"{row.offset_s / HOUR_S:.2f} h (the journal reached 90 % of "
        f"journal.max_bytes, {e.max_bytes / 1e9:.2f} GB): percentiles, "
        "counts, error ratios and plots come from the rollups and stay whole; goodput covers "
        "the rows kept; the export holds no rows after that point"
        for row, e in each(events, records.RowsStopped)
    ]


def _journal_warnings(
    reader: JournalReader,
    events: list[Logged],
    measured: int,
    journaled: int,
    rows: int,
) -> list[str]:
    """What the journal lost or could not keep: the report's (and the run summary's) first
    lines, with the counts, never a note at the end."""
    out = []
    failed = False
    if reader.salvaged is not None:
        out.append(reader.salvaged.describe())
    if reader.loss is not None:
        out.append(reader.loss.describe())
    for row in events:
        match row.event:
            case records.JournalLoss() as e:
                loss = Loss(e.rows, e.requests, e.offset_ns, e.held_offset_ns)
                out.append(f"{loss.describe()} (found when session {row.session} resumed the run)")
            case records.JournalWriteErrors() as e:
                failed = True
                start = format_duration(e.from_offset_ns / NS_PER_S)
                end = format_duration(e.to_offset_ns / NS_PER_S)
                until = "the end of the session" if e.until_end else end
                failures = "?" if e.failures is None else e.failures
                out.append(
                    f"the journal could not write from {start} of plan time to {until} "
                    f"({failures} failed writes: {'?' if e.error is None else e.error})"
                )
    if measured > journaled:
        why = (
            "the damaged pages held their windows"
            if reader.salvaged is not None
            else "its queue was full or it could not write"
        )
        out.append(
            f"{measured - journaled:,} of the {measured:,} requests measured are not in the "
            f"journal's windows ({why}): the tables count the {journaled:,} journaled; "
            "percentiles, plots and the export leave the others out"
        )
    if failed and rows < min(measured, journaled):
        out.append(
            f"{min(measured, journaled) - rows:,} request(s) in the tables have no row in the "
            "journal (written while the disk was full: counted, not stored): the export lacks "
            "them; goodput and the error ratio count the rows"
        )
    return out


def _no_reuse_notes(events: list[Logged]) -> list[str]:
    """A note per target and answer status after which its server closed its connections
    without saying so (soakd/targets/pool.py, journaled as ``no_reuse`` events)."""
    seen: dict[tuple[str, int], list[tuple[float, bool]]] = {}
    for row, e in each(events, records.NoReuse):
        seen.setdefault((e.target, e.status), []).append((row.offset_s / HOUR_S, e.closes))
    notes = []
    for (target, status), changes in seen.items():
        first = next((h for h, closes in changes if closes), None)
        if first is None:
            continue
        again = sum(1 for _, closes in changes if not closes)
        notes.append(
            f"{target}: the server closed its connections after {status} answers without "
            f"saying so (no Connection: close), first seen at {first:.2f} h"
            + (f", then kept them again {again} time(s)" if again else "")
            + ": soakd reused no connection after such an answer while that held, so each "
            "request after one opened a new connection (its connect is in its TTFT)"
        )
    return notes


def build_report(
    run_dir: Path,
    *,
    energy_price_per_kwh: float | None = None,
    judge_by: dict[str, Any] | None = None,
    slowest_n: int = DEFAULT_N,
    salvage: bool = False,
) -> Report:
    """Everything the report says, from the journal in ``run_dir`` (read-only).
    ``judge_by``: another config document whose slo, compare, costs and report sections
    replace the run's own (``soakd report --config``). ``salvage``: a damaged journal is
    read for what is readable (integrity.py), said in the report's first lines."""
    with JournalReader(run_dir, salvage=salvage) as reader:
        meta = reader.meta
        sessions = reader.sessions()
        events = reader.events()
        totals = reader.totals()
        span_ns = reader.span_ns()  # long runs: 5-minute windows, merged as read (reader.py)
        rollups = reader.rollups(span_ns=span_ns)
        missed = reader.missed()
        answer_notes = by_target(reader.notes())  # usage not taken, off the stream...
        series = reader.series()
        samples = reader.samples(names.SAMPLE_NAMES)
        window_s = span_ns / NS_PER_S
        config: Doc = meta.get("config", {})
        if judge_by is not None:
            config = decisions_from(config, judge_by)
        targets = [t["name"] for t in config.get("targets", [])]
        for r in rollups:
            if r.target not in targets:
                targets.append(r.target)
        slos, spec, slo_note = _decision_config(config, targets)
        tallies = {t: journal_tallies(reader.conn, t, slos[t]) for t in targets}
        slow = slowest(reader, slowest_n, rollups)
        tested = what_was_tested(meta, sessions, events, served_tokens(reader.conn))
        prompt_rows, prompt_sizing = prompt_tokens(reader.conn, config, events, targets)
        measured = sum(t.requests for t in totals)
        in_windows = sum(r.stats.requests for r in rollups)
        rows = sum(_counted(tallies[t][0]) for t in targets)
        warnings = _journal_warnings(reader, events, measured, in_windows, rows)
    plan_phases = [
        (p["name"], p["start_ns"] / NS_PER_S, p["end_ns"] / NS_PER_S)
        for p in meta["plan"]["phases"]
    ]
    reached = max((s["offset_ns"] for s in sessions), default=0) / NS_PER_S
    plan_s = plan_phases[-1][2] if plan_phases else 0.0
    active_s = min(reached, plan_s) if plan_s else reached
    phase_names = list(dict.fromkeys(name for name, start, _ in plan_phases if start < active_s))
    for r in rollups:
        if r.phase not in phase_names:
            phase_names.append(r.phase)
    phase_active: dict[str, float] = {}
    for name, start, end in plan_phases:
        phase_active[name] = phase_active.get(name, 0.0) + max(0.0, min(end, active_s) - start)
    timeline = Timeline(
        [
            Session(
                s["started_wall"],
                s["started_offset_ns"] / NS_PER_S,
                s["wall"],
                s["offset_ns"] / NS_PER_S,
            )
            for s in sessions
        ],
        plan_phases,
    )
    downtimes = [
        Downtime(offset_h=row.offset_s / HOUR_S, seconds=e.seconds)
        for row, e in each(events, records.Downtime)
    ]
    completed = any(e.completed for _, e in each(events, records.RunStopped))
    jitter_window_s = JITTER_WINDOW_S if active_s >= 2 * JITTER_WINDOW_S else active_s
    slice_s = max(window_s, jitter_window_s / JITTER_SLICES)
    slice_s = max(window_s, round(slice_s / window_s) * window_s)

    # requests: rollups merged per target, per (target, phase), per window
    overall: dict[str, Row] = {}
    by_phase: dict[str, dict[str, Row]] = {p: {} for p in phase_names}
    oom_rows: dict[tuple[str, str], int] = {}
    for counted in totals:
        key = (counted.target, counted.phase)
        oom_rows[key] = oom_rows.get(key, 0) + counted.oom
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
    probe = Samples(series, samples, timeline)
    for target in targets:
        restarts = probe.increase(names.TARGET_RESTARTS, {"target": target})
        ooms = probe.increase(names.TARGET_OOM_EVENTS, {"target": target})
        for row in (overall[target], *(by_phase[p][target] for p in phase_names)):
            row.restarts = _count(restarts, row.phase)
            row.oom_events = _count(ooms, row.phase)
    gpus, gpu_energy = probe.gpus(probe.charged(targets, config))
    guard = guard_rows(probe, by_phase, targets, phase_names, config, events)
    vram(overall, targets, probe, gpus)
    price = energy_price_per_kwh
    if price is None:
        price = config.get("report", {}).get("energy_price_per_kwh")
    currency = str(config.get("report", {}).get("currency", "$"))
    _energy_and_cost(overall, by_phase, targets, config, gpu_energy, price, notes)
    if tested.rehearsal:
        _project_nothing(overall, by_phase, gpus)
    if slo_note:
        notes.append(slo_note)
    verdicts, phase_verdicts = _verdicts(overall, by_phase, targets, slos, tallies)
    comparison: CompareVerdict | None = (
        compare(spec, overall, verdicts) if spec is not None else None
    )
    journaled = {t: tallies[t][0] for t in targets}
    short = {t: n for t in targets if (n := overall[t].requests - _counted(journaled[t])) > 0}
    if short:
        notes.append(
            "goodput counts the journaled request rows: "
            + ", ".join(
                f"{t} has {n} fewer (retention, dropped records or journal.max_bytes)"
                for t, n in short.items()
            )
        )
    if not samples or not any(samples.values()):
        notes.append(
            "no probe samples in the journal: OOM events, restarts, VRAM and "
            "energy are not measured"
        )
    if any(each(events, records.Retention)):
        notes.append(
            "retention deleted old rows; totals, percentiles and plots still cover "
            "the whole run (rollups are kept), the export does not"
        )

    notes += _rows_stopped_notes(events)  # journal.max_bytes (soakd/journal/budget.py)
    notes += _no_reuse_notes(events)  # closes after answers, unannounced (targets/pool.py)
    notes[:0] = failing_notes(events, overall, targets, active_s)  # first: the biggest news
    notes += _client_limits(overall, targets, config)
    notes += [f"{t}: {line}" for t in targets for line in describe(answer_notes.get(t, {}))]
    notes += prompt_notes(prompt_rows, prompt_sizing)
    eligible = {t for t in targets if eligible_for_best(overall[t], verdicts.get(t))}
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
        best=best(overall, targets, eligible),
        plots=plots(rollups, targets, window_s, probe, gpus, active_s),
        notes=notes,
        warnings=warnings,
        currency=currency,
        slice_s=slice_s,
        verdicts=verdicts,
        phase_verdicts=phase_verdicts,
        comparison=comparison,
        passed=overall_verdict(verdicts.values(), comparison),
        slowest=slow,
        tested=tested,
        plot_phases=[(start / HOUR_S, name) for name, start, _ in plan_phases if start < active_s],
        plot_limits=slo_lines(slos, targets),
        answer_notes=answer_notes,
        prompt_tokens=prompt_rows,
        prompt_sizing=prompt_sizing,
    )


DECISION_KEYS = ("slo", "compare", "report")
TARGET_DECISION_KEYS = ("slo", "cost")


def decisions_from(stored: Doc, other: Doc) -> dict[str, Any]:
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


REHEARSAL_NOTE = "a rehearsal: not projected"


def _project_nothing(
    overall: dict[str, Row], by_phase: dict[str, dict[str, Row]], gpus: list[GpuRow]
) -> None:
    """A rehearsal compresses the plan: a month at its load or a slope per hour of its
    compressed time would be made up, so neither is given."""
    for row in (*overall.values(), *(r for p in by_phase.values() for r in p.values())):
        row.cost_per_month = None
        if row.leak_bytes_per_hour is not None or row.leak_note is not None:
            row.leak_bytes_per_hour, row.leak_note = None, REHEARSAL_NOTE
    for g in gpus:
        g.leak_bytes_per_hour, g.leak_note = None, REHEARSAL_NOTE


def _count(per_phase: dict[str, float] | None, phase: str | None) -> int | None:
    """A counter's increase over the run (``phase`` None) or one phase; None: no series."""
    if per_phase is None:
        return None
    return round(sum(per_phase.values()) if phase is None else per_phase.get(phase, 0.0))


def _counted(t: Tally) -> int:
    return t.sent + t.excluded + t.unsent


def _decision_config(
    config: Doc, targets: list[str]
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
    """Goodput into the rows (the error ratios are there already: ``_row``), and each
    target judged over the run and per phase."""
    verdicts: dict[str, Verdict] = {}
    phase_verdicts: dict[str, dict[str, Verdict]] = {p: {} for p in by_phase}
    for t in targets:
        whole, phases = tallies[t]
        pairs = [(overall[t], whole)] + [(by_phase[p][t], phases.get(p, Tally())) for p in by_phase]
        for row, tally in pairs:
            v = judge(t, row.phase, slos[t], row, tally)
            row.goodput, row.goodput_rps = v.goodput, v.goodput_rps
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
    row.errors_by_kind = dict(sorted(stats.errors.items()))
    counted = error_counts(stats.requests, stats.errors)  # the one basis (goodput.py)
    row.errors, row.server_errors = counted.failed, counted.server
    row.shed, row.not_judged = counted.shed, counted.excluded
    row.error_ratio, row.server_error_ratio = counted.error_ratio, counted.server_error_ratio
    attempted = stats.requests - counted.excluded
    row.success_rate = stats.ok / attempted if attempted else None
    row.lag_p99_ms = ms(stats.lag.quantile(0.99))
    row.output_tokens = stats.output_tokens
    row.prompt_tokens = stats.prompt_tokens
    if active_s > 0:
        row.rps = stats.ok / active_s
        row.attempt_rps = stats.requests / active_s
        row.output_tps = stats.output_tokens / active_s
    for kind in LATENCY_KINDS:
        digest = getattr(stats, kind)
        row.latency_ms[kind] = Quantiles(
            p50=ms(digest.quantile(0.5)),
            p95=ms(digest.quantile(0.95)),
            p99=ms(digest.quantile(0.99)),
        )
    p99s = {i: v for i, s in slices.items() if (v := slice_p99(s)) is not None}
    row.jitter, row.jitter_slices = worst_window_jitter(p99s, JITTER_SLICES)
    return row


DEFAULT_LAG_LIMIT_S = 0.1


def _client_limits(overall: dict[str, Row], targets: list[str], config: Doc) -> list[str]:
    """Say so when soakd itself was the bottleneck: its dispatch lag past the limit, or
    planned sends it could not make in time. Those latency figures are the client's."""
    limits = config.get("alert_limits") or {}
    limit_s = float(limits.get("dispatch_lag") or DEFAULT_LAG_LIMIT_S)
    notes = []
    for t in targets:
        row = overall[t]
        late = row.missed_by_reason.get(MissReason.LATE, 0)
        lagged = row.lag_p99_ms is not None and row.lag_p99_ms > limit_s * 1e3
        if lagged or late:
            why = []
            if lagged:
                lag = fmt_ms(row.lag_p99_ms or 0)
                why.append(f"dispatch lag p99 {lag} (limit {fmt_ms(limit_s * 1e3)})")
            if late:
                why.append(f"{late:,} planned sends too late to make")
            notes.append(
                f"CLIENT-LIMITED: soakd could not keep up with {t}'s schedule "
                f"({'; '.join(why)}): its latency and rate figures measure soakd as much as "
                "the target (give soakd more CPU, or lower the load)"
            )
    for t in targets:
        row = overall[t]
        capped = row.missed_by_reason.get(MissReason.IN_FLIGHT_CAP)
        if capped:
            notes.append(
                f"{t}: {capped:,} planned sends found "
                "max_in_flight requests already out and were not made (the target could "
                "not keep up with the offered rate)"
            )
    return notes


def _energy_and_cost(
    overall: dict[str, Row],
    by_phase: dict[str, dict[str, Row]],
    targets: list[str],
    config: Doc,
    gpus: Sequence[GpuEnergy],
    price: float | None,
    notes: list[str],
) -> None:
    """Each row's energy (``analysis.energy_share``) and cost (``cost.cost_line``)."""
    costs: dict[str, TargetCost] = {}
    for t in config.get("targets", []):
        try:
            costs[t["name"]] = TargetCost.model_validate(t.get("cost") or {})
        except ValidationError:
            costs[t["name"]] = TargetCost()
            notes.append(f"targets[{t['name']}].cost could not be read: not costed")
    shared = False
    for target in targets:
        for row in (overall[target], *(by_phase[p][target] for p in by_phase)):
            scope = overall if row.phase is None else by_phase[row.phase]
            share = energy_share(
                target, gpus, {t: r.output_tokens for t, r in scope.items()}, row.phase
            )
            if share is not None:
                row.energy_j, row.energy_shared = share.joules, share.shared
                row.tokens_per_joule = share.tokens_per_joule
                shared = shared or share.shared
            energy = None
            if price is not None and row.energy_j is not None and not row.energy_shared:
                energy = (row.energy_j / JOULES_PER_KWH * price, f"energy at {price:g}/kWh")
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


def best(
    overall: dict[str, Row], targets: list[str], eligible: set[str] | None = None
) -> dict[str, list[str]]:
    """Per metric, the target(s) with the better value, when there is a contest. Outside
    NOT_RANKED only ``eligible`` targets compete (a target that failed most requests is
    never best on latency); latencies within ``LATENCY_TIE`` of each other are a tie."""
    out: dict[str, list[str]] = {}
    for key, _, better in METRIC_COLUMNS:
        if better is None:
            continue
        pool = (
            targets
            if eligible is None or key in NOT_RANKED
            else [t for t in targets if t in eligible]
        )
        values = {t: v for t in pool if (v := value_of(overall[t], key)) is not None}
        winners = best_of(values, better, LATENCY_TIE if "." in key else 0.0)
        if winners:
            out[key] = winners
    return out
