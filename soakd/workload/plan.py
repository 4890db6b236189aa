"""Workload, plan: the config's phases resolved onto one monotonic axis of nanoseconds.

Calendar time is used once, here: a phase that runs ``until`` a datetime or a
cron instant gets its length from the calendar when the plan is built. From
then on the plan is offsets only, so a 72 h run never looks at the wall clock
again (an NTP step cannot stretch or shorten a phase).

Cron expressions are the usual five fields, in UTC, with crontab's day-of-week
numbers (0 or 7 = Sunday); APScheduler 3 only computes the next fire time.

The same holds for a daily cycle (``load.mode: daily``): each phase's shape is ``placed``
at the calendar instant the phase begins (its time of day in the load's zone), once. A
resumed run rebuilds the plan from the first session's calendar start, so its cycle stands
where the first session's did. A trace load's file is read here, once per file.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler.triggers.cron import CronTrigger

from soakd.config import Config, ConfigError, Load, PhaseConfig, format_duration
from soakd.model import NS_PER_S, Phase, Plan
from soakd.shapes import LoadShape, TraceTimes
from soakd.workload.traces import FORMATS, format_of, read_trace

MAX_PHASES = 100_000  # a looped plan of tiny phases would otherwise fill memory
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DOW_NUMERIC = re.compile(r"(\*|\d+(?:-\d+)?)(?:/(\d+))?")


def plan_start(cfg: Config, now: datetime) -> datetime:
    """The plan's calendar start: ``run.start_at`` or ``now`` (naive means UTC)."""
    if cfg.run.start_at is None:
        return _aware(now)
    try:
        return _aware(datetime.fromisoformat(cfg.run.start_at.strip()))
    except ValueError:
        raise ConfigError(
            f"run.start_at: {cfg.run.start_at!r} is not an ISO datetime (e.g. 2026-12-01T08:00:00Z)"
        ) from None


def build_plan(
    cfg: Config,
    now: datetime,
    rehearse_s: float | None = None,
    duration_cap_s: float | None = None,
) -> Plan:
    """Lay the phases back to back from the calendar start.

    ``run.duration`` and ``duration_cap_s`` (the smaller wins) cut the plan, the
    last phase shortened; with ``run.loop`` the phases repeat until that cap.
    ``rehearse_s`` then compresses the whole plan into that many seconds:
    ``Plan.scale`` is rehearsal time over configured time, and loads keep their
    configured rates (a rehearsal runs the real load, only for less time), but for the
    shapes whose time is the point (``placed``): a daily cycle runs compressed, rates
    kept, and a trace replays faster by the same factor.
    """
    cap_ns = _cap_ns(cfg, duration_cap_s)
    if cfg.run.loop:
        for pc in cfg.phases:
            if pc.until is not None and not _is_cron(pc.until):
                raise ConfigError(
                    f"phases[{pc.name}].until: {pc.until!r} is a fixed instant and cannot "
                    "repeat with run.loop: use a cron expression or a duration"
                )
    start = plan_start(cfg, now)
    bounds: list[tuple[PhaseConfig, int, int]] = []
    t = 0
    done = False
    while not done:
        for pc in cfg.phases:
            end = t + _phase_ns(pc, start + timedelta(microseconds=t // 1000))
            if cap_ns is not None and end >= cap_ns:
                end, done = cap_ns, True
            bounds.append((pc, t, end))
            t = end
            if done:
                break
            if len(bounds) >= MAX_PHASES:
                raise ConfigError(
                    f"run.loop: the plan would hold over {MAX_PHASES} phases; "
                    "make the phases longer or run.duration shorter"
                )
        done = done or not cfg.run.loop

    scale = 1.0
    if rehearse_s is not None:
        if rehearse_s <= 0:
            raise ConfigError(f"--rehearse: must be above zero, got {rehearse_s:g}s")
        if rehearse_s * NS_PER_S > t:  # it would stretch the plan, not rehearse it
            raise ConfigError(
                f"--rehearse: {format_duration(rehearse_s)} is longer than the plan "
                f"({format_duration(t / NS_PER_S)}): a rehearsal compresses the plan; "
                "run it as it is, or rehearse in less time"
            )
        scale = rehearse_s * NS_PER_S / t
        bounds = [(pc, round(a * scale), round(b * scale)) for pc, a, b in bounds]

    traces: dict[tuple[Path, str], TraceTimes] = {}
    shapes = {pc.name: _shapes(cfg, pc, traces) for pc in cfg.phases}
    phases = tuple(
        Phase(i, pc.name, a, b, _placed(shapes[pc.name], start, a / scale, scale))
        for i, (pc, a, b) in enumerate(bounds)
    )
    return Plan(phases, scale)


def describe_plan(plan: Plan, cfg: Config, max_rows: int = 60) -> str:
    """A table for ``soakd check``: one row per phase and target, then totals.

    When rehearsing, each phase shows the configured times and the rehearsal's.
    A long looped plan shows its first and last phases only.
    """
    targets = [t.name for t in cfg.targets]
    rehearsing = plan.scale != 1.0
    header = ["#", "phase", "start", "duration"]
    if rehearsing:
        header += ["rehearsal start", "rehearsal duration"]
    header += ["target", "load", "requests"]
    rows: list[list[str] | str] = []  # a str is a line of its own
    totals = dict.fromkeys(targets, 0.0)
    closed: dict[str, int] = dict.fromkeys(targets, 0)
    phases = plan.phases
    shown = set(range(len(phases)))
    if len(phases) > max_rows:
        shown = set(range(max_rows - 5)) | set(range(len(phases) - 5, len(phases)))
    for phase in phases:
        for name in targets:
            shape = phase.loads[name]
            totals[name] += shape.expected(phase.duration_ns)
            if shape.concurrency:
                closed[name] += phase.duration_ns
        if phase.index not in shown:
            if phase.index - 1 in shown:
                rows.append(f"... {len(phases) - len(shown)} more phases ...")
            continue
        for k, name in enumerate(targets):
            shape = phase.loads[name]
            requests = f"~{_count(shape, phase)}" if shape.is_open else "-"
            lead = ["", "", "", ""] + (["", ""] if rehearsing else [])
            if k == 0:
                lead = [
                    str(phase.index),
                    phase.name,
                    _dur(phase.start_ns / plan.scale),
                    _dur(phase.duration_ns / plan.scale),
                ]
                if rehearsing:
                    lead += [_dur(phase.start_ns), _dur(phase.duration_ns)]
            rows.append([*lead, name, shape.describe(), requests])

    lines = [_table(header, rows)]
    configured = plan.duration_ns / plan.scale
    summary = f"total: {format_duration(configured / NS_PER_S)} in {len(phases)} phase(s)"
    if cfg.run.loop:
        summary += " (looped)"
    lines.append(summary)
    if rehearsing:
        lines.append(
            f"rehearsal: the plan in {_dur(plan.duration_ns)} "
            f"(scale {plan.scale:.3g}: 1 s of rehearsal stands for "
            f"{format_duration(1 / plan.scale)}); loads keep their configured rates, "
            "a daily cycle runs compressed, a trace replays faster by the same factor"
        )
    for name in targets:
        parts = []
        if totals[name]:
            parts.append(f"~{round(totals[name]):,} open-loop requests")
        if closed[name]:
            parts.append(f"closed loop for {_dur(closed[name])}")
        lines.append(f"  {name}: {', '.join(parts) or 'idle'}")
    return "\n".join(lines)


# --- internals ---------------------------------------------------------------------------


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _cap_ns(cfg: Config, duration_cap_s: float | None) -> int | None:
    caps: list[int] = []
    if cfg.run.duration is not None:
        if cfg.run.duration <= 0:
            raise ConfigError(f"run.duration: must be above zero, got {cfg.run.duration:g}s")
        caps.append(round(cfg.run.duration * NS_PER_S))
    if duration_cap_s is not None:
        if duration_cap_s <= 0:
            raise ConfigError(f"--duration: must be above zero, got {duration_cap_s:g}s")
        caps.append(round(duration_cap_s * NS_PER_S))
    return min(caps) if caps else None


def _shapes(
    cfg: Config, pc: PhaseConfig, traces: dict[tuple[Path, str], TraceTimes]
) -> dict[str, LoadShape]:
    out: dict[str, LoadShape] = {}
    for t in cfg.targets:
        load = cfg.load_for(pc, t.name)
        where = f"phases[{pc.name}]." + (f"targets[{t.name}]" if t.name in pc.targets else "load")
        trace = _trace(cfg, load, where, traces) if load.mode == "trace" else {}
        out[t.name] = load.shape(t.max_connections, **trace)
    return out


def _trace(
    cfg: Config, load: Load, where: str, traces: dict[tuple[Path, str], TraceTimes]
) -> dict[str, object]:
    """A trace load's file, format and instants (each file read once): ``load.trace``,
    else the prompt source's file when that source is a trace."""
    prompts = cfg.workload.prompts
    if load.trace is not None:
        path, fmt, where = load.trace, format_of(load.trace, load.format), f"{where}.trace"
    elif prompts.source in FORMATS and prompts.file is not None:
        path, fmt, where = prompts.file, prompts.source, "workload.prompts.file"
    else:
        raise ConfigError(
            f"{where}.trace: mode 'trace' needs a trace file: load.trace, or "
            f"workload.prompts.source {' or '.join(FORMATS)} with its file"
        )
    times = traces.get((path, fmt))
    if times is None:
        times = traces[path, fmt] = read_trace(path, fmt, where)
    if load.loop and not times.period_ns:
        raise ConfigError(
            f"{where}: {path}: its {times.records} record(s) fall at one instant: nothing "
            "to loop over (loop: false, or a trace that spans some time)"
        )
    return {"trace": str(path), "format": fmt, "times": times}


def _placed(
    shapes: dict[str, LoadShape], start: datetime, configured_ns: float, scale: float
) -> dict[str, LoadShape]:
    """A phase's loads, placed where it begins (``LoadShape.placed``)."""
    begins = start + timedelta(microseconds=configured_ns // 1000)
    return {name: shape.placed(begins, scale) for name, shape in shapes.items()}


def _is_cron(text: str) -> bool:
    return len(text.split()) == 5


def _phase_ns(pc: PhaseConfig, begins: datetime) -> int:
    """The phase's length when it begins at the calendar instant ``begins``."""
    if pc.until is None:
        assert pc.duration is not None  # the config model guarantees one of them
        return round(pc.duration * NS_PER_S)
    where = f"phases[{pc.name}].until"
    text = pc.until.strip()
    if _is_cron(text):
        end = _next_cron(text, begins, where)
    else:
        try:
            end = _aware(datetime.fromisoformat(text))
        except ValueError:
            raise ConfigError(
                f"{where}: {pc.until!r} is neither an ISO datetime (2026-12-01T08:00:00Z) "
                "nor a five-field cron expression ('0 8 * * *')"
            ) from None
        if end <= begins:
            raise ConfigError(
                f"{where}: {text} is already past (the phase would begin at "
                f"{begins.isoformat(timespec='seconds')})"
            )
    return _td_ns(end - begins)


def _next_cron(expr: str, after: datetime, where: str) -> datetime:
    """The first fire time strictly after ``after`` (APScheduler's own answer is >=)."""
    fields = expr.split()
    if fields[2] not in ("*", "?") and fields[4] not in ("*", "?"):
        raise ConfigError(
            f"{where}: {expr!r} restricts both day of month and day of week; crontab "
            "fires on either, APScheduler only on both: restrict one of them"
        )
    try:
        fields[4] = _crontab_dow(fields[4])
        trigger = CronTrigger.from_crontab(" ".join(fields), timezone=UTC)
        fire: datetime | None = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    except ValueError as exc:
        raise ConfigError(f"{where}: {expr!r} is not a valid cron expression: {exc}") from None
    if fire is None:
        raise ConfigError(f"{where}: {expr!r} never fires")
    return fire


def _crontab_dow(field: str) -> str:
    """crontab's day-of-week numbers (0-7, Sunday = 0 and 7) -> names, because
    APScheduler 3 counts from Monday = 0 and would shift every numeric day by one."""
    out: list[str] = []
    for part in field.split(","):
        match = _DOW_NUMERIC.fullmatch(part)
        if match is None or (match.group(1) == "*" and match.group(2) is None):
            out.append(part)  # names, '*', or APScheduler's own forms ('last fri')
            continue
        span, step = match.group(1), int(match.group(2) or 1)
        if span == "*":
            lo, hi = 0, 6
        elif "-" in span:
            lo, hi = (int(x) for x in span.split("-"))
        else:
            lo = hi = int(span)
            if match.group(2):  # 'n/step' means n through the end of the week
                hi = 6
        if not 0 <= lo <= hi <= 7 or step < 1:
            raise ValueError(f"day of week {part!r} is out of range (0-7, 0 and 7 are Sunday)")
        out.extend(_DOW_NAMES[d] for d in range(lo, hi + 1, step))
    return ",".join(dict.fromkeys(out))


def _td_ns(delta: timedelta) -> int:
    return ((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000


def _dur(ns: float) -> str:
    seconds = ns / NS_PER_S
    return format_duration(float(f"{seconds:.3g}") if seconds < 60 else seconds)


def _count(shape: LoadShape, phase: Phase) -> str:
    return f"{round(shape.expected(phase.duration_ns)):,}"


def _table(header: list[str], rows: list[list[str] | str]) -> str:
    cells = [header, *(r for r in rows if not isinstance(r, str))]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        row
        if isinstance(row, str)
        else "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in [header, *rows]
    )
