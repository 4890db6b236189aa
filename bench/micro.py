"""Micro-benchmarks of the hot paths that the unit tests once held to wall-clock budgets.

    .venv/bin/python bench/micro.py            # every figure, a few seconds
    .venv/bin/python bench/micro.py --quick    # fewer rounds

The unit tests check what these paths do (a sleep never wakes early, a past instant
returns after one yield, every record reaches the journal); how fast they do it depends
on the machine and its load, so it is printed here, next to the figure each test used to
assert, never asserted. Figures (docs/benchmarks.md, "Micro-benchmarks"):

- ``prompts``: ``SyntheticPrompts.spec_fields`` per prompt, 256-token mean (was: < 20 µs);
- ``journal``: ``Journal.record`` per call, 100k calls into a 200k queue, the writer
  thread running (was: 100k calls < 0.5 s, i.e. < 5 µs a call); bench/journal_bench.py
  measures the writer behind it;
- ``timer``: lateness of ``sleep_until_ns`` 3 ms ahead, and of ``asyncio.sleep`` for
  the same instant (was: median < 20 ms);
- ``dispatch``: the runner's dispatch lag, a constant 200/s open loop for 1 s against a
  target answering in 1 ms (was: median < 20 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from soakd.config import JournalConfig, TokenLength  # noqa: E402
from soakd.model import Finished, Outcome, Phase, Plan, RequestSpec  # noqa: E402
from soakd.shapes import Constant  # noqa: E402
from soakd.workload.prompts import SyntheticPrompts  # noqa: E402
from soakd.workload.runner import Runner  # noqa: E402
from soakd.workload.timer import sleep_until_ns  # noqa: E402

US = 1_000
MS = 1_000_000


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _line(name: str, figure: str, was: str) -> None:
    print(f"{name:<10} {figure:<58} (test budget it replaces: {was})")


def bench_prompts(n: int) -> None:
    source = SyntheticPrompts(TokenLength(mean=256))
    rounds = []
    for r in range(5):
        t0 = time.perf_counter()
        for seq in range(r * n, (r + 1) * n):
            source.spec_fields(seq)
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    _line(
        "prompts",
        f"{statistics.median(rounds):.2f} µs a prompt (5 x {n}: "
        f"{min(rounds):.2f}-{max(rounds):.2f})",
        "< 20 µs",
    )


def bench_journal(n: int) -> None:
    import random

    from tests.journal_fixtures import FakeClock, config, open_test_journal, outcome

    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock(offset_s=1)
        j = open_test_journal(
            Path(tmp), config(), clock, journal_cfg=JournalConfig(queue_size=2 * n)
        )
        o = outcome(random.Random(1), clock, "alpha", "warm", 0, 10.0)
        t0 = time.perf_counter()
        for _ in range(n):
            j.record(o)
        spent = time.perf_counter() - t0
        t1 = time.perf_counter()
        j.close()
        closing = time.perf_counter() - t1
    _line(
        "journal",
        f"{spent / n * 1e6:.2f} µs a record() ({n} calls: {spent:.3f} s; "
        f"close wrote them in {closing:.1f} s)",
        f"{n} calls < 0.5 s",
    )


async def _lateness(sleep: Callable[[int], object], rounds: int) -> list[float]:
    lates = []
    for _ in range(rounds):
        due = time.perf_counter_ns() + 3 * MS
        await sleep(due)  # type: ignore[misc]
        lates.append((time.perf_counter_ns() - due) / US)
    return lates


async def _asyncio_sleep_until(due: int) -> None:
    await asyncio.sleep(max(0, due - time.perf_counter_ns()) / 1e9)


def bench_timer(rounds: int) -> None:
    for name, fn in (("timerfd", sleep_until_ns), ("asyncio", _asyncio_sleep_until)):
        lates = asyncio.run(_lateness(fn, rounds))
        _line(
            "timer",
            f"{name}: late by median {statistics.median(lates):.0f} µs, "
            f"p90 {_q(lates, 0.9):.0f}, max {max(lates):.0f} ({rounds} sleeps)",
            "median < 20 ms" if name == "timerfd" else "none",
        )


class _Target:
    name = "a"

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        o = outcome or Outcome.planned(spec)
        o.sent_ns = time.perf_counter_ns()
        await asyncio.sleep(0.001)
        o.first_token_ns = o.end_ns = time.perf_counter_ns()
        o.status, o.output_tokens = 200, 1
        return o


class _Prompts:
    def spec_fields(self, seq: int) -> tuple[str, int]:
        return "hello", 1

    def length(self, seq: int) -> int:
        return 1


class _Sink:
    def __init__(self) -> None:
        self.outcomes: list[Finished] = []

    def record(self, o: Finished) -> None:
        self.outcomes.append(o)


async def _dispatch() -> list[float]:
    plan = Plan((Phase(0, "steady", 0, 1000 * MS, {"a": Constant(rate=200)}),))
    sink = _Sink()
    runner = Runner(plan, {"a": _Target()}, _Prompts(), [sink], max_tokens=8, temperature=0.7)  # type: ignore[dict-item]
    await runner.run()
    await runner.drain(5)
    return [o.dispatch_lag_ns / US for o in sink.outcomes]


def bench_dispatch(rounds: int) -> None:
    lags = [lag for _ in range(rounds) for lag in asyncio.run(_dispatch())]
    _line(
        "dispatch",
        f"lag median {statistics.median(lags):.0f} µs, p99 {_q(lags, 0.99):.0f}, "
        f"max {max(lags):.0f} ({len(lags)} sends)",
        "median < 20 ms",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    args = ap.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {load}")
    bench_prompts(4_000 if args.quick else 20_000)
    bench_journal(20_000 if args.quick else 100_000)
    bench_timer(20 if args.quick else 200)
    bench_dispatch(1 if args.quick else 3)


if __name__ == "__main__":
    main()
