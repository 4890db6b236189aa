"""Report room, checks: what the answers to checks were (docs/checks.md), from the journal's
``check`` and ``identity`` events. Per target and phase the checks judged, their pass ratio
and their share of the requests; the first failing answers (cut short); each reference
check's similarity distribution; each change of what a target said it is, and when."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from soakd.journal.records import CheckJudged, Identity, Logged, Preflight, each
from soakd.report.table import Cell, Table, cells, fmt_duration

FIRST_FAILING = 10
"""Failing answers shown, the first ones of the run."""


@dataclass(frozen=True)
class CheckRow:
    target: str
    phase: str
    judged: int
    passed: int
    failed: int
    unparseable: int
    share: float | None  # judged checks / requests of the target in the phase

    @property
    def pass_ratio(self) -> float | None:
        return self.passed / self.judged if self.judged else None


@dataclass(frozen=True)
class Failing:
    target: str
    phase: str
    at_s: float  # plan time
    check: str
    result: str
    answer: str  # its first characters (soakd/checks/mix.py ANSWER_SHOWN)


@dataclass(frozen=True)
class Similarity:
    target: str
    n: int
    low: float
    p10: float
    median: float
    high: float


@dataclass(frozen=True)
class Checked:
    rows: list[CheckRow] = field(default_factory=list)
    failing: list[Failing] = field(default_factory=list)
    similarity: list[Similarity] = field(default_factory=list)
    identity: list[str] = field(default_factory=list)  # one line a change
    started: list[str] = field(default_factory=list)  # what each target said it was at start


def checked(
    events: list[Logged], requests: Mapping[tuple[str, str], int], order: Iterable[str]
) -> Checked | None:
    """The checks' part of the report (None: the run had none). ``requests``: by (target,
    phase); ``order``: the targets in the report's order."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    failing: list[Failing] = []
    scores: dict[str, list[float]] = {}
    for row, e in each(events, CheckJudged):
        by = counts.setdefault((e.target, e.phase), {})
        by[e.result] = by.get(e.result, 0) + 1
        if e.result != "pass" and len(failing) < FIRST_FAILING:
            shown = _one_line(e.answer)
            failing.append(Failing(e.target, e.phase, row.offset_s, e.check, e.result, shown))
        if e.score is not None:
            scores.setdefault(e.target, []).append(e.score)
    identity = [
        f"{e.target}: {_named(e.previous_model, e.previous_fingerprint)} → "
        f"{_named(e.model, e.fingerprint)} at {fmt_duration(row.offset_s)}"
        for row, e in each(events, Identity)
        if e.previous_model or e.previous_fingerprint
    ]
    started = _started(events)
    if not counts and not identity and not started:
        return None
    rank = {t: i for i, t in enumerate(order)}
    rows = []
    for (target, phase), by in sorted(counts.items(), key=lambda kv: rank.get(kv[0][0], 1 << 30)):
        n = sum(by.values())
        sent = requests.get((target, phase), 0)
        rows.append(
            CheckRow(
                target,
                phase,
                n,
                by.get("pass", 0),
                by.get("fail", 0),
                by.get("unparseable", 0),
                n / sent if sent else None,
            )
        )
    spread = [_spread(t, scores[t]) for t in sorted(scores, key=lambda t: rank.get(t, 1 << 30))]
    return Checked(rows, failing, spread, identity, started)


def _started(events: list[Logged]) -> list[str]:
    """Per target, its first answers' model (and fingerprint), its models list and vLLM's
    version, as the checks saw them at start."""
    said: dict[str, list[str]] = {}
    for _, e in each(events, Identity):
        if not e.previous_model and not e.previous_fingerprint and e.target not in said:
            said[e.target] = [f"answers as {_named(e.model, e.fingerprint)}"]
    for _, p in each(events, Preflight):
        if p.target not in said:
            continue
        if p.models is not None:
            shown = ", ".join(p.models[:5]) + (" ..." if len(p.models) > 5 else "")
            said[p.target].append(f"lists {shown or 'no model'}")
        if p.version is not None:
            said[p.target].append(f"vLLM {p.version}")
    return [f"{t}: {'; '.join(parts)}" for t, parts in said.items()]


def correct_ratio(c: Checked | None, target: str, phase: str | None) -> float | None:
    """Checks passed / judged of ``target`` in ``phase`` (None: over the run); None: none."""
    if c is None:
        return None
    rows = [r for r in c.rows if r.target == target and (phase is None or r.phase == phase)]
    judged = sum(r.judged for r in rows)
    return sum(r.passed for r in rows) / judged if judged else None


def _one_line(answer: str) -> str:
    """An answer as one table cell: its line breaks and pipes shown, not obeyed."""
    return answer.replace("\n", "⏎").replace("|", "¦") or "(empty)"


def _named(model: str, fingerprint: str) -> str:
    shown = model or "(no model)"
    return f"{shown} ({fingerprint})" if fingerprint else shown


def _spread(target: str, scores: list[float]) -> Similarity:
    ordered = sorted(scores)
    p10 = statistics.quantiles(ordered, n=10)[0] if len(ordered) > 1 else ordered[0]
    return Similarity(
        target, len(ordered), ordered[0], p10, statistics.median(ordered), ordered[-1]
    )


def check_tables(c: Checked | None) -> list[Table]:
    """The checks' tables (none without checks)."""
    if c is None or not c.rows:
        return []
    tables = [
        Table(
            "Checks: answers judged (pass ratio per target and phase)",
            ["target", "phase", "checks", "pass", "fail", "unparseable", "pass ratio", "share"],
            [
                [
                    *cells([r.target, r.phase]),
                    *cells(f"{v:,}" for v in (r.judged, r.passed, r.failed, r.unparseable)),
                    Cell(_pct(r.pass_ratio)),
                    Cell(_pct(r.share)),
                ]
                for r in c.rows
            ],
            [False, False, True, True, True, True, True, True],
        )
    ]
    if c.failing:
        tables.append(
            Table(
                "Checks: the first failing answers",
                ["target", "phase", "at", "check", "result", "answer (first characters)"],
                [
                    cells([f.target, f.phase, fmt_duration(f.at_s), f.check, f.result, f.answer])
                    for f in c.failing
                ],
                [False, False, True, False, False, False],
            )
        )
    if c.similarity:
        tables.append(
            Table(
                "Checks: reference similarity (ROUGE-L F1)",
                ["target", "scored", "lowest", "p10", "median", "highest"],
                [
                    [
                        Cell(s.target),
                        Cell(f"{s.n:,}"),
                        *cells(f"{v:.3f}" for v in (s.low, s.p10, s.median, s.high)),
                    ]
                    for s in c.similarity
                ],
                [False, True, True, True, True, True],
            )
        )
    return tables


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f} %"
