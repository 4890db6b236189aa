"""bench/stub.py's statistics: how late each write left (Lateness), a worker's stats file at
exit (_write_stats); on the harness's side, the live counter of every worker (read_counter)
and their stats files summed (merge_stats)."""

from __future__ import annotations

import json
import struct
from array import array
from typing import Any


class Lateness:
    """How late writes left: 10 us buckets up to 20 ms, then one overflow bucket."""

    WIDTH_NS = 10_000
    NBUCKETS = 2001

    def __init__(self) -> None:
        self.n = 0
        self.total_ns = 0
        self.max_ns = 0
        self.buckets = [0] * self.NBUCKETS

    def add(self, late_ns: int) -> None:
        late_ns = max(0, late_ns)
        self.n += 1
        self.total_ns += late_ns
        if late_ns > self.max_ns:
            self.max_ns = late_ns
        self.buckets[min(self.NBUCKETS - 1, late_ns // self.WIDTH_NS)] += 1

    def quantile_ms(self, q: float) -> float | None:
        """Upper edge of the bucket holding the q-quantile (ms)."""
        if not self.n:
            return None
        rank, seen = q * self.n, 0
        for i, c in enumerate(self.buckets):
            seen += c
            if seen >= rank:
                return (i + 1) * self.WIDTH_NS / 1e6
        return self.max_ns / 1e6

    def doc(self) -> dict[str, object]:
        return {
            "n": self.n,
            "total_ns": self.total_ns,
            "max_ns": self.max_ns,
            "buckets_10us": self.buckets,
        }


def _write_stats(path: str, doc: dict[str, Any], arrivals: array[int] | None) -> None:
    """A worker's stats at exit, once its server has closed (nothing left to delay)."""
    if arrivals is not None:
        with open(path[:-5] + ".arrivals", "wb") as f:
            arrivals.tofile(f)
    with open(path, "w") as f:
        json.dump(doc, f)


def read_counter(path: str) -> tuple[int, int]:
    """(answers finished, tokens sent) summed over the workers of a --counter-file."""
    with open(path, "rb") as f:
        data = f.read()
    done = tok = 0
    for i in range(0, len(data) - 15, 16):
        d, t = struct.unpack_from("<QQ", data, i)
        done += d
        tok += t
    return done, tok


def merge_stats(paths: list[str]) -> dict[str, object]:
    """Sum the workers' stats files: requests, tokens, write lateness mean/p50/p99/max (ms)."""
    req = tok = conns = 0
    out: dict[str, object] = {}
    agg: dict[str, Lateness] = {"late": Lateness(), "ttft_late": Lateness()}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        req += d["requests"]
        tok += d["tokens"]
        conns += d.get("connections", 0)
        for k, lat in agg.items():
            lat.n += d[k]["n"]
            lat.total_ns += d[k]["total_ns"]
            lat.max_ns = max(lat.max_ns, d[k]["max_ns"])
            lat.buckets = [a + b for a, b in zip(lat.buckets, d[k]["buckets_10us"], strict=True)]
    out["requests"], out["tokens"], out["connections"] = req, tok, conns
    for k, lat in agg.items():
        out[k] = {
            "n": lat.n,
            "mean_ms": lat.total_ns / lat.n / 1e6 if lat.n else None,
            "p50_ms": lat.quantile_ms(0.5),
            "p99_ms": lat.quantile_ms(0.99),
            "max_ms": lat.max_ns / 1e6,
        }
    return out
