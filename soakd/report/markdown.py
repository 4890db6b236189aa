"""Report room, Markdown: the report's tables as one Markdown document."""

from __future__ import annotations

from soakd.report.breakdowns import context_table, turn_tables
from soakd.report.checks import check_tables
from soakd.report.model import PHASE_COLUMNS, Report
from soakd.report.output_tokens import output_table
from soakd.report.prefix_cache import prefix_table
from soakd.report.prompt_tokens import prompt_table
from soakd.report.table import (
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


def md_table(table: Table, level: str = "##") -> list[str]:
    """A titled table; a best cell in bold."""
    out = ["", f"{level} {table.title}", ""]
    if not table.rows:
        return out[:-1]
    numeric = table.numeric or [False] * len(table.header)
    out += [
        "| " + " | ".join(table.header) + " |",
        "|" + "".join("---:|" if n else "---|" for n in numeric),
    ]
    out += [
        "| " + " | ".join(f"**{c.text}**" if c.best else c.text for c in row) + " |"
        for row in table.rows
    ]
    return out


def render_markdown(rep: Report) -> str:
    rehearsal = " (rehearsal)" if rep.tested is not None and rep.tested.rehearsal else ""
    out = [f"# soakd report: {rep.run_id}{rehearsal}", ""]
    out += [f"> **Warning:** {w}\n" for w in rep.warnings]  # what the journal lost: first
    out += [f"- {line}" for line in header_lines(rep)]
    for table in tested_tables(rep):
        out += md_table(table)
    for table in verdict_tables(rep):
        out += md_table(table)
    out += md_table(metric_table(rep, "Targets side by side", rep.overall))
    for extra in (
        cost_table(rep),
        guard_table(rep),
        errors_table(rep, "Errors by kind"),
        prompt_table(rep),
        output_table(rep),
        context_table(rep),
        *turn_tables(rep),
        prefix_table(rep),
        *check_tables(rep.checks),
    ):
        if extra is not None:
            out += md_table(extra)
    for phase in rep.phases:
        rows = rep.by_phase[phase]
        out += md_table(
            metric_table(rep, phase_title(rep, phase), rows, PHASE_COLUMNS, marks=False)
        )
        verdicts = phase_verdict_table(rep, phase)
        if verdicts is not None:
            out += md_table(verdicts, "###")
    gpus = gpu_table(rep)
    if gpus is not None:
        out += md_table(gpus)
    if rep.downtimes:
        out += ["", "## Downtime", ""]
        out += [
            f"- at {d['offset_h']:.3f} h of plan time: down {fmt_duration(d['seconds'])}"
            for d in rep.downtimes
        ]
    for table in slowest_tables(rep):
        out += md_table(table)
    out += ["", "## Notes", ""] + [f"- {n}" for n in rep.notes + definitions(rep)]
    return "\n".join(out) + "\n"
