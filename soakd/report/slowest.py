"""Slowest room: the N slowest requests of each target and phase, from the journal, with the
trace id each one carried (soakd/tracing.py), so a slow request leads to the server's trace.

Slowest means the longest send-to-last-byte time (``e2e``) of a request that was sent,
whatever its outcome: a request cut by a timeout is among the slowest by design, and its
outcome says so. Rows deleted by retention are not there to rank.

One pass over the rows, filtered in SQLite: the rollups' digests say, per target and phase,
about where the slowest few begin, and only rows at or above that (a little below, for the
digest's error) come back to Python, where a heap per group keeps the N slowest. A group
for which the filter let fewer than N rows through (the digest holds successes only, and
rows may be gone) is ranked again by its own exact query, so the answer is always exact.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from soakd.journal import JournalReader, Rollup
from soakd.measure.analysis import Digest
from soakd.model import OK
from soakd.tracing import trace_id

__all__ = ["DEFAULT_N", "SlowRequest", "slowest", "slowest_sections"]

DEFAULT_N: Final = 10
NS_PER_S: Final = 1_000_000_000
_MARGIN: Final = 0.95
"""The filter starts this far below the digest's estimate (its values are within ~1 %)."""
_COLUMNS: Final = (
    "id, target, phase, seq, wall, sent_ns, e2e_ns, ttft_ns, status, error, output_tokens"
)

Group = tuple[str, str]
"""(target, phase)."""


@dataclass(frozen=True, slots=True)
class SlowRequest:
    """One slow request as the report lists it. Times in seconds; ``wall`` is Unix time at
    send, ``offset_s`` plan time at send; ``trace_id`` None when the target sent none."""

    target: str
    phase: str
    seq: int
    wall: float
    offset_s: float
    e2e_s: float
    ttft_s: float | None
    outcome: str
    status: int
    output_tokens: int | None  # None: unknown (docs/journal.md)
    trace_id: str | None


def slowest(
    reader: JournalReader, n: int = DEFAULT_N, rollups: Sequence[Rollup] | None = None
) -> dict[str, dict[str, list[SlowRequest]]]:
    """target -> phase -> its ``n`` slowest requests, slowest first. ``rollups``: the
    reader's, when the caller has them already (they only narrow the scan)."""
    if n <= 0:
        return {}
    conn = reader.conn
    limits = _limits(reader.rollups() if rollups is None else rollups, n)
    for target, phase, *_ in reader.totals():  # a group no rollup knows: every row of it
        limits.setdefault((target, phase), 0)
    heaps: dict[Group, list[tuple[int, int, tuple[Any, ...]]]] = {}
    for row in conn.execute(*_filtered(limits)):
        heap = heaps.setdefault((row[1], row[2]), [])
        item = (row[6], -row[0], row)  # e2e, then the earlier row first among equals
        if len(heap) < n:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    for group, limit in limits.items():
        if limit > 0 and len(heaps.get(group, ())) < n:  # the filter was too tight: exact
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM requests WHERE target = ? AND phase = ? "  # noqa: S608
                "AND e2e_ns IS NOT NULL ORDER BY e2e_ns DESC, id LIMIT ?",
                (*group, n),
            )
            heaps[group] = [(r[6], -r[0], r) for r in rows]
    run_id = reader.stored.run_id
    traced = reader.stored.config.traced()
    out: dict[str, dict[str, list[SlowRequest]]] = {}
    for (target, phase), heap in sorted(heaps.items()):
        ranked = [row for _, _, row in sorted(heap, reverse=True)]
        if ranked:
            out.setdefault(target, {})[phase] = [
                _slow(row, run_id if target in traced else None) for row in ranked
            ]
    return out


def _limits(rollups: Iterable[Rollup], n: int) -> dict[Group, int]:
    """Per group, an e2e (ns) that about 2n of its successes reach; 0 (every row) for a
    group with too few successes to estimate one."""
    merged: dict[Group, Digest] = {}
    for r in rollups:
        merged.setdefault((r.target, r.phase), Digest()).merge(r.stats.e2e)
    limits = {}
    for group, digest in merged.items():
        value = digest.quantile(1 - 2 * n / digest.count) if digest.count >= 4 * n else None
        limits[group] = 0 if value is None else int(value * _MARGIN)
    return limits


def _filtered(limits: dict[Group, int]) -> tuple[str, list[Any]]:
    """The one scan: rows of each group at or above its limit (every row of a group with a
    limit of 0). The lowest limit first: one comparison turns most rows away."""
    cases: list[str] = []
    params: list[Any] = [min(limits.values(), default=0)]
    for (target, phase), limit in limits.items():
        if limit > 0:
            cases.append("WHEN target = ? AND phase = ? THEN ?")
            params += [target, phase, limit]
    where = "e2e_ns >= ?"
    if cases:
        where += f" AND e2e_ns >= CASE {' '.join(cases)} ELSE 0 END"
    return f"SELECT {_COLUMNS} FROM requests WHERE {where}", params  # noqa: S608


def _slow(row: tuple[Any, ...], run_id: str | None) -> SlowRequest:
    _, target, phase, seq, wall, sent_ns, e2e_ns, ttft_ns, status, error, tokens = row
    return SlowRequest(
        target=target,
        phase=phase,
        seq=int(seq),
        wall=float(wall),
        offset_s=(sent_ns or 0) / NS_PER_S,
        e2e_s=e2e_ns / NS_PER_S,
        ttft_s=None if ttft_ns is None else ttft_ns / NS_PER_S,
        outcome=error or OK,
        status=int(status),
        output_tokens=None if tokens is None else int(tokens),
        trace_id=None if run_id is None else trace_id(run_id, target, int(seq)),
    )


# --- rendering: the report's titled tables (title, header, rows) -------------------------


def slowest_sections(
    by_target: dict[str, dict[str, list[SlowRequest]]], phases: Sequence[str] = ()
) -> list[tuple[str, list[str], list[list[str]]]]:
    """One table per target, its phases in plan order (``phases``), slowest first in each."""
    header = [
        "phase",
        "#",
        "sent (UTC)",
        "plan time",
        "E2E",
        "TTFT",
        "outcome",
        "status",
        "tokens",
        "seq",
        "trace id",
    ]
    sections = []
    for target, by_phase in by_target.items():
        order = [p for p in phases if p in by_phase] + sorted(set(by_phase) - set(phases))
        rows = [
            [
                phase,
                str(rank),
                datetime.fromtimestamp(s.wall, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                _clock(s.offset_s),
                _seconds(s.e2e_s),
                "-" if s.ttft_s is None else _seconds(s.ttft_s),
                s.outcome,
                str(s.status) if s.status else "-",
                "-" if s.output_tokens is None else str(s.output_tokens),
                str(s.seq),
                s.trace_id or "-",
            ]
            for phase in order
            for rank, s in enumerate(by_phase[phase], 1)
        ]
        most = max(len(v) for v in by_phase.values())
        sections.append((f"The {most} slowest requests of {target}, per phase", header, rows))
    return sections


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def _clock(offset_s: float) -> str:
    whole = int(offset_s)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
