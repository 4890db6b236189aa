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
- Leak slope: ``analysis.leak_slope``, Theil-Sen slope of the memory series over plan
  time (bytes/hour).
- Energy: the increase of ``soakd_gpu_energy_joules_total`` (or power integrated) of the
  GPUs charged to a target (``analysis.energy_share``): ``cost.gpus``, else the GPUs its
  process was seen on, else every GPU when there is only one target.
- Cost: soakd/measure/cost.py (hourly price or energy, hardware amortisation, token prices);
  per million output tokens and per month at the measured load.
- Goodput, verdicts and the baseline comparison: soakd/measure/goodput.py and
  soakd/measure/verdicts.py (docs/slo.md); this package only wires and renders them.

The rooms: ``build`` (journal -> ``Report``; ``rows`` makes each row from values,
``decisions`` judges them, ``samples`` places probe readings on plan time, ``plots`` bins
the series), ``model`` (the dataclasses, the metric columns),
``tested`` (the head: what was tested, from the journal's config and plan), ``table``
(the one table model every renderer draws), ``markdown``, ``html``, ``terminal``,
``write`` (JSON, files), ``names`` (every metric name read).
"""

from __future__ import annotations

from soakd.measure.analysis import Quantiles
from soakd.report.build import build_report
from soakd.report.decisions import decisions_from
from soakd.report.html import render_html, svg_chart
from soakd.report.markdown import render_markdown
from soakd.report.model import (
    METRIC_COLUMNS,
    NOT_RANKED,
    PHASE_COLUMNS,
    TERMINAL_COLUMNS,
    Column,
    Downtime,
    GpuRow,
    GuardRow,
    Report,
    Row,
    Series,
    value_of,
)
from soakd.report.names import SAMPLE_NAMES
from soakd.report.table import (
    Cell,
    Table,
    check_lines,
    fmt_criterion,
    fmt_value,
    verdict_title,
)
from soakd.report.terminal import final_verdict, terminal_summary
from soakd.report.write import render_json, write_built, write_report

__all__ = [
    "METRIC_COLUMNS",
    "NOT_RANKED",
    "PHASE_COLUMNS",
    "SAMPLE_NAMES",
    "TERMINAL_COLUMNS",
    "Cell",
    "Column",
    "Downtime",
    "GpuRow",
    "GuardRow",
    "Quantiles",
    "Report",
    "Row",
    "Series",
    "Table",
    "build_report",
    "check_lines",
    "decisions_from",
    "final_verdict",
    "fmt_criterion",
    "fmt_value",
    "render_html",
    "render_json",
    "render_markdown",
    "svg_chart",
    "terminal_summary",
    "value_of",
    "verdict_title",
    "write_built",
    "write_report",
]
