"""Report room, terminal: the report's tables as rich renderables (``soakd run``'s end,
``soakd report --format text``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from soakd.report.checks import check_tables
from soakd.report.model import TERMINAL_COLUMNS, Report
from soakd.report.output_tokens import output_table
from soakd.report.prefix_cache import prefix_table
from soakd.report.prompt_tokens import prompt_table
from soakd.report.table import (
    Table,
    check_lines,
    errors_table,
    guard_table,
    metric_table,
    verdict_tables,
)
from soakd.report.tested import header_lines, plan_table, target_lines

if TYPE_CHECKING:
    from rich.console import RenderableType


def _style(text: str, best: bool) -> str:
    if best:
        return "bold green"
    return "bold red" if text == "FAIL" else ("bold green" if text == "PASS" else "")


def rich_table(
    table: Table, *, title_style: str | None = None, numeric: list[bool] | None = None
) -> RenderableType:
    """A titled table (a title alone when it has no rows); a best cell or a PASS in green,
    a FAIL in red. ``numeric`` overrides the table's right-aligned columns."""
    from rich.table import Table as RichTable
    from rich.text import Text

    if not table.rows:
        return Text(table.title, style=title_style or "")
    right = numeric if numeric is not None else (table.numeric or [False] * len(table.header))
    out = RichTable(title=table.title, title_justify="left", title_style=title_style)
    for h, r in zip(table.header, right, strict=True):
        out.add_column(h, justify="right" if r else "left")
    for row in table.rows:
        out.add_row(*(Text(c.text, style=_style(c.text, c.best)) for c in row))
    return out


def terminal_summary(rep: Report) -> list[RenderableType]:
    """Rich renderables for ``soakd run``'s end and ``soakd report --format text``."""
    from rich.text import Text

    out: list[RenderableType] = [Text(f"WARNING: {w}", style="bold red") for w in rep.warnings]
    out.append(Text("\n".join(header_lines(rep))))
    targets = target_lines(rep)
    if targets:  # lines, not the table: they wrap whole on an 80-column terminal
        out.append(Text("What was tested", style="bold"))
        out.append(Text("\n".join(targets)))
    plan = plan_table(rep)
    if plan is not None:
        out.append(rich_table(plan))
    for table in verdict_tables(rep):
        # the criterion's name beside the target; figures and results to the right
        right = [i >= 2 for i in range(len(table.header))]
        out.append(rich_table(table, title_style="bold", numeric=right))
    out.append(
        rich_table(
            metric_table(rep, "targets side by side (✓ better)", rep.overall, TERMINAL_COLUMNS)
        )
    )
    guard = guard_table(rep)
    if guard is not None:
        out.append(rich_table(guard))
    errors = errors_table(rep, "errors by kind")
    if errors is not None:
        out.append(rich_table(errors))
    prompts = prompt_table(rep)
    if prompts is not None:
        out.append(rich_table(prompts))
    answers = output_table(rep)
    if answers is not None:
        out.append(rich_table(answers))
    prefixes = prefix_table(rep)
    if prefixes is not None:
        out.append(rich_table(prefixes))
    out += [rich_table(t) for t in check_tables(rep.checks)]
    out += [Text(f"note: {note}", style="dim") for note in rep.notes]
    return out


def final_verdict(rep: Report) -> RenderableType:
    """The verdict in a few lines (``report --check``'s), for the very end of ``soakd
    run``: the last thing printed, so that it stays on a small terminal's screen."""
    from rich.text import Text

    lines = check_lines(rep)
    style = "bold" if rep.passed is None else ("bold green" if rep.passed else "bold red")
    out = Text(lines[0], style=style)
    for line in lines[1:]:
        out.append("\n" + line, style="red" if ": FAIL" in line else "")
    if rep.warnings:  # the summary's first lines may have scrolled away
        out.append(
            f"\nWARNING: the journal lost or could not keep part of this run "
            f"({len(rep.warnings)} warning(s) at the top of the summary)",
            style="bold red",
        )
    return out
