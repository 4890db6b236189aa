"""Report room, build: the journal in a run directory -> a ``Report`` of plain numbers.

Reads the journal (read-only) and wires the pure parts: ``analysis`` (jitter, leak slope,
best, energy attribution), ``cost``, ``goodput`` and ``verdicts``. The renderers only
format what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from soakd.config import format_duration
from soakd.journal import JournalReader, Loss, Rollup, records
from soakd.journal.reader import StoredSession, Total
from soakd.journal.records import Logged, each
from soakd.journal.stored import StoredRun, StoredTarget
from soakd.measure.analysis import JITTER_SLICES, JITTER_WINDOW_S
from soakd.measure.goodput import Tally, journal_tallies
from soakd.measure.notes import by_target, describe
from soakd.measure.verdicts import compare, eligible_for_best
from soakd.measure.verdicts import overall as overall_verdict
from soakd.model import NS_PER_S
from soakd.report import names
from soakd.report.breakdowns import breakdowns
from soakd.report.capacity import read_capacity, share_notes, sweep_notes
from soakd.report.checks import checked, correct_ratio
from soakd.report.decisions import (
    Judging,
    best,
    client_limits,
    costs,
    decisions_from,
    judging,
    verdicts,
    with_goodput,
)
from soakd.report.failing import failing_notes
from soakd.report.model import Breakdown, Downtime, OutputTokens, PromptTokens, Report, Tested
from soakd.report.output_tokens import Answers, output_notes, output_tokens
from soakd.report.plots import plots, slo_lines
from soakd.report.prefix_cache import prefix_rows
from soakd.report.prompt_tokens import prompt_notes, prompt_tokens
from soakd.report.rows import (
    Frame,
    Rows,
    energy_and_cost,
    measured,
    probe_counts,
    request_rows,
    unprojected,
)
from soakd.report.samples import Samples, Session, Timeline, guard_rows, vram
from soakd.report.slowest import DEFAULT_N, SlowRequest, slowest
from soakd.report.tested import served_tokens, what_was_tested

HOUR_S = 3600.0


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
    judge_by: Mapping[str, object] | None = None,
    slowest_n: int = DEFAULT_N,
    salvage: bool = False,
) -> Report:
    """Everything the report says, from the journal in ``run_dir`` (read-only).
    ``judge_by``: another config document whose slo, compare, costs and report sections
    replace the run's own (``soakd report --config``). ``salvage``: a damaged journal is
    read for what is readable (integrity.py), said in the report's first lines."""
    read = _read(run_dir, judge_by, slowest_n, salvage=salvage)
    frame, timeline = _frame(read)
    config, targets = read.stored.config, frame.targets
    requests = request_rows(frame, read.rollups, read.totals, read.missed)
    probe = Samples(read.series, read.samples, timeline)
    gpus, gpu_energy = probe.gpus(probe.charged(targets, config))
    charged, cost_notes = costs(config)
    price = energy_price_per_kwh
    if price is None:
        price = config.report.energy_price_per_kwh
    money, money_notes = energy_and_cost(requests, targets, charged, gpu_energy, price)
    counts, vrams = probe_counts(probe, frame), vram(targets, probe, gpus)
    rehearsal = read.tested.rehearsal
    shown = unprojected(gpus) if rehearsal else gpus
    rows = requests.map(
        lambda r: measured(
            r,
            counts[(r.target, r.phase)],
            vrams[r.target].of(r.phase) if r.target in vrams else None,
            money[(r.target, r.phase)],
            rehearsal=rehearsal,
        )
    )
    answers = checked(
        read.events,
        {(t, p): r.requests for p, by in rows.by_phase.items() for t, r in by.items()},
        targets,
    )
    if answers is not None:  # the checks' pass ratio, judged by slo.correct_ratio
        rows = rows.map(
            lambda r: replace(r, correct_ratio=correct_ratio(answers, r.target, r.phase))
        )
    judged = verdicts(rows, targets, read.judging.slos, read.tallies)
    rows = rows.map(lambda r: with_goodput(r, judged.of(r)))
    spec = read.judging.spec
    comparison = compare(spec, rows.overall, judged.whole) if spec is not None else None
    eligible = {t for t in targets if eligible_for_best(rows.overall[t], judged.whole.get(t))}
    notes = [
        *failing_notes(read.events, rows.overall, targets, frame.active_s),  # the biggest news
        *(f"identity at start: {line}" for line in (answers.started if answers else [])),
        *(f"identity changed: {line}" for line in (answers.identity if answers else [])),
        *cost_notes,
        *money_notes,
        *_notes(read, rows, frame),
        *share_notes(read.stored.config_document),
        *sweep_notes(run_dir),
    ]
    plan = read.stored.plan
    return Report(
        run_id=read.stored.run_id,
        created=read.stored.created,
        versions=sorted({s.version for s in read.sessions}),
        sessions=len(read.sessions),
        completed=any(e.completed for _, e in each(read.events, records.RunStopped)),
        active_s=frame.active_s,
        plan_s=plan.end_s,
        downtime_s=sum(d["seconds"] for d in read.downtimes),
        downtimes=read.downtimes,
        targets=targets,
        phases=frame.phases,
        overall=rows.overall,
        by_phase=rows.by_phase,
        gpus=shown,
        guard=guard_rows(probe, requests.by_phase, targets, frame.phases, config, read.events),
        best=best(rows.overall, targets, eligible),
        plots=plots(read.rollups, targets, frame.window_s, probe, shown, frame.active_s),
        notes=notes,
        warnings=read.warnings,
        currency=config.report.currency,
        slice_s=frame.slice_s,
        verdicts=judged.whole,
        phase_verdicts=judged.phases,
        comparison=comparison,
        passed=overall_verdict(judged.whole.values(), comparison),
        slowest=read.slowest,
        tested=read.tested,
        plot_phases=[
            (p.start_ns / NS_PER_S / HOUR_S, p.name)
            for p in plan.phases
            if p.start_ns / NS_PER_S < frame.active_s
        ],
        plot_limits=slo_lines(read.judging.slos, targets),
        answer_notes=read.answer_notes,
        prompt_tokens=read.prompt_rows,
        prompt_sizing=read.prompt_sizing,
        output_tokens=read.output_rows,
        breakdowns=read.breakdowns,
        prefix_cache=prefix_rows(probe, config.workload, targets, frame.phases),
        checks=answers,
        capacity=read_capacity(run_dir),
    )


@dataclass(frozen=True)
class _Read:
    """What the report reads of the journal, read once, the connection closed after."""

    stored: StoredRun  # judged by ``judge_by`` when given
    targets: list[str]  # the config's, then any the rollups name besides
    sessions: list[StoredSession]
    events: list[Logged]
    totals: list[Total]
    window_s: float
    rollups: list[Rollup]
    missed: dict[tuple[str, str, str], int]
    answer_notes: dict[str, dict[str, int]]
    series: dict[int, tuple[str, dict[str, str]]]
    samples: dict[int, list[tuple[float, float]]]
    judging: Judging
    tallies: dict[str, tuple[Tally, dict[str, Tally]]]
    slowest: dict[str, dict[str, list[SlowRequest]]]
    tested: Tested
    prompt_rows: list[PromptTokens]
    prompt_sizing: str | None
    output_rows: list[OutputTokens]
    warnings: list[str]
    downtimes: list[Downtime]
    breakdowns: list[Breakdown]


def _read(
    run_dir: Path, judge_by: Mapping[str, object] | None, slowest_n: int, *, salvage: bool
) -> _Read:
    with JournalReader(run_dir, salvage=salvage) as reader:
        stored = reader.stored
        if judge_by is not None:
            stored = stored.model_copy(update={"config": decisions_from(stored.config, judge_by)})
        sessions = reader.sessions()
        events = reader.events()
        totals = reader.totals()
        span_ns = reader.span_ns()  # long runs: 5-minute windows, merged as read (reader.py)
        rollups = reader.rollups(span_ns=span_ns)
        targets = [t.name for t in stored.config.targets]
        targets += list(dict.fromkeys(r.target for r in rollups if r.target not in targets))
        judging_by = judging(stored.config, targets)
        tallies = {t: journal_tallies(reader.conn, t, judging_by.slos[t]) for t in targets}
        served = served_tokens(reader.conn)
        prompt_rows, prompt_sizing = prompt_tokens(
            reader.conn, stored.config.workload, events, targets
        )
        answers = Answers(stored.config.workload)  # planned answer lengths, rebuilt
        output_rows = output_tokens(reader.conn, stored.config, answers, targets)
        measured = sum(t.requests for t in totals)
        in_windows = sum(r.stats.requests for r in rollups)
        rows = sum(_counted(tallies[t][0]) for t in targets)
        return _Read(
            stored=stored,
            targets=targets,
            sessions=sessions,
            events=events,
            totals=totals,
            window_s=span_ns / NS_PER_S,
            rollups=rollups,
            missed=reader.missed(),
            answer_notes=by_target(reader.notes()),  # usage not taken, off the stream...
            series=reader.series(),
            samples=reader.samples(names.SAMPLE_NAMES),
            judging=judging_by,
            tallies=tallies,
            slowest=slowest(reader, slowest_n, rollups),
            tested=what_was_tested(stored, sessions, events, served, answers.described),
            prompt_rows=prompt_rows,
            prompt_sizing=prompt_sizing,
            output_rows=output_rows,
            warnings=_journal_warnings(reader, events, measured, in_windows, rows),
            downtimes=[
                Downtime(offset_h=row.offset_s / HOUR_S, seconds=e.seconds)
                for row, e in each(events, records.Downtime)
            ],
            breakdowns=breakdowns(
                reader.conn,
                reader.version,
                targets,
                list(dict.fromkeys(p.name for p in stored.plan.phases)),
            ),
        )


def _frame(read: _Read) -> tuple[Frame, Timeline]:
    """The plan time the run covered (active seconds, the phases it reached, the jitter's
    slices) and the sessions that map wall-clock readings onto it."""
    phases = [(p.name, p.start_ns / NS_PER_S, p.end_ns / NS_PER_S) for p in read.stored.plan.phases]
    reached = max((s.offset_ns for s in read.sessions), default=0) / NS_PER_S
    plan_s = read.stored.plan.end_s
    active_s = min(reached, plan_s) if plan_s else reached
    names_ = list(dict.fromkeys(name for name, start, _ in phases if start < active_s))
    names_ += list(dict.fromkeys(r.phase for r in read.rollups if r.phase not in names_))
    phase_active: dict[str, float] = {}
    for name, start, end in phases:
        phase_active[name] = phase_active.get(name, 0.0) + max(0.0, min(end, active_s) - start)
    window_s = read.window_s
    jitter_window_s = JITTER_WINDOW_S if active_s >= 2 * JITTER_WINDOW_S else active_s
    slice_s = max(window_s, jitter_window_s / JITTER_SLICES)
    slice_s = max(window_s, round(slice_s / window_s) * window_s)
    sessions = [
        Session(s.started_wall, s.started_offset_ns / NS_PER_S, s.wall, s.offset_ns / NS_PER_S)
        for s in read.sessions
    ]
    frame = Frame(read.targets, names_, active_s, phase_active, slice_s, window_s)
    return frame, Timeline(sessions, phases)


def _notes(read: _Read, rows: Rows, frame: Frame) -> list[str]:
    """The notes after the failing targets' and the money's: what the figures rest on,
    what qualifies them."""
    targets, events = frame.targets, read.events
    notes = [read.judging.note] if read.judging.note else []
    short = {
        t: n for t in targets if (n := rows.overall[t].requests - _counted(read.tallies[t][0])) > 0
    }
    if short:
        notes.append(
            "goodput counts the journaled request rows: "
            + ", ".join(
                f"{t} has {n} fewer (retention, dropped records or journal.max_bytes)"
                for t, n in short.items()
            )
        )
    if not read.samples or not any(read.samples.values()):
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
    notes += client_limits(rows.overall, targets, read.stored.config)
    config = read.stored.config
    notes += [
        f"{t}: {line}"
        for t in targets
        for line in describe(read.answer_notes.get(t, {}), _streamed(config.target(t)))
    ]
    notes += prompt_notes(read.prompt_rows, read.prompt_sizing)
    notes += output_notes(read.output_rows)
    return notes


def _streamed(target: StoredTarget | None) -> bool:
    """Were the target's answers streamed (a target the config lacks: as by default)?"""
    return target is None or target.stream


def _counted(t: Tally) -> int:
    return t.sent + t.excluded + t.unsent
