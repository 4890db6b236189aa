"""Slowest-requests bench: the report's "N slowest per target and phase" on a large journal.

    .venv/bin/python bench/slowest_bench.py                     # 1M requests, built in a temp dir
    .venv/bin/python bench/slowest_bench.py -n 200000 --keep /tmp/j   # keep the run dir

Builds a run directory through the journal's own writer (two targets, three phases,
log-normal latencies, 1 % failures), then times, on the same journal:

- ``slowest()``: soakd's way (one scan, filtered in SQLite by the rollups' digests);
- one exact ``ORDER BY e2e_ns DESC LIMIT N`` query per target and phase (a full scan each);
- a plain Python pass over every row with a heap per group;

and checks that the three agree. Peak RSS of the process is printed last.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import resource
import tempfile
import time
from array import array
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ParamSpec, TypeVar

from soakd.config import JournalConfig
from soakd.journal import JOURNAL_FILE, Journal, JournalReader, RunInfo
from soakd.model import ErrorKind, Outcome
from soakd.report.slowest import slowest

TARGETS = ("local", "cloud")
PHASES = ("warm", "steady", "spike")
S = 10**9
P = ParamSpec("P")
R = TypeVar("R")


class Clock:
    """The plan clock as the journal reads it: started an hour ago, never stopping."""

    def __init__(self) -> None:
        self.origin_ns = time.perf_counter_ns() - 3600 * S
        self.phase = None
        self.finished = False
        self.stopping = False
        self.stopped_ns = 0
        self.next_seq: dict[str, int] = {}
        self.missed: dict[tuple[str, str, str], int] = {}


def pool(size: int, seed: int = 3) -> list[Outcome]:
    rng = random.Random(seed)
    now = time.perf_counter_ns()
    out = []
    for i in range(size):
        e2e = int(rng.lognormvariate(math.log(0.8), 0.6) * S)
        ttft = e2e // 8
        sent = now - rng.randint(1, 3000) * S
        o = Outcome(TARGETS[i % 2], PHASES[(i // 2) % 3], i, sent)
        o.sent_ns, o.wall_start = sent, time.time()
        o.first_token_ns, o.last_token_ns, o.end_ns = sent + ttft, sent + e2e, sent + e2e
        o.status, o.output_tokens, o.prompt_tokens, o.usage_reported = 200, 16, 64, True
        o.itl_ns = array("q", [(e2e - ttft) // 15] * 15)
        if i % 100 == 7:
            o.error, o.status = ErrorKind.HTTP_5XX, 503
        out.append(o)
    return out


def build(run_dir: Path, n: int, itl: bool) -> float:
    outcomes = pool(20_000)
    info = RunInfo(
        "bench-slowest",
        {"targets": [{"name": t} for t in TARGETS]},
        {"phases": []},
        datetime.now(UTC),
        {},
        60 * S,
    )
    cfg = JournalConfig(synchronous="normal", itl_gaps=itl, queue_size=100_000)
    j = Journal(run_dir / JOURNAL_FILE, info, cfg)
    j.start()
    j.attach(Clock())
    t0 = time.perf_counter()
    queue = j._q
    for i in range(n):
        while len(queue) > 20_000:
            time.sleep(0.005)
        j.record(outcomes[i % len(outcomes)])
    j.close(completed=True)
    return time.perf_counter() - t0


def per_group_sql(reader: JournalReader, n: int) -> dict[tuple[str, str], list[float]]:
    """Each group's N largest e2e (seconds), by its own exact query."""
    out = {}
    for t in TARGETS:
        for p in PHASES:
            rows = reader.conn.execute(
                "SELECT e2e_ns FROM requests WHERE target = ? AND phase = ? "
                "AND e2e_ns IS NOT NULL ORDER BY e2e_ns DESC, id LIMIT ?",
                (t, p, n),
            )
            out[(t, p)] = [r[0] / 1e9 for r in rows]
    return out


def python_pass(reader: JournalReader, n: int) -> dict[tuple[str, str], list[float]]:
    heaps: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for rid, t, p, e2e in reader.conn.execute(
        "SELECT id, target, phase, e2e_ns FROM requests WHERE e2e_ns IS NOT NULL"
    ):
        heap = heaps.setdefault((t, p), [])
        item = (e2e, -rid)
        if len(heap) < n:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    return {k: [e2e / 1e9 for e2e, _ in sorted(h, reverse=True)] for k, h in heaps.items()}


def timed(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> tuple[R, float]:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1_000_000, help="requests (default 1M)")
    ap.add_argument("--top", type=int, default=10, help="N slowest per group")
    ap.add_argument("--itl", action="store_true", help="keep every ITL gap (bigger rows)")
    ap.add_argument("--keep", type=Path, help="build the run dir here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="soakd-slowest-") as tmp:
        run_dir = args.keep or Path(tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / JOURNAL_FILE).exists():
            built = build(run_dir, args.n, args.itl)
            print(f"built {args.n:,} requests in {built:.1f} s")
        size = (run_dir / JOURNAL_FILE).stat().st_size
        with JournalReader(run_dir) as r:
            rows = r.conn.execute("SELECT count(*) FROM requests").fetchone()[0]
            print(f"journal: {rows:,} rows, {size / 1e6:.0f} MB")
            ours, t_ours = timed(slowest, r, args.top)
            exact, t_sql = timed(per_group_sql, r, args.top)
            plain, t_py = timed(python_pass, r, args.top)
            rollups_s = timed(r.rollups)[1]
    got = {(t, p): [s.e2e_s for s in v] for t, by in ours.items() for p, v in by.items()}
    print(
        f"slowest() (one filtered scan)      {t_ours:7.2f} s  (reading rollups: {rollups_s:.2f} s)"
    )
    print(f"one ORDER BY query per group ({len(exact)}) {t_sql:7.2f} s")
    print(f"Python pass, heap per group        {t_py:7.2f} s")
    assert exact == plain, "the two references disagree"
    assert got == exact, "slowest() disagrees with the exact queries"
    print("agree: yes")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
