"""Report room, HTML: one self-contained page, the report's tables and inline SVG plots.

Nothing is fetched (no script, no stylesheet or font from elsewhere): the plots are
written here, with no plotting dependency.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from soakd.report.breakdowns import context_series, context_table, turn_tables
from soakd.report.checks import check_tables
from soakd.report.model import PHASE_COLUMNS, Report, Series
from soakd.report.output_tokens import output_table
from soakd.report.prefix_cache import prefix_table
from soakd.report.prompt_tokens import prompt_table
from soakd.report.table import (
    Cell,
    Table,
    cost_table,
    definitions,
    errors_table,
    fmt_duration,
    gpu_table,
    guard_table,
    metric_table,
    phase_title,
    phase_verdict_table,
    slowest_tables,
    verdict_tables,
)
from soakd.report.tested import header_lines, tested_tables

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
    "vram": ("GPU memory", "GB"),
    "errors": ("Errors", "per minute"),
}
_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 10px;border-bottom:1px solid #eee}
td{text-align:right}td:first-child,th:first-child,td.txt{text-align:left}
th{background:#f5f5f5}.best{background:#e3f5e1;font-weight:600}
.fail{background:#fbe3e1;font-weight:600}
.meta{color:#555}.plots{display:flex;flex-wrap:wrap;gap:12px}
svg{background:#fff;border:1px solid #e4e4e4}svg text{font-size:11px;fill:#333}
.notes li{color:#444}
.warning{color:#b00020;font-weight:bold}
"""


def _td(cell: Cell, text_column: bool = False) -> str:
    text = html.escape(cell.text)
    if cell.best:
        return f'<td class="best">{text}</td>'
    if cell.text == "FAIL":
        return f'<td class="fail">{text}</td>'
    return f'<td class="txt">{text}</td>' if text_column else f"<td>{text}</td>"


def html_table(table: Table, level: str = "h2", *, title_sep: str = "", row_sep: str = "") -> str:
    """A titled table; a best cell and a FAIL stand out (classes ``best``, ``fail``)."""
    e = html.escape
    head = f"<{level}>{e(table.title)}</{level}>"
    if not table.rows:
        return head
    text = [n is False for n in table.numeric] or [False] * len(table.header)
    parts = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in table.header) + "</tr>"]
    parts += [
        "<tr>" + "".join(_td(c, t) for c, t in zip(row, text, strict=True)) + "</tr>"
        for row in table.rows
    ]
    parts.append("</table>")
    return head + title_sep + row_sep.join(parts)


def render_html(rep: Report) -> str:
    e = html.escape
    rehearsal = " (rehearsal)" if rep.tested is not None and rep.tested.rehearsal else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>soakd report {e(rep.run_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>soakd report: {e(rep.run_id)}{rehearsal}</h1>",
    ]
    parts += [f'<p class="warning">Warning: {e(w)}</p>' for w in rep.warnings]
    parts += [f'<p class="meta">{e(line)}</p>' for line in header_lines(rep)]
    parts += [html_table(table) for table in tested_tables(rep)]
    parts += [html_table(table) for table in verdict_tables(rep)]
    parts.append(html_table(metric_table(rep, "Targets side by side", rep.overall), title_sep="\n"))
    for extra in (cost_table(rep), guard_table(rep)):
        if extra is not None:
            parts.append(html_table(extra))
    errors = errors_table(rep, "Errors by kind")
    if errors is not None:
        parts.append(html_table(errors, row_sep="\n"))
    prompts = prompt_table(rep)
    if prompts is not None:
        parts.append(html_table(prompts))
    answers = output_table(rep)
    if answers is not None:
        parts.append(html_table(answers))
    by_context = context_table(rep)
    if by_context is not None:
        parts.append(html_table(by_context))
        parts.append(
            svg_chart(
                "TTFT by context length",
                "ms",
                context_series(rep),
                x_label="mean served prompt tokens of the bucket (thousands)",
            )
        )
    parts += [html_table(table) for table in turn_tables(rep)]
    prefixes = prefix_table(rep)
    if prefixes is not None:
        parts.append(html_table(prefixes))
    parts += [html_table(t) for t in check_tables(rep.checks)]
    if rep.plots:
        parts.append('<h2>Over time</h2><div class="plots">')
        markers = [(d["offset_h"], f"down {fmt_duration(d['seconds'])}") for d in rep.downtimes]
        for key, series in rep.plots.items():
            title, unit = _PLOT_TITLES.get(key, (key, ""))
            parts.append(
                svg_chart(
                    title,
                    unit,
                    series,
                    markers,
                    limits=rep.plot_limits.get(key, ()),
                    phases=rep.plot_phases,
                    x_end=rep.active_s / 3600,
                )
            )
        parts.append("</div>")
    for phase in rep.phases:
        rows = rep.by_phase[phase]
        parts.append(
            html_table(
                metric_table(rep, phase_title(rep, phase), rows, PHASE_COLUMNS, marks=False),
                title_sep="\n",
            )
        )
        verdicts = phase_verdict_table(rep, phase)
        if verdicts is not None:
            parts.append(html_table(verdicts, "h3"))
    gpus = gpu_table(rep)
    if gpus is not None:
        parts.append(html_table(gpus, row_sep="\n"))
    parts += [html_table(table) for table in slowest_tables(rep)]
    if rep.capacity is not None:
        from soakd.report.capacity import capacity_html

        parts.append(capacity_html(rep.capacity))
    parts.append('<h2>Notes</h2><ul class="notes">')
    parts += [f"<li>{e(n)}</li>" for n in rep.notes + definitions(rep)]
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"


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
    *,
    limits: Sequence[tuple[str, float]] = (),
    phases: Sequence[tuple[float, str]] = (),
    x_end: float | None = None,
    x_label: str | None = None,
) -> str:
    """A line chart as inline SVG: x in plan hours (minutes or seconds for short runs), up
    to ``x_end`` (the plan time reached: nothing past it is drawn); ``markers`` (downtime)
    and ``phases`` (each phase's start, named) as vertical lines, ``limits`` (the SLO) as
    red dashed horizontal ones. ``x_label``: x is not plan time but the quantity it names,
    drawn as it is from 0 (the TTFT-by-context curve)."""
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
    x_hi = x_end if x_end else max([*xs, *(m[0] for m in markers)])
    xunit, xscale = "hours", 1.0
    if x_label is not None:
        x_hi = max(xs)
    elif x_hi < 2:
        xunit, xscale = ("minutes", 60.0) if x_hi >= 2 / 60 else ("seconds", 3600.0)
    x0, x1 = 0.0, x_hi * xscale or 1.0
    y0, y1 = 0.0, max([*ys, *(v for _, v in limits)]) * 1.08 or 1.0

    def px(x: float) -> float:
        return left + (min(x * xscale, x1) - x0) / (x1 - x0) * pw

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
        f"{e(x_label) if x_label is not None else f'plan time ({xunit})'}</text>"
    )
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    labelled = -1e9  # a phase's name only where the last one is far enough to the left
    for x, name in phases:
        if x * xscale >= x1:
            continue
        mx = px(x)
        if x > 0:
            out.append(
                f'<line class="phase" x1="{mx:.1f}" x2="{mx:.1f}" y1="{top}" y2="{top + ph}" '
                'stroke="#c9c9c9"/>'
            )
        if mx - labelled > 60:
            labelled = mx
            out.append(f'<text x="{mx + 3:.1f}" y="{top + ph - 4}" fill="#888">{e(name)}</text>')
    for label, value in limits:
        ly = py(value)
        out.append(
            f'<line class="slo" x1="{left}" x2="{left + pw}" y1="{ly:.1f}" y2="{ly:.1f}" '
            'stroke="#d62728" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{left + pw - 4}" y="{ly - 4:.1f}" text-anchor="end" fill="#d62728">'
            f"{e(label)}</text>"
        )
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
