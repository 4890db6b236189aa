"""Report room, failing targets: the notes that say a target never answered, or was paused
because every request failed in a way the next one could not fix (soakd/workload/failing.py).

Pure: reads the journal's events and the report's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from soakd.journal.records import Logged, TargetPaused, TargetResumed
from soakd.measure.analysis import SessionRow
from soakd.model import MissReason, PauseReason
from soakd.report.model import Row


def never_succeeded(requests: int, not_judged: int, ok: int) -> bool:
    """Judged requests (some failed, or were shed), and not one succeeded. Requests soakd
    itself cut at the stop (or lost with a sender process) judge nothing: a run stopped
    before its first answer came back did not show the target failing. The one rule of
    the report's note and of ``soakd run``'s exit status (from a report row, or from the
    session's summary when no report could be made)."""
    return requests - not_judged > 0 and ok == 0


def never_answered(rows: Mapping[str, Row] | Mapping[str, SessionRow]) -> dict[str, str]:
    """The targets that never succeeded (``never_succeeded``), each with its errors by
    kind, the most frequent first: ``soakd run``'s exit status, from the report's rows or,
    when no report could be made, from the session's summary."""
    out = {}
    for t, r in rows.items():
        if isinstance(r, Row):
            counts, kinds = (r.requests, r.not_judged, r.ok), r.errors_by_kind
        else:
            counts, kinds = (r["requests"], r["not_judged"], r["ok"]), r["errors_by_kind"]
        if never_succeeded(*counts):
            ranked = sorted(kinds.items(), key=lambda kv: -kv[1])
            out[t] = ", ".join(f"{k} {n:,}" for k, n in ranked)
    return out


def failing_notes(
    events: Sequence[Logged],
    overall: Mapping[str, Row],
    targets: Sequence[str],
    end_s: float,
) -> list[str]:
    """One note per target that never succeeded or was paused as failing; ``end_s``: the
    plan time the run reached (a pause still on then lasted until it)."""
    notes = []
    for t in targets:
        row = overall[t]
        parts = []
        if never_succeeded(row.requests, row.not_judged, row.ok):
            kinds = ", ".join(f"{k} {n:,}" for k, n in row.errors_by_kind.items())
            parts.append(f"never answered a request successfully ({row.requests:,} sent: {kinds})")
        pauses, paused_s, since = 0, 0.0, None
        last: TargetPaused | None = None
        for logged in events:
            match logged.event:
                case TargetPaused(target=target, reason=PauseReason.FAILING) as e if target == t:
                    pauses, since, last = pauses + 1, logged.offset_s, e
                case TargetResumed(target=target, reason=PauseReason.FAILING) if (
                    target == t and since is not None
                ):
                    paused_s, since = paused_s + max(0.0, logged.offset_s - since), None
        if last is not None:
            if since is not None:
                paused_s += max(0.0, end_s - since)
            detail = f": {last.detail}" if last.detail else ""
            skipped = row.missed_by_reason.get(MissReason.FAILING, 0)
            parts.append(
                f"paused as failing ({last.cause}{detail}) {pauses} time(s), "
                f"{paused_s:,.0f} s in all{', until the end' if since is not None else ''}, "
                f"one request at a time probing it; {skipped:,} planned sends not made "
                "meanwhile"
            )
        if parts:
            notes.append(f"{t}: " + "; ".join(parts))
    return notes
