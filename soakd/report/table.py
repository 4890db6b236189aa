"""Report room, the table model: every table the report shows, as titled rows of text cells.

The Markdown, HTML and terminal renderers draw the same ``Table``s, so a number is
formatted once (``fmt_value``, ``fmt_criterion``) and reads the same in every format;
a renderer only decides the markup (a ``best`` cell is bold, ✓-marked and green).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from soakd.analysis import JITTER_MIN_OK, JITTER_MIN_SLICES, JITTER_SLICES, fmt_ms
from soakd.report.model import (
    METRIC_COLUMNS,
    Column,
    GpuRow,
    Report,
    Row,
    value_of,
)
from soakd.slowest import slowest_sections

COUNTS = frozenset(
    {"offered", "missed", "requests", "errors", "shed", "oom_events", "oom_responses", "restarts"}
)


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    best: bool = False  # the better value of its row (``Report.best``)


@dataclass
class Table:
    """A titled table. ``numeric``: per column, whether it holds figures (right-aligned
    where the format aligns); an empty ``rows`` is a title alone."""

    title: str
    header: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    numeric: list[bool] = field(default_factory=list)


def cells(texts: Iterable[str]) -> list[Cell]:
    return [Cell(t) for t in texts]


# --- formatting ---------------------------------------------------------------------------------


def fmt_value(key: str, value: float | None, currency: str = "$") -> str:
    if value is None:
        return "-"
    if key in COUNTS:
        return f"{value:,.0f}"
    if key in ("success_rate", "goodput"):
        return f"{value * 100:.2f} %" if value < 1 else "100 %"
    if key == "error_ratio":
        return f"{value * 100:.3g} %"
    if "." in key or key == "lag_p99_ms":
        return fmt_ms(value)
    if key == "jitter":
        return f"{value * 100:.1f} %"
    if key in ("rps", "output_tps", "goodput_rps"):
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    if key == "vram_peak_bytes":
        return fmt_bytes(value)
    if key == "leak_bytes_per_hour":
        return f"{fmt_bytes(value, signed=True)}/h"
    if key == "tokens_per_joule":
        return f"{value:.3g}"
    if key in ("cost_per_mtok", "cost_per_month"):
        return f"{currency}{value:,.3g}" if value < 1000 else f"{currency}{value:,.0f}"
    return f"{value:g}"


def fmt_bytes(value: float, signed: bool = False) -> str:
    sign = "-" if value < 0 else ("+" if signed and value > 0 else "")
    v = abs(value)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= size:
            return f"{sign}{v / size:.2f} {unit}"
    return f"{sign}{v:.0f} B"


def fmt_duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fmt_criterion(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return fmt_ms(value * 1000)
    if unit == "ratio":
        return f"{value * 100:.3g} %"
    if unit == "bytes":  # decimal, as slo.vram_peak is usually written (3.9GB)
        return f"{value / 1e9:.3g} GB" if value >= 1e8 else f"{value / 1e6:.3g} MB"
    return f"{value:,.0f}"


def result(passed: bool | None, note: str = "") -> str:
    if passed is None:
        return f"not judged ({note})" if note else "not judged"
    return "pass" if passed else "FAIL"


# --- the run's text ---------------------------------------------------------------------------


def header_lines(rep: Report) -> list[str]:
    state = "completed" if rep.completed else "not completed (stopped or still running)"
    return [
        f"run {rep.run_id}, created {rep.created}, {state}",
        f"node {rep.node or '-'}, site {rep.site or '-'}",
        f"active {fmt_duration(rep.active_s)} of a {fmt_duration(rep.plan_s)} plan in "
        f"{rep.sessions} session(s); downtime {fmt_duration(rep.downtime_s)}; "
        f"soakd {', '.join(rep.versions)}",
    ]


def definitions(rep: Report) -> list[str]:
    slices = fmt_duration(rep.slice_s)
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


def phase_title(rep: Report, phase: str) -> str:
    rows = rep.by_phase[phase]
    active = next(iter(rows.values())).active_s if rows else 0.0
    return f"Phase {phase} ({fmt_duration(active)} active)"


# --- the tables ---------------------------------------------------------------------------------


def columns(keys: Iterable[str] | None = None) -> list[Column]:
    keep = None if keys is None else set(keys)
    return [c for c in METRIC_COLUMNS if keep is None or c.key in keep]


def metric_cell(rep: Report, row: Row, key: str, marked: bool) -> str:
    text = fmt_value(key, value_of(row, key), rep.currency)
    if key == "leak_bytes_per_hour" and text == "-" and row.leak_note:
        text = row.leak_note
    if key == "tokens_per_joule" and row.energy_shared and text != "-":
        text += " (shared)"
    if key == "cost_per_mtok" and row.cost_basis and text != "-" and not marked:
        text += f" ({row.cost_basis})"
    return text + (" ✓" if marked else "")


def metric_table(
    rep: Report,
    title: str,
    rows: dict[str, Row],
    keys: Iterable[str] | None = None,
    *,
    marks: bool = True,
) -> Table:
    """The targets side by side, one metric a row; ``marks``: the better values marked."""
    table = Table(title, ["metric", *rep.targets], numeric=[False] + [True] * len(rep.targets))
    for key, name, _ in columns(keys):
        line = [Cell(name)]
        for t in rep.targets:
            row = rows.get(t)
            marked = marks and t in rep.best.get(key, [])
            line.append(Cell("-" if row is None else metric_cell(rep, row, key, marked), marked))
        table.rows.append(line)
    return table


def errors_table(rep: Report, title: str) -> Table | None:
    kinds = sorted({k for r in rep.overall.values() for k in r.errors_by_kind})
    if not kinds:
        return None
    table = Table(title, ["kind", *rep.targets], numeric=[False] + [True] * len(rep.targets))
    for kind in kinds:
        counts = (str(rep.overall[t].errors_by_kind.get(kind, 0)) for t in rep.targets)
        table.rows.append(cells([kind, *counts]))
    return table


def gpu_leak(g: GpuRow) -> str:
    text = fmt_value("leak_bytes_per_hour", g.leak_bytes_per_hour)
    return g.leak_note if text == "-" and g.leak_note else text


def gpu_table(rep: Report) -> Table | None:
    if not rep.gpus:
        return None
    table = Table(
        "GPUs",
        ["GPU", "peak used", "leak slope", "energy", "mean power", "charged to"],
        numeric=[False, True, True, True, True, False],
    )
    for g in rep.gpus:
        table.rows.append(
            cells(
                [
                    g.gpu,
                    fmt_value("vram_peak_bytes", g.peak_used_bytes),
                    gpu_leak(g),
                    "-" if g.energy_j is None else f"{g.energy_j / 3.6e6:.3f} kWh",
                    "-" if g.mean_power_w is None else f"{g.mean_power_w:.0f} W",
                    ", ".join(g.targets) or "-",
                ]
            )
        )
    return table


def verdict_title(rep: Report) -> str:
    if rep.passed is None:
        return "Verdict: none (no slo or compare block in the run's config, or nothing measured)"
    return "Verdict: PASS" if rep.passed else "Verdict: FAIL"


def verdict_tables(rep: Report) -> list[Table]:
    """The decision, first: each target against its SLO, then the baseline comparison."""
    table = Table(verdict_title(rep), ["target", "criterion", "measured", "limit", "result"])
    for t in rep.targets:
        v = rep.verdicts.get(t)
        if v is None or not v.criteria:
            continue
        table.rows.append(cells([t, "all criteria", "", "", result(v.passed).upper()]))
        table.rows += [
            cells(
                [
                    t,
                    c.name,
                    fmt_criterion(c.unit, c.measured),
                    fmt_criterion(c.unit, c.limit),
                    result(c.passed, c.note),
                ]
            )
            for c in v.criteria
        ]
    out = [table]
    cmp = rep.comparison
    if cmp is not None:
        ctable = Table(
            f"Candidate {cmp.candidate} against baseline {cmp.baseline}: "
            f"{result(cmp.passed).upper()}",
            ["metric", "baseline", "candidate", "change", "allowed regression", "result"],
        )
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
            ctable.rows.append(
                cells([d.key, value[0], value[1], change, allowed, result(d.passed, d.note)])
            )
        out.append(ctable)
    return out


def phase_verdict_table(rep: Report, phase: str) -> Table | None:
    verdicts = rep.phase_verdicts.get(phase, {})
    table = Table(f"Verdicts in phase {phase}", ["target", "verdict", "failed criteria"])
    for t in rep.targets:
        v = verdicts.get(t)
        if v is None or not v.criteria:
            continue
        failed = ", ".join(
            f"{c.name} {fmt_criterion(c.unit, c.measured)} > {fmt_criterion(c.unit, c.limit)}"
            for c in v.failed
        )
        why = "no requests" if not v.sent else "nothing measurable"
        table.rows.append(
            cells([t, result(v.passed, why if v.passed is None else ""), failed or "-"])
        )
    return table if table.rows else None


def cost_table(rep: Report) -> Table | None:
    table = Table(
        "Cost at the measured load",
        ["target", "priced as", "per M output tokens", "per month", "output tokens/s"],
    )
    for t in rep.targets:
        r = rep.overall[t]
        if r.cost_basis:
            table.rows.append(
                cells(
                    [
                        t,
                        r.cost_basis,
                        fmt_value("cost_per_mtok", r.cost_per_mtok, rep.currency),
                        fmt_value("cost_per_month", r.cost_per_month, rep.currency),
                        fmt_value("output_tps", r.output_tps),
                    ]
                )
            )
    return table if table.rows else None


def guard_table(rep: Report) -> Table | None:
    """The guard gateway, phase by phase (the edge plan's load-shedding stages)."""

    def counts(d: dict[str, int], strip: str = "") -> str:
        return ", ".join(f"{k.removeprefix(strip)} {n:,}" for k, n in sorted(d.items()) if n) or "0"

    table = Table(
        "The guard, phase by phase",
        [
            "phase",
            "target",
            "features on",
            "breaker openings",
            "shed (soakd counted)",
            "gateway rejections",
            "concurrency limit",
        ],
    )
    for g in rep.guard:
        lo, hi = g.limit_min, g.limit_max
        limit = "-" if lo is None else (f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}")
        table.rows.append(
            cells(
                [
                    g.phase,
                    g.target,
                    g.modes,
                    counts(g.breaker_openings),
                    counts(g.shed, "shed_"),
                    counts(g.rejections),
                    limit,
                ]
            )
        )
    return table if table.rows else None


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
            f"{t}: {result(v.passed).upper()}, goodput {goodput}"
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
            f"{result(cmp.passed).upper()}" + (f": {worse}" if worse else "")
        )
    return lines


def slowest_tables(rep: Report) -> list[Table]:
    """The slowest requests, one table per target (soakd/slowest.py), with trace ids."""
    return [
        Table(title, header, [cells(row) for row in rows])
        for title, header, rows in slowest_sections(rep.slowest, rep.phases)
    ]
