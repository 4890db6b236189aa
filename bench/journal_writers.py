"""One SQLite writer or several: the journal's choice between a writer process fed by the
parent and sender workers writing their own rows (docs/architecture.md, "The journal's
writer is a process of its own").

    .venv/bin/python bench/journal_writers.py --rows 40000 --writers 1,2,4,8

Each writer process inserts its share of ``--rows`` journal-sized rows (25 columns, a
~60-byte blob) into one WAL database with ``synchronous=FULL``, in transactions of the rows
it would gather in one 0.5 s flush at the shared rate, as fast as it can; the figure is the
rows a second all writers together commit, and the time they spent waiting for the write
lock (SQLite allows one writer at a time: more writers queue on it, each with its own
fsync per commit).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import tempfile
import time
from pathlib import Path

ROW = (
    "t",
    "p",
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
    13,
    b"x" * 60,
    200,
    None,
    0,
    20,
    16,
    1,
    None,
)


def writer(path: str, rows: int, per_commit: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA synchronous = FULL")
    waited = 0.0
    t0 = time.perf_counter()
    for start in range(0, rows, per_commit):
        n = min(per_commit, rows - start)
        w = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")  # the write lock: queued behind the other writers
        waited += time.perf_counter() - w
        conn.executemany(
            "INSERT INTO requests VALUES (NULL,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(os.getpid(), *ROW)] * n,
        )
        conn.execute("COMMIT")
    out.put((time.perf_counter() - t0, waited))
    conn.close()


def run(rows: int, writers: int, per_commit: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="soakd-writers-") as tmp:
        path = str(Path(tmp) / "j.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA page_size = 16384")
        conn.execute("PRAGMA journal_mode = WAL")
        cols = ", ".join(f"c{i}" for i in range(24))
        conn.execute(f"CREATE TABLE requests (id INTEGER PRIMARY KEY, {cols})")
        conn.close()
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        share = rows // writers
        procs = [
            multiprocessing.Process(
                target=writer, args=(path, share, max(1, per_commit // writers), out)
            )
            for _ in range(writers)
        ]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
    return share * writers / wall, sum(w for _, w in results) / sum(t for t, _ in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--writers", default="1,2,4,8")
    ap.add_argument("--per-commit", type=int, default=5000, help="rows a 0.5 s flush holds")
    a = ap.parse_args()
    for n in (int(x) for x in a.writers.split(",")):
        rate, waiting = run(a.rows, n, a.per_commit)
        print(f"{n} writer(s): {rate:,.0f} rows/s committed, {waiting:.0%} of their time "
              "waiting for the write lock")


if __name__ == "__main__":
    main()
