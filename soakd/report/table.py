"""Report room, the table model: every table the report shows, as titled rows of text cells.

The Markdown, HTML and terminal renderers draw the same ``Table``s, so a number is
formatted once (``fmt_value``, ``fmt_criterion``) and reads the same in every format;
a renderer only decides the markup (a ``best`` cell is bold, ✓-marked and green).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from soakd.measure.analysis import JITTER_MIN_OK, JITTER_MIN_SLICES, JITTER_SLICES, fmt_ms
from soakd.measure.goodput import classify
from soakd.measure.verdicts import HIGHER_IS_WORSE, Criterion, Delta
from soakd.report.model import (
    METRIC_COLUMNS,
    Column,
    GpuRow,
    PlannedServed,
    Report,
    Row,
    value_of,
)
from soakd.report.slowest import slowest_sections

COUNTS = frozenset(
    {
        "offered",
        "missed",
        "requests",
        "errors",
        "server_errors",
        "shed",
        "not_judged",
        "oom_events",
        "oom_responses",
        "restarts",
    }
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
    if key in ("error_ratio", "server_error_ratio"):
        return fmt_ratio(value)
    if "." in key or key == "lag_p99_ms":
        return fmt_ms(value)
    if key == "jitter":
        return f"{value * 100:.1f} %"
    if key in ("rps", "attempt_rps", "output_tps", "goodput_rps"):
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


def fmt_mean(value: float | None) -> str:
    """A mean token count ("-": none)."""
    return "-" if value is None else f"{value:,.1f}"


def planned_table(
    title: str, rows: Sequence[PlannedServed], last: tuple[str, bool], lasts: Sequence[str]
) -> Table:
    """Planned against served, a row per target, and a last column of the kind's own
    (``last``: its header and whether it is numeric; ``lasts``: its cell per row)."""
    header, numeric = last
    table = Table(
        title,
        ["target", "answers", "planned", "served", "off", header],
        numeric=[False, True, True, True, True, numeric],
    )
    for r, cell in zip(rows, lasts, strict=True):
        off = r.off
        shown = "-" if off is None else f"{off * 100:+.1f} %"
        table.rows.append(
            cells(
                [r.target, f"{r.requests:,}", fmt_mean(r.planned), fmt_mean(r.served), shown, cell]
            )
        )
    return table


def fmt_ratio(value: float) -> str:
    """An error ratio: 3 significant digits, never "0 %" for a ratio above zero (one
    failure in a million is 0.0001 %), nor "100 %" below one."""
    if value <= 0 or value >= 1:
        return f"{value * 100:.0f} %"
    if value < 1e-5:
        return "< 0.001 %"
    text = f"{value * 100:.3g} %"
    return "99.9 %" if text == "100 %" else text


BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
"""The one unit rule for bytes in every report, plot and verdict, and the live view:
decimal, as ``slo.vram_peak`` is written (3.9GB) and as Prometheus shows the gauges."""


def fmt_bytes(value: float, signed: bool = False) -> str:
    sign = "-" if value < 0 else ("+" if signed and value > 0 else "")
    v = abs(value)
    for unit, size in BYTE_UNITS:
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
    if unit in ("ratio", "min_ratio"):
        return fmt_ratio(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:,.0f}"


def fmt_limit(unit: str, value: float) -> str:
    """A criterion's limit: a ceiling as a value, a floor (``min_count``, ``min_ratio``) as
    "at least"."""
    if unit == "min_ratio":
        return f"at least {fmt_ratio(value)}"
    return f"at least {value:,.0f}" if unit == "min_count" else fmt_criterion(unit, value)


def failed_text(c: Criterion, *, note: bool = True) -> str:
    """``ttft_p99 3.42 s (limit 3.00 s)``: a failed criterion in one phrase."""
    why = f", {c.note}" if note and c.note else ""
    return f"{c.name} {fmt_criterion(c.unit, c.measured)} (limit {fmt_limit(c.unit, c.limit)}{why})"


def result(passed: bool | None, note: str = "") -> str:
    if passed is None:
        return f"not judged ({note})" if note else "not judged"
    return "pass" if passed else "FAIL"


# --- the run's text ---------------------------------------------------------------------------


def definitions(rep: Report) -> list[str]:
    slices = fmt_duration(rep.slice_s)
    broken_down = [
        "By context length and by turn: from the journal's request rows (the rows kept). "
        "The context is a request's served prompt tokens (the server's usage; a request "
        "without it is in no bucket), in power-of-two buckets; a turn counts from 0, turns "
        "from 16 on are 16+. ITL p50 there: the median of the requests' own median gaps."
    ]
    return [
        "Latency percentiles: successful requests only; from the journal's digests "
        "(within ~1 %). TTFT: send to the first content token; ITL: gaps between content "
        "chunks; TPOT: (E2E - TTFT) / (output tokens - 1).",
        f"P99 jitter: stdev / mean of the P99 E2E of {JITTER_SLICES} consecutive {slices} "
        f"slices of plan time, the worst hour (slices with >= {JITTER_MIN_OK} successful "
        f"requests, at least {JITTER_MIN_SLICES}); the P99E2EJitterHigh alert's definition.",
        "Throughput: successful requests per second of active plan time (downtime "
        "excluded); attempts: every request sent. ✓ marks the better value; outside goodput, "
        "success and errors, only targets that pass the error criterion and succeeded on "
        "most of their requests compete.",
        "Counts: sent = ok + errors + shed by the guard + cut by soakd. Error ratio: every "
        "failed request (4xx and 429, 5xx, transport errors, timeouts, broken streams, bad "
        "answers) over ok + errors; 5xx ratio: the server's 5xx answers over the same; the "
        "guard's sheds and the requests soakd cut at the stop are in neither. Goodput: "
        "requests that succeeded within every latency SLO of the target, over ok + errors + "
        "shed. A target sent requests with no success fails its verdict. docs/slo.md.",
        "Cost per month: the run's cost rate at the measured load x 730 h.",
        "The guard, phase by phase: features on as the phase left them; sheds as soakd "
        "counted them (shed_* outcomes, the phase they were sent in); the gateway's own "
        "breaker openings and rejections as read from it every probes.scrape_interval, in "
        "the phase of the read (so they may lag into the next phase).",
        *(broken_down if rep.breakdowns else []),
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
        table.rows.append(cells([kind + KIND_CLASS.get(classify(kind), ""), *counts]))
    return table


KIND_CLASS = {"guard": " (shed: not an error)", "excluded": " (cut by soakd: not judged)"}
"""What the errors-by-kind table says of the kinds outside the error ratio (goodput.py)."""


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
    table = Table(
        verdict_title(rep),
        ["target", "criterion", "measured", "limit", "result"],
        numeric=[False, False, True, True, False],
    )
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
                    fmt_limit(c.unit, c.limit),
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
            unit = _delta_unit(d.key)
            value = (
                (fmt_criterion(unit, d.baseline), fmt_criterion(unit, d.candidate))
                if unit != "rate"
                else tuple("-" if x is None else f"{x:.4g}/s" for x in (d.baseline, d.candidate))
            )
            ctable.rows.append(
                cells(
                    [
                        d.key,
                        value[0],
                        value[1],
                        fmt_change(d),
                        fmt_allowed(d),
                        result(d.passed, d.note),
                    ]
                )
            )
        out.append(ctable)
    return out


def _delta_unit(key: str) -> str:
    if key.endswith(("_p99", "_p50")):
        return "s"
    return "ratio" if key in ("error_ratio", "server_error_ratio", "goodput") else "rate"


def fmt_pct_change(ratio: float) -> str:
    """``+2,085 %``, ``-8.0 %``: a relative change, signed."""
    if math.isinf(ratio):
        return "+∞ %" if ratio > 0 else "-∞ %"
    pct = ratio * 100
    return f"{pct:+,.0f} %" if abs(pct) >= 100 else f"{pct:+.1f} %"


def _fmt_abs_change(unit: str, value: float) -> str:
    """A change in the metric's own unit, signed: ``+200 ms``, ``+0.2 points``, ``-3.1/s``."""
    sign = "-" if value < 0 else "+"
    if unit == "s":
        return sign + fmt_ms(abs(value) * 1000)
    if unit == "ratio":
        return f"{sign}{abs(value) * 100:.3g} points"
    return f"{value:+.4g}/s"


def fmt_change(d: Delta) -> str:
    """The candidate against the baseline, in the limit's terms: relative when the limit
    is (``+2,085 %``), else in the metric's unit (``+200 ms``)."""
    if d.delta is None:
        return "-"
    if d.limit_kind == "relative" and d.relative is not None:
        return fmt_pct_change(d.relative)
    if d.limit_kind == "relative":  # a baseline of 0: no relative change
        return f"{_fmt_abs_change(_delta_unit(d.key), d.delta)} from 0"
    return _fmt_abs_change(_delta_unit(d.key), d.delta)


def fmt_allowed(d: Delta) -> str:
    """The regression allowed, signed in the metric's direction: ``+10 %`` for a latency,
    ``-5 %`` for a throughput."""
    worse = 1.0 if d.key in HIGHER_IS_WORSE else -1.0
    if d.limit_kind == "relative":
        return f"{worse * d.limit * 100:+,g} %"
    return _fmt_abs_change(_delta_unit(d.key), worse * d.limit)


def phase_verdict_table(rep: Report, phase: str) -> Table | None:
    verdicts = rep.phase_verdicts.get(phase, {})
    table = Table(f"Verdicts in phase {phase}", ["target", "verdict", "failed criteria"])
    for t in rep.targets:
        v = verdicts.get(t)
        if v is None or not v.criteria:
            continue
        failed = ", ".join(failed_text(c, note=False) for c in v.failed)
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
        failed = "; ".join(failed_text(c) for c in v.failed)
        goodput = fmt_value("goodput", v.goodput)
        lines.append(
            f"{t}: {result(v.passed).upper()}, goodput {goodput}"
            + (f": {failed}" if failed else "")
        )
    cmp = rep.comparison
    if cmp is not None:
        worse = "; ".join(
            f"{d.key} {fmt_change(d)} (allowed {fmt_allowed(d)}{', ' + d.note if d.note else ''})"
            for d in cmp.deltas
            if d.passed is False
        )
        lines.append(
            f"compare {cmp.candidate} against {cmp.baseline}: "
            f"{result(cmp.passed).upper()}" + (f": {worse}" if worse else "")
        )
    return lines


def slowest_tables(rep: Report) -> list[Table]:
    """The slowest requests, one table per target (soakd/report/slowest.py), with trace ids."""
    return [
        Table(title, header, [cells(row) for row in rows])
        for title, header, rows in slowest_sections(rep.slowest, rep.phases)
    ]
