"""Journal bench: write throughput (records/s) and disk bytes per request, synthetic outcomes.

    .venv/bin/python bench/journal_bench.py                 # 1M requests, 128 tokens each
    .venv/bin/python bench/journal_bench.py -n 200000 --tokens 512 --itl exact --sync normal
    .venv/bin/python bench/journal_bench.py -n 200000 --tokens 512 --gaps tight

A producer thread plays the event loop: it builds outcomes and calls ``Journal.record``
(pausing while the queue is over 20k, as a loop at that rate would not be). Figures:

- hot path: mean time of one ``record`` call (what the event loop pays per request);
- soakd's process: CPU per record of the journal's link thread (packing the queue into
  columns, reading the folds back), i.e. what the journal still costs soakd's process
  beyond the hot path; and of applying the folds (Metrics, RunStats) on the loop;
- writer: records/s per second of the writer process's CPU time (rows, folds, SQLite), and
  over the whole run (producer included, so that one is a floor);
- bytes/request: journal.db after the final checkpoint, divided by the requests.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time
from array import array
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from soakd.config import JournalConfig
from soakd.journal import JOURNAL_FILE, Journal, RunInfo
from soakd.journal.metrics import JournalMetrics
from soakd.measure.analysis import itl_keys
from soakd.measure.fold import Fold
from soakd.metrics.run import Metrics
from soakd.model import ErrorKind, Outcome
from soakd.run.stats import RunStats

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Timed:
    """Metrics and RunStats, as the run applies each committed fold: timed."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.stats = RunStats(["local", "cloud"])
        for t in ("local", "cloud"):
            self.metrics.add_target(t, ["steady"])
        self.spent = 0.0

    def apply(self, f: Fold) -> None:
        t = time.thread_time()
        self.metrics.apply(f)
        self.stats.apply(f)
        self.spent += time.thread_time() - t


class Clock:
    """The plan clock as the journal reads it: started a minute ago, never stopping."""

    def __init__(self) -> None:
        self.origin_ns = time.perf_counter_ns() - 60 * 10**9
        self.phase = None
        self.finished = False
        self.stopping = False
        self.stopped_ns = 0
        self.next_seq: dict[str, int] = {}
        self.missed: dict[tuple[str, str, str], int] = {}


GAPS = ("wide", "tight")
"""wide: every gap uniform in 5-60 ms (the worst case for compact gaps: ~125 buckets);
tight: 20 ms +-10 % with 2 % of gaps 2-5x longer (a server batching other prefills)."""


def _gap_us(rng: random.Random, gaps: str) -> int:
    if gaps == "wide":
        return rng.randint(5_000, 60_000)
    spike = rng.uniform(2, 5) if rng.random() < 0.02 else 1.0
    return int(rng.uniform(18_000, 22_000) * spike)


def outcomes(n: int, tokens: int, seed: int = 1, gaps: str = "wide") -> list[Outcome]:
    """A pool of realistic outcomes (re-recorded many times: building them is not the bench)."""
    rng = random.Random(seed)
    pool = []
    now = time.perf_counter_ns()
    for i in range(n):
        out = max(2, int(rng.uniform(0.5, 1.5) * tokens))
        sent = now - rng.randint(1, 30) * 10**9
        ttft = rng.randint(20_000, 400_000) * 1000
        itl = array("q", [_gap_us(rng, gaps) * 1000 for _ in range(out - 1)])
        o = Outcome(("local", "cloud")[i % 2], "steady", i, sent - rng.randint(0, 2_000_000))
        o.sent_ns, o.wall_start = sent, time.time()
        o.first_token_ns = sent + ttft
        o.end_ns = sent + ttft + sum(itl)
        o.status, o.output_tokens, o.prompt_tokens, o.usage_reported = 200, out, 256, True
        o.itl_ns = itl
        if i % 100 == 0:
            o.error, o.status = ErrorKind.HTTP_5XX, 503
        itl_keys(o)  # as the sender worker that timed it counts them
        pool.append(o)
    return pool


def bench(n: int, tokens: int, itl: str, sync: str, gaps: str = "wide") -> dict[str, float]:
    pool = outcomes(500, tokens, gaps=gaps)
    with tempfile.TemporaryDirectory(prefix="soakd-journal-bench-") as tmp:
        reg = CollectorRegistry()
        jm = JournalMetrics(reg)
        info = RunInfo("bench", {}, {"phases": []}, datetime.now(UTC), {}, 60 * 10**9)
        cfg = JournalConfig(
            synchronous=sync,  # type: ignore[arg-type]
            itl_gaps=itl != "none",
            itl="exact" if itl == "exact" else "compact",
            queue_size=100_000,
        )
        sinks = Timed()
        j = Journal(Path(tmp) / JOURNAL_FILE, info, cfg, metrics=jm, forward=[sinks])
        j.start()
        j.attach(Clock())
        thread, writer_pid = j.link._thread, j.link.pid
        assert thread is not None
        assert thread.ident is not None
        assert writer_pid is not None
        link_clock = time.pthread_getcpuclockid(thread.ident)
        spent_in_record = 0.0
        t0 = time.perf_counter()

        def produce() -> None:
            nonlocal spent_in_record
            queue = j._q  # the bench paces itself on the queue depth
            for i in range(n):
                while len(queue) > 20_000:
                    time.sleep(0.005)
                o = pool[i % len(pool)]
                s = time.perf_counter()
                j.record(o)
                spent_in_record += time.perf_counter() - s

        producer = threading.Thread(target=produce)
        producer.start()
        producer.join()
        while (reg.get_sample_value("soakd_journal_records_total", {"kind": "request"}) or 0) < n:
            time.sleep(0.01)
        writer_cpu = process_cpu_s(writer_pid)
        link_cpu = time.clock_gettime(link_clock)
        j.close()
        wall = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in Path(tmp).iterdir() if p.name.startswith("journal"))
        written = reg.get_sample_value("soakd_journal_records_total", {"kind": "request"}) or 0
        busy = reg.get_sample_value("soakd_journal_commit_seconds_sum") or 0.0
        commits = reg.get_sample_value("soakd_journal_commit_seconds_count") or 0.0
    assert written == n, (written, n)
    return {
        "n": n,
        "wall_s": wall,
        "writer_busy_s": busy,
        "commits": commits,
        "record_us": spent_in_record / n * 1e6,
        "link_us": (link_cpu - sinks.spent) / n * 1e6,  # the folds are applied in it here
        "apply_us": sinks.spent / n * 1e6,
        "per_s_cpu": n / writer_cpu,
        "writer_cpu_s": writer_cpu,
        "per_s_wall": n / wall,
        "bytes": size,
        "bytes_per_request": size / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=1_000_000, help="requests (default 1M)")
    p.add_argument("--tokens", type=int, default=128, help="mean output tokens per request")
    p.add_argument(
        "--itl",
        choices=("compact", "exact", "none"),
        default="compact",
        help="journal.itl (none: journal.itl_gaps: false)",
    )
    p.add_argument(
        "--gaps", choices=GAPS, default="wide", help="wide: 5-60 ms; tight: 20 ms, 2 %% spikes"
    )
    p.add_argument("--sync", choices=("full", "normal"), default="full")
    a = p.parse_args()
    r = bench(a.n, a.tokens, a.itl, a.sync, a.gaps)
    print(
        f"requests            {r['n']:,} (mean {a.tokens} output tokens, "
        f"itl={a.itl}, {a.gaps} gaps, synchronous={a.sync})"
    )
    print(f"hot path            {r['record_us']:.2f} us per record() call")
    print(
        f"soakd's process     {r['link_us']:.2f} us per record in the journal's link thread, "
        f"{r['apply_us']:.2f} us applying the folds (Metrics, RunStats)"
    )
    print(
        f"writer throughput   {r['per_s_cpu']:,.0f} records per CPU-second of the writer process "
        f"({r['writer_cpu_s']:.1f} s CPU; {r['writer_busy_s']:.1f} s in "
        f"{r['commits']:,.0f} commits)"
    )
    print(
        f"end to end          {r['per_s_wall']:,.0f} records/s with the producer "
        f"({r['wall_s']:.1f} s)"
    )
    print(
        f"disk                {r['bytes'] / 1e6:,.1f} MB, {r['bytes_per_request']:,.0f} "
        f"bytes/request -> {r['bytes_per_request']:,.0f} MB per million requests"
    )


if __name__ == "__main__":
    main()
