"""What one ``malloc_trim(0)`` costs on a heap like soakd's (issue 16).

    .venv/bin/python bench/malloc_trim_cost.py [--heap-mb 20] [--rounds 20]

Builds a glibc heap of about ``--heap-mb`` MB in use from blocks of 600 B - 64 KB (above
pymalloc's 512 B, so glibc serves them, as it does soakd's buffers, parsers and SQLite
pages), frees a third of them scattered through it (the holes an hours-long run leaves),
then times ``malloc_trim(0)``: on that fragmented heap, again at once (nothing left to
release), and after each of ``--rounds`` rounds that churn 10 % of the blocks. Prints
each call's wall and CPU time and what RssAnon did. glibc holds each arena's lock for its
part of the call, so a thread allocating from that arena meanwhile waits for it. glibc
only (soakd/runtime.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import rss_anon_mb

from soakd import runtime


def timed_trim() -> tuple[float, float, bool]:
    """Wall and CPU milliseconds of one malloc_trim(0), and whether it released memory."""
    t0, c0 = time.perf_counter(), time.thread_time()
    released = runtime.trim()
    return (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3, released


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heap-mb", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    runtime.limit_arenas()
    rng = random.Random(16)

    def block() -> bytearray:
        return bytearray(int(rng.lognormvariate(8.0, 1.2)) % 65_000 + 600)

    blocks: list[bytearray | None] = []
    size = 0
    while size < args.heap_mb * 2**20 * 1.5:
        b = block()
        blocks.append(b)
        size += len(b)
    for i in rng.sample(range(len(blocks)), len(blocks) // 3):
        blocks[i] = None
    held = sum(len(b) for b in blocks if b is not None) / 2**20
    print(f"blocks held: {held:.1f} MB, RssAnon before the first trim: {rss_anon_mb():.1f} MB")
    ms, cpu, released = timed_trim()
    print(
        f"first trim (fragmented heap): {ms:.2f} ms ({cpu:.2f} ms CPU), released={released}, "
        f"RssAnon after: {rss_anon_mb():.1f} MB"
    )
    ms, cpu, released = timed_trim()
    print(f"again at once: {ms:.2f} ms ({cpu:.2f} ms CPU), released={released}")
    times, cpus = [], []
    for _ in range(args.rounds):
        for i in rng.sample(range(len(blocks)), len(blocks) // 10):
            blocks[i] = None if blocks[i] is not None else block()
        before = rss_anon_mb()
        ms, cpu, released = timed_trim()
        times.append(ms)
        cpus.append(cpu)
        print(
            f"after churning 10 %: {ms:.2f} ms ({cpu:.2f} ms CPU), released={released}, "
            f"RssAnon {before:.1f} -> {rss_anon_mb():.1f} MB"
        )
    print(
        f"per call after churn: median {statistics.median(times):.2f} ms "
        f"({statistics.median(cpus):.2f} ms CPU), max {max(times):.2f} ms "
        f"({max(cpus):.2f} ms CPU) over {len(times)} calls"
    )


if __name__ == "__main__":
    main()
