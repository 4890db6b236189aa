"""Report room, fleet: several boxes' runs of one plan, side by side (``soakd report --fleet``).

Each run directory is reported as ``build_report`` reports it alone; this module only puts
the boxes next to each other: per box (run.node, run.site) and target the verdict, goodput,
P99s, VRAM peak, OOMs, leak slope and downtime, the worst box first. The runs must be of
the same plan (phases, their lengths and loads, the workload, the targets' names, the SLO):
otherwise the comparison says nothing, and ``build_fleet`` refuses with the first
difference (``PlanMismatch``, one line).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from soakd.journal import JournalReader
from soakd.journal.stored import StoredRun
from soakd.jsondiff import differences
from soakd.report.build import build_report
from soakd.report.model import Report, value_of
from soakd.report.table import (
    Cell,
    Table,
    fmt_criterion,
    fmt_duration,
    fmt_value,
    result,
)

if TYPE_CHECKING:
    from rich.console import RenderableType


class PlanMismatch(ValueError):
    """Two runs of a fleet report do not share their plan; the message is one line."""


@dataclass
class FleetRow:
    """One target of one box over its whole run. None: not measured (or not judged)."""

    target: str
    passed: bool | None
    failed: list[str]  # the failing criteria, "ttft_p99 2.4 s (limit 2 s)"
    goodput: float | None
    ttft_p99_ms: float | None
    e2e_p99_ms: float | None
    error_ratio: float | None
    vram_peak_bytes: float | None
    oom_events: int | None
    oom_responses: int
    leak_bytes_per_hour: float | None
    leak_note: str | None


@dataclass
class FleetBox:
    """One box's run: who, where, its verdict and its targets."""

    node: str
    site: str | None
    run_dir: str
    run_id: str
    completed: bool
    passed: bool | None  # the run's overall verdict (soakd report --check on it alone)
    active_s: float
    downtime_s: float
    targets: list[FleetRow] = field(default_factory=list)


@dataclass
class FleetReport:
    plan: str  # what the runs share, in words
    boxes: list[FleetBox]  # worst first
    passed: bool | None  # False when any box fails; None when none was judged

    @property
    def failing(self) -> list[FleetBox]:
        return [b for b in self.boxes if b.passed is False]


# --- the plan the runs must share ---------------------------------------------------------


def plan_identity(stored: StoredRun, *, with_slo: bool = True) -> dict[str, object]:
    """What makes two runs the same soak, from what a journal stored: the resolved plan
    (scale, each phase's name, length and loads), the workload, the targets' names and,
    unless the report judges all runs by one config (``--config``), the SLO. Not the
    addresses, models or keys: those differ from box to box by design. Loads and the
    workload as stored (the keys this soakd reads)."""
    config, plan = stored.config, stored.plan
    out: dict[str, object] = {
        "plan.scale": plan.scale,
        "phases": [
            {
                "name": p.name,
                "duration_s": (p.end_ns - p.start_ns) / 1e9,
                "loads": {t: load.model_dump(exclude_unset=True) for t, load in p.loads.items()},
            }
            for p in plan.phases
        ],
        "workload": config.workload.model_dump(exclude_unset=True),
        "targets": [t.name for t in config.targets],
    }
    if with_slo:
        out["slo"] = config.slo
        out["targets.slo"] = {t.name: t.slo for t in config.targets}
    return out


def first_difference(a: object, b: object) -> tuple[str, object, object] | None:
    """The first place two plan identities differ (``jsondiff.differences``): (dotted
    path, a's value, b's); two lists of different lengths by their counts."""
    d = next(differences(a, b), None)
    if d is None:
        return None
    if isinstance(d.a, list) and isinstance(d.b, list):
        return (f"{d.path} (count)", len(d.a), len(d.b))
    return (d.path, d.a, d.b)


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_plan(stored: StoredRun) -> str:
    phases = ", ".join(
        f"{p.name} {fmt_duration((p.end_ns - p.start_ns) / 1e9)}" for p in stored.plan.phases
    )
    return f"targets {', '.join(t.name for t in stored.config.targets)}; phases {phases}"


# --- building -----------------------------------------------------------------------------


def build_fleet(
    run_dirs: Sequence[Path],
    *,
    energy_price_per_kwh: float | None = None,
    judge_by: Mapping[str, object] | None = None,
) -> FleetReport:
    """Every run's report, side by side, the worst box first. Raises ``PlanMismatch`` when
    a run's plan differs from the first one's (``judge_by``: every run is judged by that
    config's SLO, so their own SLOs need not agree)."""
    runs = []
    for run_dir in run_dirs:
        with JournalReader(run_dir) as reader:
            runs.append(reader.stored)
    identities = [plan_identity(run, with_slo=judge_by is None) for run in runs]
    for run_dir, identity in zip(run_dirs[1:], identities[1:], strict=True):
        diff = first_difference(identities[0], identity)
        if diff is not None:
            where, theirs, mine = diff
            raise PlanMismatch(
                f"{run_dir}: not the plan of {run_dirs[0]} ({where}: {_short(mine)} here, "
                f"{_short(theirs)} there); a fleet report compares one plan on several boxes"
            )
    boxes = []
    for run_dir in run_dirs:
        rep = build_report(
            run_dir, energy_price_per_kwh=energy_price_per_kwh, judge_by=judge_by, slowest_n=0
        )
        boxes.append(_box(run_dir, rep))
    boxes.sort(key=_badness)
    judged = [b.passed for b in boxes if b.passed is not None]
    return FleetReport(
        plan=describe_plan(runs[0]),
        boxes=boxes,
        passed=(all(judged) if judged else None),
    )


def _box(run_dir: Path, rep: Report) -> FleetBox:
    rows = []
    for t in rep.targets:
        row, verdict = rep.overall[t], rep.verdicts.get(t)
        failed = [
            f"{c.name} {fmt_criterion(c.unit, c.measured)} (limit {fmt_criterion(c.unit, c.limit)})"
            for c in (verdict.failed if verdict is not None else [])
        ]
        rows.append(
            FleetRow(
                target=t,
                passed=verdict.passed if verdict is not None else None,
                failed=failed,
                goodput=row.goodput,
                ttft_p99_ms=value_of(row, "ttft.p99"),
                e2e_p99_ms=value_of(row, "e2e.p99"),
                error_ratio=row.error_ratio,
                vram_peak_bytes=row.vram_peak_bytes,
                oom_events=row.oom_events,
                oom_responses=row.oom_responses,
                leak_bytes_per_hour=row.leak_bytes_per_hour,
                leak_note=row.leak_note,
            )
        )
    tested = rep.tested
    return FleetBox(
        node=(tested.node if tested is not None else "") or "-",
        site=tested.site if tested is not None else None,
        run_dir=str(run_dir),
        run_id=rep.run_id,
        completed=rep.completed,
        passed=rep.passed,
        active_s=rep.active_s,
        downtime_s=rep.downtime_s,
        targets=rows,
    )


def _badness(box: FleetBox) -> tuple[int, int, float, float, int, str]:
    """Sort key, the worst box first: failed before not judged before passed; then more
    failing targets, lower worst goodput, more downtime, more OOMs; then by name."""
    rank = {False: 0, None: 1, True: 2}[box.passed]
    failing = sum(1 for r in box.targets if r.passed is False)
    goodputs = [r.goodput for r in box.targets if r.goodput is not None]
    ooms = sum((r.oom_events or 0) + r.oom_responses for r in box.targets)
    return (rank, -failing, min(goodputs, default=1.0), -box.downtime_s, -ooms, box.node)


# --- rendering ------------------------------------------------------------------------------

HEADER = [
    "node",
    "site",
    "target",
    "verdict",
    "goodput",
    "TTFT p99",
    "E2E p99",
    "error ratio",
    "VRAM peak",
    "OOM events",
    "OOM responses",
    "VRAM leak slope",
    "downtime",
]


def fleet_table(fr: FleetReport) -> Table:
    """One row per box and target, the worst box first."""
    rows = []
    for box in fr.boxes:
        for r in box.targets:
            leak = (
                fmt_value("leak_bytes_per_hour", r.leak_bytes_per_hour)
                if r.leak_bytes_per_hour is not None
                else (r.leak_note or "-")
            )
            rows.append(
                [
                    Cell(box.node),
                    Cell(box.site or "-"),
                    Cell(r.target),
                    Cell(result(r.passed)),
                    Cell(fmt_value("goodput", r.goodput)),
                    Cell(fmt_value("ttft.p99", r.ttft_p99_ms)),
                    Cell(fmt_value("e2e.p99", r.e2e_p99_ms)),
                    Cell(fmt_value("error_ratio", r.error_ratio)),
                    Cell(fmt_value("vram_peak_bytes", r.vram_peak_bytes)),
                    Cell(fmt_value("oom_events", r.oom_events)),
                    Cell(fmt_value("oom_responses", r.oom_responses)),
                    Cell(leak),
                    Cell(fmt_duration(box.downtime_s)),
                ]
            )
    numeric = [i >= 4 for i in range(len(HEADER))]
    return Table("Boxes side by side, worst first", HEADER, rows, numeric)


def fleet_header(fr: FleetReport) -> list[str]:
    failing = fr.failing
    judged = sum(1 for b in fr.boxes if b.passed is not None)
    state = (
        "not judged (no slo in the runs' config)"
        if fr.passed is None
        else ("all pass" if fr.passed else f"{len(failing)} of {judged} judged FAIL")
    )
    return [
        f"{len(fr.boxes)} boxes, one plan: {fr.plan}",
        f"verdict: {state}",
        *(
            f"{b.node} ({b.site or '-'}): run {b.run_id} in {b.run_dir}, "
            f"{'completed' if b.completed else 'not completed'}, active "
            f"{fmt_duration(b.active_s)}, downtime {fmt_duration(b.downtime_s)}"
            for b in fr.boxes
        ),
    ]


def fleet_check_lines(fr: FleetReport) -> list[str]:
    """``--check``'s text: the fleet's verdict, then a line per box that fails."""
    lines = [fleet_header(fr)[1]]
    for box in fr.failing:
        reasons = "; ".join(
            f"{r.target}: {', '.join(r.failed) or 'FAIL'}" for r in box.targets if r.passed is False
        )
        lines.append(f"{box.node} ({box.site or '-'}): FAIL: {reasons}")
    return lines


def render_fleet_markdown(fr: FleetReport) -> str:
    from soakd.report.markdown import md_table

    out = ["# soakd fleet report", ""]
    out += [f"- {line}" for line in fleet_header(fr)]
    out += md_table(fleet_table(fr))
    failing = fleet_check_lines(fr)[1:]
    if failing:
        out += ["", "## Failing", ""] + [f"- {line}" for line in failing]
    out += [
        "",
        "## Notes",
        "",
        "- Each box's figures are its own report's (`soakd report DIR`): whole run, every "
        "session; goodput and the verdict per docs/slo.md. Worst first: failing boxes, then "
        "not judged, then passing; within those more failing targets, lower goodput, more "
        "downtime, more OOMs first.",
    ]
    return "\n".join(out) + "\n"


def render_fleet_html(fr: FleetReport) -> str:
    from soakd.report.html import _CSS, html_table

    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>soakd fleet report</title><style>{_CSS}</style></head><body>",
        "<h1>soakd fleet report</h1>",
    ]
    parts += [f'<p class="meta">{e(line)}</p>' for line in fleet_header(fr)]
    parts.append(html_table(fleet_table(fr), row_sep="\n"))
    failing = fleet_check_lines(fr)[1:]
    if failing:
        parts.append("<h2>Failing</h2><ul>" + "".join(f"<li>{e(x)}</li>" for x in failing))
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_fleet_json(fr: FleetReport) -> str:
    return json.dumps(asdict(fr), indent=2, default=str) + "\n"


def fleet_terminal(fr: FleetReport) -> list[RenderableType]:
    from rich.text import Text

    from soakd.report.terminal import rich_table

    return [Text("\n".join(fleet_header(fr))), rich_table(fleet_table(fr))]


FLEET_RENDERERS = {
    "md": render_fleet_markdown,
    "html": render_fleet_html,
    "json": render_fleet_json,
}
