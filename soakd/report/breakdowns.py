"""Report room, breakdowns: latency by context length and by conversation turn, per target.

Read from the journal's request rows in one pass (their digests bounded by the keys of
soakd/measure/breakdown.py: 12 context buckets, 17 turns, per target and phase), so they
cover the rows the journal kept (retention and ``journal.max_bytes`` may have dropped
some: the main tables, from the rollups, still cover every request). The context is the
request's served prompt tokens: TTFT against it is the curve of KV-cache pressure. The
turn table is shown only for a run that had conversations.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from soakd.measure.analysis import Digest, fmt_ms
from soakd.measure.breakdown import CONTEXT_LABELS, TURN_LABELS, context_of, context_title, turn_of
from soakd.measure.goodput import classify
from soakd.report.model import Breakdown, Report, Series, SplitRow
from soakd.report.table import Table, cells, fmt_mean

_NS_PER_MS = 1e6


@dataclass(slots=True)
class _Acc:
    """One key's requests being read."""

    requests: int = 0
    errors: int = 0
    prompt_n: int = 0
    prompt_sum: int = 0
    ttft: Digest = field(default_factory=Digest)
    e2e: Digest = field(default_factory=Digest)
    itl: Digest = field(default_factory=Digest)

    def merge(self, other: _Acc) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_n += other.prompt_n
        self.prompt_sum += other.prompt_sum
        self.ttft.merge(other.ttft)
        self.e2e.merge(other.e2e)
        self.itl.merge(other.itl)

    def row(self, key: str) -> SplitRow:
        def ms(d: Digest, q: float) -> float | None:
            v = d.quantile(q)
            return None if v is None else v / _NS_PER_MS

        return SplitRow(
            key=key,
            requests=self.requests,
            errors=self.errors,
            ttft_p50_ms=ms(self.ttft, 0.5),
            ttft_p99_ms=ms(self.ttft, 0.99),
            e2e_p50_ms=ms(self.e2e, 0.5),
            e2e_p99_ms=ms(self.e2e, 0.99),
            itl_p50_ms=ms(self.itl, 0.5),
            prompt_tokens_mean=self.prompt_sum / self.prompt_n if self.prompt_n else None,
        )


_Keyed = dict[tuple[str, str, str, str], _Acc]  # (target, phase, by, key)


def breakdowns(
    conn: sqlite3.Connection, version: int, targets: Sequence[str], phases: Sequence[str]
) -> list[Breakdown]:
    """Per target, the whole run then each phase it ran in (``phases``' order)."""
    accs = _read(conn, version)
    out = []
    for target in targets:
        whole: dict[tuple[str, str], _Acc] = {}
        per_phase = []
        for phase in phases:
            mine = {(by, k): a for (t, p, by, k), a in accs.items() if (t, p) == (target, phase)}
            if not mine:
                continue
            per_phase.append(_breakdown(target, phase, mine))
            for k, a in mine.items():
                whole.setdefault(k, _Acc()).merge(a)
        if whole:
            out += [_breakdown(target, None, whole), *per_phase]
    return out


def _breakdown(target: str, phase: str | None, accs: dict[tuple[str, str], _Acc]) -> Breakdown:
    def rows(by: str, labels: Sequence[str]) -> list[SplitRow]:
        return [accs[(by, key)].row(key) for key in labels if (by, key) in accs]

    return Breakdown(target, phase, rows("context", CONTEXT_LABELS), rows("turn", TURN_LABELS))


def _read(conn: sqlite3.Connection, version: int) -> _Keyed:
    """Every request row, once, into its keys' accumulators."""
    turn_cols = "conversation, turn" if version >= 6 else "NULL, NULL"
    accs: _Keyed = {}
    query = (
        "SELECT target, phase, error, prompt_tokens, ttft_ns, e2e_ns, itl_p50_ns, "  # noqa: S608
        f"{turn_cols} FROM requests"
    )
    for target, phase, error, prompt, ttft, e2e, itl, conversation, turn in conn.execute(query):
        for by, key in (("context", context_of(prompt)), ("turn", turn_of(conversation, turn))):
            if key is None:
                continue
            a = accs.get((target, phase, by, key))
            if a is None:
                a = accs[(target, phase, by, key)] = _Acc()
            a.requests += 1
            if prompt:
                a.prompt_n += 1
                a.prompt_sum += prompt
            if error is not None:
                a.errors += classify(error) == "error"
                continue
            if ttft is not None:
                a.ttft.add(ttft)
            if e2e is not None:
                a.e2e.add(e2e)
            if itl is not None:
                a.itl.add(itl)
    return accs


def _ms(value: float | None) -> str:
    return fmt_ms(value)


def context_table(rep: Report) -> Table | None:
    """TTFT by context length over the whole run, a row per bucket, the targets side by
    side (requests, p50, p99 each)."""
    whole = {b.target: b for b in rep.breakdowns if b.phase is None and b.by_context}
    if not whole:
        return None
    header = ["context (served prompt tokens)"]
    for t in whole:
        header += [f"{t} requests", f"{t} TTFT p50", f"{t} TTFT p99"]
    table = Table("TTFT by context length", header, numeric=[False] + [True] * (len(header) - 1))
    for label in CONTEXT_LABELS:
        line = [context_title(label)]
        seen = False
        for b in whole.values():
            row = next((r for r in b.by_context if r.key == label), None)
            if row is None:
                line += ["-", "-", "-"]
                continue
            seen = True
            line += [f"{row.requests:,}", _ms(row.ttft_p50_ms), _ms(row.ttft_p99_ms)]
        if seen:
            table.rows.append(cells(line))
    return table


def turn_tables(rep: Report) -> list[Table]:
    """Per target that had conversations, latency by turn over the whole run."""
    out = []
    for b in rep.breakdowns:
        if b.phase is not None or not b.by_turn:
            continue
        table = Table(
            f"Latency by turn: {b.target}",
            [
                "turn",
                "requests",
                "errors",
                "TTFT p50",
                "TTFT p99",
                "E2E p50",
                "E2E p99",
                "ITL p50",
                "context (mean served prompt tokens)",
            ],
            numeric=[False] + [True] * 8,
        )
        for r in b.by_turn:
            table.rows.append(
                cells(
                    [
                        r.key,
                        f"{r.requests:,}",
                        f"{r.errors:,}",
                        _ms(r.ttft_p50_ms),
                        _ms(r.ttft_p99_ms),
                        _ms(r.e2e_p50_ms),
                        _ms(r.e2e_p99_ms),
                        _ms(r.itl_p50_ms),
                        fmt_mean(r.prompt_tokens_mean),
                    ]
                )
            )
        out.append(table)
    return out


def context_series(rep: Report) -> list[Series]:
    """The context table as lines for the HTML report's curve: x the bucket's mean served
    prompt tokens (thousands), y the TTFT p50 (solid) and p99 (dashed) in ms, per target."""
    out = []
    for b in rep.breakdowns:
        if b.phase is not None or not b.by_context:
            continue
        points = [
            (r.prompt_tokens_mean / 1000, r)
            for r in b.by_context
            if r.prompt_tokens_mean is not None and r.ttft_p50_ms is not None
        ]
        if not points:
            continue
        out.append(Series(f"{b.target} p50", [(x, r.ttft_p50_ms) for x, r in points], b.target))
        out.append(
            Series(
                f"{b.target} p99", [(x, r.ttft_p99_ms) for x, r in points], b.target, dashed=True
            )
        )
    return out
