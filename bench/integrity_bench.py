"""Journal integrity bench: what the page check costs before a resume, a report and an
export, what a salvage of a damaged journal costs, and what the writer's mark costs per
commit.

    .venv/bin/python bench/make_journal.py /tmp/j1m --requests 1000000 --tokens 128
    .venv/bin/python bench/integrity_bench.py /tmp/j1m            # warm page cache
    .venv/bin/python bench/integrity_bench.py /tmp/j1m --cold     # drop the page cache first (root)

Figures: the page check (``integrity.damage``: quick_check of each table) wall and CPU
time, against ``soakd report``'s own time on the same journal; a salvage of a copy with
one request page flipped (rows read and lost, time); ````MarkFile.write`` per commit.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from soakd.journal import JOURNAL_FILE
from soakd.journal.integrity import Mark, MarkFile, damage, salvage
from soakd.journal.schema import connect
from soakd.report import build_report

PAGE = 16384


def drop_caches() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(label: str, fn: object, cold: bool) -> object:
    if cold:
        drop_caches()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()  # type: ignore[operator]
    print(f"{label}: {time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--cold", action="store_true", help="drop the page cache before each (root)")
    args = p.parse_args()
    db = args.run_dir / JOURNAL_FILE
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    print(f"{db}: {db.stat().st_size / 1e6:.1f} MB, {rows:,} request rows")

    def check() -> dict[str, str]:
        conn = connect(db, readonly=True)
        try:
            return damage(conn)
        finally:
            conn.close()

    found = timed("page check (quick_check of each table)", check, args.cold)
    assert found == {}, found
    timed(
        "soakd report (json, the same journal, check included)",
        lambda: build_report(args.run_dir, slowest_n=0),
        args.cold,
    )

    with tempfile.TemporaryDirectory(dir=args.run_dir.parent) as tmp:
        copy = Path(tmp) / "run"
        copy.mkdir()
        shutil.copy(db, copy / JOURNAL_FILE)
        with sqlite3.connect(f"file:{copy / JOURNAL_FILE}?mode=ro", uri=True) as c:
            leaves = [
                r[0]
                for r in c.execute(
                    "SELECT pageno FROM dbstat WHERE name = 'requests' AND pagetype = 'leaf'"
                )
            ]
        data = bytearray((copy / JOURNAL_FILE).read_bytes())
        page = leaves[len(leaves) // 2]
        for i in range(64):
            data[(page - 1) * PAGE + 8 + i * 97 % (PAGE - 8)] ^= 0x5A
        (copy / JOURNAL_FILE).write_bytes(data)
        got = timed(
            "salvage of a copy with one request page flipped",
            lambda: salvage(copy / JOURNAL_FILE, copy / "salvaged.db"),
            args.cold,
        )
        print(f"  {got.describe()}")  # type: ignore[attr-defined]

        mark = Mark(1, rows, rows, 10**12, {"local": rows // 2, "cloud": rows // 2})
        n = 2000
        marks = MarkFile(copy)
        t0 = time.perf_counter()
        for _ in range(n):
            marks.write(mark)
        print(f"the mark: {(time.perf_counter() - t0) / n * 1e6:.1f} us a commit")
        marks.close()


if __name__ == "__main__":
    main()
