"""Make a realistic 72 h run directory of N requests, for timing the report, the export and a
resume at the size of a real soak.

    .venv/bin/python bench/make_journal.py /tmp/j1m --requests 1000000 --tokens 128
    .venv/bin/soakd report /tmp/j1m --format json -o /dev/null
    .venv/bin/soakd run /tmp/j1m/soak.yaml --run-dir /tmp/j1m   # a resume; Ctrl-C stops it

The journal is created by ``Journal`` itself (its tables, meta, budget and first session),
then filled the way the writer fills it: rows encoded by ``codec.outcome_row`` and inserted
with ``schema.INSERT_REQUEST`` (into a pool table; see INSERT_BLOCK), rollup windows by
``rollups.store_window``, totals, notes and histogram buckets from ``fold.Fold`` (each
outcome folded once, as the writer folds a batch: ``Fold.add`` with the row's end). Two
targets, a 72 h plan of five phases, evenly spread requests (1 % errors of three kinds),
ITL gaps of 20 ms +-10 % with 2 % spikes, GPU samples every 10 s. To be fast it encodes a
pool of outcomes once and reuses them: each row gets its own id, time, phase and seq
(computed inside SQLite, one statement per block of 64 rows); each window's rollup is the
merge of the pool blocks its rows came from. The run stops cleanly (not completed) at 99 %
of the plan, so a resume continues it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from array import array
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from soakd.config import JournalConfig, config_from_dict
from soakd.journal import JOURNAL_FILE, Journal, RunInfo, config_doc, plan_doc, schema
from soakd.journal.codec import END_NS, outcome_row
from soakd.journal.rollups import rollup_window_ns, store_window
from soakd.measure.analysis import TargetStats
from soakd.measure.fold import Fold, Hist, add_hist
from soakd.model import ErrorKind, Outcome
from soakd.workload.plan import build_plan

NS = 1_000_000_000
TARGETS = ("local", "cloud")
BLOCK = 64  # pool outcomes per block: a window holds whole blocks
POOL_BLOCKS = 64
CONFIG: dict[str, Any] = {
    "run": {"name": "bench-72h"},
    "targets": [
        {"name": "local", "base_url": "http://127.0.0.1:8000", "cost": {"gpus": ["0"]}},
        {"name": "cloud", "base_url": "http://127.0.0.1:8001", "cost": {"per_hour": 1.2}},
    ],
    "phases": [
        {"name": "warmup", "duration": "1h", "load": {"mode": "closed", "concurrency": 4}},
        {"name": "steady", "duration": "60h", "load": {"mode": "poisson", "rate": 40}},
        {"name": "spike", "duration": "2h", "load": {"mode": "poisson", "rate": 80}},
        {"name": "steady2", "duration": "8h", "load": {"mode": "poisson", "rate": 40}},
        {"name": "cooldown", "duration": "1h", "load": {"mode": "closed", "concurrency": 2}},
    ],
    "report": {"energy_price_per_kwh": 0.3},
}
# Pool rows live in a temporary table with the requests' columns, id = the pool index
# (target base + block * BLOCK + k). One statement per block copies a block's 64 rows into
# ``requests`` in C: ids, seqs and times computed as the per-row Python did (same values,
# bit for bit), none of the per-row tuples and parameter binding that took most of the time.
POOL_COLUMNS = ", ".join(["id INTEGER PRIMARY KEY", *schema.REQUEST_COLUMNS[1:]])
_MOVED = schema.REQUEST_COLUMNS[9:]  # lag_ns .. itl_hist: as encoded
INSERT_BLOCK = f"""INSERT INTO requests
SELECT ?1 + kk, 1, ?2 + COALESCE(sent_ns + e - end_ns, e) / 1e9, ?3, ?4, ?5 + kk,
       scheduled_ns + e - end_ns, sent_ns + e - end_ns, e, {", ".join(_MOVED)}
FROM (SELECT *, id - ?6 AS kk, ?7 + (?8 + id - ?6) * ?9 / ?10 AS e
      FROM temp.pool WHERE id BETWEEN ?6 AND ?6 + {BLOCK - 1} ORDER BY id)"""
WINDOW_WALLS = (
    "SELECT target, MIN(wall), MAX(wall) FROM requests WHERE id BETWEEN ? AND ? GROUP BY target"
)
ERRORS = (ErrorKind.HTTP_5XX, ErrorKind.HTTP_429, ErrorKind.TIMEOUT_CONNECT)


def pool_outcome(rng: random.Random, target: str, i: int, tokens: int) -> Outcome:
    """One finished request on a plan-offset axis starting at 0 (shifted per row)."""
    out = max(2, int(rng.uniform(0.5, 1.5) * tokens))
    r = rng.random  # rng.uniform(a, b) is a + (b - a) * r(): the same draws, inlined
    gaps = array(
        "q",
        [int((18_000 + 4_000 * r()) * ((2 + 3 * r()) if r() < 0.02 else 1)) * 1000
         for _ in range(out - 1)],
    )  # fmt: skip
    ttft = rng.randint(30_000, 300_000) * 1000
    o = Outcome(target, "p", i, 0)
    o.sent_ns = rng.randint(10_000, 2_000_000)
    o.first_token_ns = o.sent_ns + ttft
    o.end_ns = o.first_token_ns + sum(gaps)
    o.status, o.output_tokens, o.prompt_tokens, o.usage_reported = 200, out, 256, True
    o.itl_ns = gaps
    if i % 100 == 0:
        o.error = ERRORS[(i // 100) % 3]
        o.status = {ErrorKind.HTTP_5XX: 503, ErrorKind.HTTP_429: 429}.get(o.error, 0)
        if o.error is ErrorKind.TIMEOUT_CONNECT:
            o.first_token_ns, o.output_tokens, o.itl_ns = None, 0, array("q")
            o.end_ns = o.sent_ns + 10 * NS
    return o


class Pool:
    """Encoded rows and per-block folds of a target's pool outcomes."""

    def __init__(self, target: str, tokens: int, itl: str, seed: int) -> None:
        rng = random.Random(seed)
        self.rows: list[tuple[Any, ...]] = []
        self.blocks: list[Fold] = []
        for b in range(POOL_BLOCKS):
            fold = Fold()
            for k in range(BLOCK):
                o = pool_outcome(rng, target, b * BLOCK + k, tokens)
                row, ordered = outcome_row(o, 0, 1, 0, itl=itl)
                # as the writer folds a row (store.py): its end on the plan clock and its
                # sorted gaps; one window of 2**62 ns holds the block's stats
                fold.add(o, 0, row[END_NS], 1 << 62, ordered)
                self.rows.append(row)
            self.blocks.append(fold)


def make(run_dir: Path, requests: int, tokens: int, itl: str) -> dict[str, float]:
    t0 = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "soak.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    cfg = config_from_dict(CONFIG)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    plan = build_plan(cfg, start)
    window_ns = rollup_window_ns(plan)
    opts: dict[str, float | None] = {"rehearse_s": None, "duration_s": None}
    info = RunInfo("bench-72h", config_doc(cfg), plan_doc(plan), start, opts, window_ns)
    path = run_dir / JOURNAL_FILE
    if path.exists():
        raise SystemExit(f"{path} exists: use a new directory")
    journal = Journal(path, info, JournalConfig(itl=itl))  # type: ignore[arg-type]
    journal.start()  # tables, meta, budget, session 1, run_started
    journal.close()
    conn = schema.connect(path, readonly=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("DELETE FROM events WHERE kind = 'run_stopped'")
    pools = {t: Pool(t, tokens, itl, seed=n) for n, t in enumerate(TARGETS)}
    stop_ns = int(plan.duration_ns * 0.99)
    windows = stop_ns // window_ns
    blocks_total = max(1, requests // BLOCK)
    wall0 = start.timestamp()
    totals: dict[tuple[str, str, str, str], list[int]] = {}
    hists: dict[tuple[str, str], Hist] = {}
    notes: dict[tuple[str, str], int] = {}
    seqs = dict.fromkeys(TARGETS, 0)
    rid = 1
    pending = 0
    open_windows: dict[tuple[str, str, int], list[int]] = {}  # key: the pool blocks in it
    merged: dict[tuple[str | int, ...], TargetStats] = {}
    phases = [(p.start_ns, p.name) for p in plan.phases]
    # the pools' encoded rows, once, in a temporary table keyed by pool index (below)
    conn.execute(f"CREATE TEMP TABLE pool ({POOL_COLUMNS})")
    bases = {t: n * POOL_BLOCKS * BLOCK for n, t in enumerate(TARGETS)}
    for name, pool in pools.items():
        conn.executemany(
            schema.INSERT_REQUEST.replace("requests", "temp.pool"),
            [(bases[name] + i, *row[1:]) for i, row in enumerate(pool.rows)],
        )
    conn.execute("BEGIN")
    for w in range(windows):
        w_start = w * window_ns
        phase = next(name for s, name in reversed(phases) if s <= w_start)
        nblocks = blocks_total * (w + 1) // windows - blocks_total * w // windows
        first_rid = rid
        den = nblocks * BLOCK + 1
        for b in range(nblocks):
            target = TARGETS[(w + b) % len(TARGETS)]
            pool = pools[target]
            pb = (w * 7 + b) % POOL_BLOCKS
            block_fold = pool.blocks[pb]
            # the block's 64 rows: each pool row moved to end at
            # w_start + (b * BLOCK + k) * window_ns // den, with its own id and seq
            conn.execute(
                INSERT_BLOCK,
                (rid, wall0, target, phase, seqs[target], bases[target] + pb * BLOCK,
                 w_start, b * BLOCK, window_ns, den),
            )  # fmt: skip
            rid += BLOCK
            seqs[target] += BLOCK
            key = (target, phase, w)
            # totals, notes and histograms: the blocks' own, summed
            for tkey, t in block_fold.totals.items():
                k4 = (tkey[0], phase, tkey[2], tkey[3])
                acc = totals.setdefault(k4, [0, 0, 0, 0])
                for i in range(4):
                    acc[i] += t[i]
            for hkey, bk in block_fold.hists.items():
                hists[hkey] = add_hist(hists.get(hkey), bk.counts, bk.total)
            for nkey, n in block_fold.notes.items():
                notes[nkey] = notes.get(nkey, 0) + n
            open_windows.setdefault(key, []).append(pb)
        # the wall range the writer stores: its rows' send walls (computed by SQLite above),
        # per target; one rowid-range query per window
        walls = {t: (lo, hi) for t, lo, hi in conn.execute(WINDOW_WALLS, (first_rid, rid - 1))}
        for key, used in open_windows.items():
            # the window's rollup: its blocks' stats merged. The block pattern repeats
            # every 64 windows, so most windows' merge has been made before.
            stats = merged.get((key[0], *used))
            if stats is None:
                stats = merged[(key[0], *used)] = TargetStats()
                for pb in used:
                    (block,) = (win.stats for win in pools[key[0]].blocks[pb].windows.values())
                    stats.merge(block)
            store_window(conn, key, stats, *walls[key[0]], rid - 1)
        open_windows.clear()
        pending += nblocks * BLOCK
        if pending >= 200_000:  # transactions of ~200k rows, as a long backlog would be
            conn.execute("COMMIT")
            conn.execute("BEGIN")
            pending = 0
    for key4, vals in totals.items():
        conn.execute("INSERT OR REPLACE INTO totals VALUES (?,?,?,?,?,?,?,?)", (*key4, *vals))
    for nkey, n in notes.items():
        conn.execute("INSERT OR REPLACE INTO notes VALUES (?,?,?)", (*nkey, n))
    for hkey, (counts, total) in hists.items():
        conn.execute(
            "INSERT OR REPLACE INTO histograms VALUES (?,?,?,?)",
            (*hkey, json.dumps(counts), total),
        )
    _samples(conn, wall0, stop_ns)
    for p in plan.phases:
        if p.start_ns < stop_ns:
            conn.execute(
                "INSERT INTO events (session, wall, offset_ns, kind, data) VALUES (1,?,?,?,?)",
                (wall0 + p.start_ns / NS, p.start_ns, "phase",
                 json.dumps({"name": p.name, "index": p.index})),
            )  # fmt: skip
    end_wall = wall0 + stop_ns / NS
    conn.execute(
        "INSERT INTO events (session, wall, offset_ns, kind, data) VALUES "
        "(1, ?, ?, 'run_stopped', '{\"completed\": false}')",
        (end_wall, stop_ns),
    )
    seq_doc = json.dumps(seqs)
    conn.execute(
        "UPDATE progress SET started_wall = ?, wall = ?, offset_ns = ?, seqs = ?, "
        "rollup_from_id = ?, stopped = 1 WHERE session = 1",
        (wall0, end_wall, stop_ns, seq_doc, rid),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    secs = time.perf_counter() - t0
    return {"requests": rid - 1, "seconds": secs, "bytes": path.stat().st_size}


def _samples(conn: Any, wall0: float, stop_ns: int) -> None:
    """GPU readings every 10 s: memory (a slow leak), power, energy, the target's process."""
    series = [
        (1, "soakd_gpu_memory_used_bytes", '[["gpu", "0"]]'),
        (2, "soakd_gpu_power_watts", '[["gpu", "0"]]'),
        (3, "soakd_gpu_energy_joules_total", '[["gpu", "0"]]'),
        (4, "soakd_gpu_process_memory_bytes", '[["gpu", "0"], ["target", "local"]]'),
    ]
    conn.executemany("INSERT INTO series VALUES (?,?,?)", series)
    rng = random.Random(7)
    rows = []
    energy = 0.0
    for i in range(stop_ns // (10 * NS)):
        wall = wall0 + 10 * i
        power = 180 + rng.uniform(-20, 20)
        energy += power * 10
        used = 3.1e9 + i * 2.0 + rng.uniform(-5e6, 5e6)
        rows += [(wall, 1, used), (wall, 2, power), (wall, 3, energy), (wall, 4, used - 4e8)]
    conn.executemany("INSERT INTO samples VALUES (?,?,?)", rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--tokens", type=int, default=128, help="mean output tokens (default 128)")
    p.add_argument("--itl", choices=("compact", "exact"), default="compact")
    a = p.parse_args()
    r = make(a.dir, a.requests, a.tokens, a.itl)
    print(
        f"{r['requests']:,} requests in {r['seconds']:.1f} s "
        f"({r['requests'] / r['seconds']:,.0f}/s); journal.db {r['bytes'] / 1e6:,.1f} MB "
        f"({r['bytes'] / r['requests']:.0f} B a request)"
    )


if __name__ == "__main__":
    main()
