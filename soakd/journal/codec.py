"""Journal codec room: how an Outcome becomes a row and back, ITL gaps as a BLOB, and the
``TargetStats`` blobs of the rollups. Pure: no IO, no state."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import zlib
from array import array
from collections.abc import Mapping
from typing import Any

from soakd.analysis import Digest, TargetStats
from soakd.model import ErrorKind, Outcome

_BIG = sys.byteorder == "big"


def pack_itl(gaps_ns: array[int]) -> bytes:
    """Inter-token gaps as uint32 little-endian microseconds: 4 bytes a gap, ~71 min max."""
    try:
        packed = array("I", [g // 1000 for g in gaps_ns])
    except OverflowError:  # a negative or > 71 min gap: clamp (never seen, never fatal)
        packed = array("I", [min(max(g, 0) // 1000, 0xFFFFFFFF) for g in gaps_ns])
    if _BIG:
        packed.byteswap()
    return packed.tobytes()


def unpack_itl(blob: bytes | None) -> array[int]:
    """Microseconds, as packed by ``pack_itl``."""
    out = array("I")
    if blob:
        out.frombytes(blob)
        if _BIG:
            out.byteswap()
    return out


def outcome_row(
    o: Outcome, rid: int, session: int, origin: int, *, itl_gaps: bool
) -> tuple[tuple[Any, ...], list[int]]:
    """The ``requests`` row of an outcome (instants as offsets from the plan's ``origin``),
    and its inter-token gaps sorted (the writer counts them into the ITL histogram)."""
    sent = o.sent_ns - origin if o.sent_ns else None
    end_ns = max(0, (o.end_ns or time.perf_counter_ns()) - origin)
    ok = o.error is None
    gaps = o.itl_ns
    n = len(gaps)
    itl_mean = itl_p50 = itl_max = None
    blob = None
    ordered: list[int] = []
    if n:
        ordered = sorted(gaps)
        itl_mean = sum(ordered) // n
        itl_p50 = (ordered[(n - 1) // 2] + ordered[n // 2]) // 2
        itl_max = ordered[-1]
        if itl_gaps:
            blob = pack_itl(gaps)
    row = (
        rid,
        session,
        o.wall_start,
        o.target,
        o.phase,
        o.seq,
        o.scheduled_ns - origin,
        sent,
        end_ns,
        o.dispatch_lag_ns if o.sent_ns else None,
        o.ttft_ns,
        o.e2e_ns if o.sent_ns and o.end_ns else None,
        o.tpot_ns,
        n,
        itl_mean,
        itl_p50,
        itl_max,
        blob,
        o.status,
        None if ok else o.outcome,
        int(o.oom),
        o.prompt_tokens,
        o.output_tokens,
        int(o.usage_reported),
    )
    return row, ordered


END_NS = 8
"""Index of ``end_ns`` in an ``outcome_row`` (the rollup window a request completed in)."""


def outcome_from_row(row: Mapping[str, Any] | sqlite3.Row) -> Outcome:
    """An Outcome rebuilt from a row, on the plan-offset axis (for TargetStats.add)."""
    sent = row["sent_ns"]
    o = Outcome(row["target"], row["phase"], row["seq"], row["scheduled_ns"])
    o.sent_ns = sent or 0
    o.wall_start = row["wall"]
    if sent is not None and row["ttft_ns"] is not None:
        o.first_token_ns = sent + row["ttft_ns"]
    o.end_ns = sent + row["e2e_ns"] if sent is not None and row["e2e_ns"] is not None else 0
    o.status = row["status"]
    o.error = ErrorKind(row["error"]) if row["error"] else None
    o.oom = bool(row["oom"])
    o.prompt_tokens = row["prompt_tokens"]
    o.output_tokens = row["output_tokens"]
    o.usage_reported = bool(row["usage_reported"])
    o.itl_ns = array("q", [us * 1000 for us in unpack_itl(row["itl"])])
    return o


def stats_to_blob(stats: TargetStats) -> bytes:
    doc = {
        "requests": stats.requests,
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "output_tokens": stats.output_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "digests": {
            name: getattr(stats, name).to_state() for name in ("ttft", "e2e", "itl", "tpot", "lag")
        },
    }
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def stats_from_blob(blob: bytes) -> TargetStats:
    doc = json.loads(zlib.decompress(blob))
    stats = TargetStats(
        requests=doc["requests"],
        ok=doc["ok"],
        output_tokens=doc["output_tokens"],
        prompt_tokens=doc["prompt_tokens"],
    )
    stats.errors.update(doc["errors"])
    for name, state in doc["digests"].items():
        setattr(stats, name, Digest.from_state(state))
    return stats


def copy_stats(stats: TargetStats) -> TargetStats:
    out = TargetStats()
    out.merge(stats)
    return out
