"""Journal codec room: how an Outcome becomes a row and back, ITL gaps as a BLOB, and the
``TargetStats`` blobs of the rollups. Pure: no IO, no state.

ITL gaps are stored one of two ways (``journal.itl``):

- ``compact`` (the default, column ``itl_hist``): the gaps' ``Digest`` buckets (2 % wide,
  the report's own precision) and how many gaps fell in each, as varints: ~1 byte a
  bucket, so a 512-token answer costs ~60-130 bytes instead of 2 KB. Read back, every gap
  is its bucket's middle (within 1 %), in ascending order, not in arrival order;
- ``exact`` (column ``itl``): every gap as uint32 little-endian microseconds, 4 bytes a gap.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import zlib
from array import array
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from soakd.measure.analysis import TargetStats, digest_counts, digest_value, itl_keys
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


_SPARSE, _DENSE, _NIBBLES = 0, 1, 2  # the first byte of an ``itl_hist`` blob


def _varints(out: bytearray, values: list[int]) -> None:
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)


def pack_itl_hist(gaps_ns: Sequence[int]) -> bytes:
    """Gaps as their ``Digest`` buckets: a mode byte, then varints. Sparse: the first key
    and its count, then (keys skipped, count) per bucket. Dense: the first key, the number
    of keys, then every key's count (zeros included), as varints, or two to a byte when
    every count is below 16 (nibbles, low first). Whichever is shorter."""
    return pack_itl_counts(digest_counts(gaps_ns))


def pack_itl_counts(counts: dict[int, int]) -> bytes:
    """``pack_itl_hist`` of gaps already counted by bucket (``analysis.itl_keys``)."""
    if not counts:
        return b""
    keys = sorted(counts)
    lo, span = keys[0], keys[-1] - keys[0] + 1
    nibbles = max(counts.values()) < 16
    dense_bytes = (span + 1) // 2 if nibbles else span
    if 2 * len(keys) <= dense_bytes:
        out = bytearray((_SPARSE,))
        sparse = [lo, counts[lo]]
        for prev, k in pairwise(keys):
            sparse += (k - prev - 1, counts[k])
        _varints(out, sparse)
        return bytes(out)
    dense = [counts.get(k, 0) for k in range(lo, lo + span)]
    out = bytearray((_NIBBLES if nibbles else _DENSE,))
    _varints(out, [lo, span])
    if nibbles:
        dense.append(0)
        out += bytes(a | b << 4 for a, b in zip(dense[::2], dense[1::2], strict=False))
    else:
        _varints(out, dense)
    return bytes(out)


def _read_varints(data: bytes, pos: int, n: int | None = None) -> tuple[list[int], int]:
    """``n`` varints (all when None) from ``data[pos:]``, and where they end."""
    values: list[int] = []
    v = shift = 0
    end = len(data)
    while pos < end and (n is None or len(values) < n):
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
        else:
            values.append(v)
            v = shift = 0
    return values, pos


def unpack_itl_hist(blob: bytes | None) -> array[int]:
    """Nanoseconds, each gap its bucket's middle (within 1 %), ascending."""
    out = array("q")
    if not blob:
        return out
    mode = blob[0]
    if mode == _SPARSE:
        values, _ = _read_varints(blob, 1)
        key = values[0] - 1
        for i in range(0, len(values), 2):
            key += values[i] + 1 if i else 1
            out.extend([digest_value(key)] * values[i + 1])
        return out
    (lo, span), pos = _read_varints(blob, 1, 2)
    if mode == _NIBBLES:
        counts = [c for b in blob[pos:] for c in (b & 0x0F, b >> 4)]
    else:
        counts = _read_varints(blob, pos)[0]
    for i, n in enumerate(counts[:span]):
        if n:
            out.extend([digest_value(lo + i)] * n)
    return out


def row_itl_ns(row: Mapping[str, Any] | sqlite3.Row) -> array[int]:
    """A row's gaps in ns: exact ones (``itl``) or the compact buckets' (``itl_hist``)."""
    exact = row["itl"]
    if exact:
        return array("q", [us * 1000 for us in unpack_itl(exact)])
    return unpack_itl_hist(row["itl_hist"])


def outcome_row(
    o: Outcome, rid: int, session: int, origin: int, *, itl: str = "compact"
) -> tuple[tuple[Any, ...], list[int]]:
    """The ``requests`` row of an outcome (instants as offsets from the plan's ``origin``),
    and its inter-token gaps sorted (the writer counts them into the ITL histogram).
    ``itl``: ``compact`` (buckets in ``itl_hist``), ``exact`` (every gap in ``itl``) or
    ``none`` (neither; count, mean, p50 and max are always stored)."""
    sent = o.sent_ns - origin if o.sent_ns else None
    end_ns = max(0, (o.end_ns or time.perf_counter_ns()) - origin)
    ok = o.error is None
    gaps = o.itl_ns
    n = len(gaps)
    itl_mean = itl_p50 = itl_max = None
    blob = hist = None
    ordered: list[int] = []
    if n:
        ordered = sorted(gaps)
        itl_mean = sum(ordered) // n
        itl_p50 = (ordered[(n - 1) // 2] + ordered[n // 2]) // 2
        itl_max = ordered[-1]
        if itl == "compact":
            hist = pack_itl_counts(itl_keys(o))
        elif itl == "exact":
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
        hist,
        o.usage_delta,
        o.usage_rejected or None,
        None if o.conversation < 0 else o.conversation,
        None if o.conversation < 0 else o.turn,
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
    o.usage_delta = row["usage_delta"]
    o.usage_rejected = row["usage_rejected"] or ""
    o.itl_ns = row_itl_ns(row)
    if row["conversation"] is not None:
        o.conversation = row["conversation"]
        o.turn = row["turn"] or 0
    return o


def stats_to_blob(stats: TargetStats) -> bytes:
    return zlib.compress(json.dumps(stats.to_state(), separators=(",", ":")).encode(), 6)


def stats_from_blob(blob: bytes) -> TargetStats:
    return TargetStats.from_state(json.loads(zlib.decompress(blob)))


def copy_stats(stats: TargetStats) -> TargetStats:
    out = TargetStats()
    out.merge(stats)
    return out
