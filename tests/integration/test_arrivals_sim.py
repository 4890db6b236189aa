"""Arrivals from traces and from the clock, end to end against the embedded simulator
(issue 36, item 5): a Mooncake trace made here replays at its planned instants (each send's
scheduled offset is the trace's, the dispatch lag p99 under 2 ms), and a 72 h daily plan
rehearsed in 90 s shows three peaks where the calendar puts them."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak
from soakd.sim.spawn import free_port

pytestmark = pytest.mark.integration

MS = 1_000_000


def requests(run_dir: Path, target: str = "sim") -> list[tuple[int, int, int, int | None]]:
    """(seq, scheduled_ns, lag_ns, status) of a target's journaled requests, in seq order."""
    with sqlite3.connect(run_dir / "journal.db") as db:
        return db.execute(
            "SELECT seq, scheduled_ns, lag_ns, status FROM requests WHERE target = ? ORDER BY seq",
            (target,),
        ).fetchall()


def p50_p99(lags: list[int]) -> tuple[int, int]:
    lags = sorted(lags)
    return lags[len(lags) // 2], lags[int(len(lags) * 0.99)]


def stored_plan(run_dir: Path) -> dict[str, Any]:
    with sqlite3.connect(run_dir / "journal.db") as db:
        (value,) = db.execute("SELECT value FROM meta WHERE key = 'plan'").fetchone()
    plan: dict[str, Any] = json.loads(value)
    return plan


def config(phase: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": {"name": "arrivals", "drain_timeout": "5s"},
        "targets": [{"name": "sim", "simulator": "fast", "model": "m"}],
        "workload": {"max_tokens": 4, "prompts": {"input_tokens": {"mean": 16}}},
        "gpu": {"source": "none"},
        "phases": [phase],
    }


async def run(cfg: dict[str, Any], run_dir: Path, **options: Any) -> float:
    soak = Soak(
        config_from_dict(cfg),
        RunOptions(
            run_dir=run_dir,
            metrics_addr=f"127.0.0.1:{free_port()}",
            console_logs=False,
            **options,
        ),
    )
    began = time.monotonic()
    result = await soak.run()
    assert result.completed
    return time.monotonic() - began


async def test_a_mooncake_trace_replays_at_its_planned_instants(tmp_path: Path) -> None:
    # 20 s of trace: Poisson gaps at ~30 req/s, a burst of 30 at 8 s, a lull from 12 to 15 s
    rng = random.Random(5)
    stamps, t = [], 1_700_000_000_000  # ms, as Mooncake's (relative to the first record)
    while t < 1_700_000_020_000:
        if not 1_700_000_012_000 <= t < 1_700_000_015_000:
            stamps.append(t)
        t += round(rng.expovariate(30) * 1000)
    stamps += [1_700_000_008_000 + 10 * i for i in range(30)]
    stamps.sort()
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": s, "input_length": 16, "output_length": 4, "hash_ids": [1]})
            + "\n"
            for s in stamps
        )
    )
    # beside it, the same mean rate from a Poisson schedule: the box's own lag, as a baseline
    phase = {
        "name": "replay",
        "duration": "21s",
        "load": {"mode": "trace", "trace": str(trace), "loop": False},
        "targets": {"baseline": {"mode": "poisson", "rate": len(stamps) / 20}},
    }
    cfg = config(phase)
    cfg["targets"].append({"name": "baseline", "simulator": "fast", "model": "m"})
    await run(cfg, tmp_path / "run")

    rows = requests(tmp_path / "run")
    planned = [(s - stamps[0]) * MS for s in stamps]
    assert [r[1] for r in rows] == planned  # send k at record k's instant, every one sent
    assert all(r[3] == 200 for r in rows)
    p50, p99 = p50_p99([r[2] for r in rows])
    base50, base99 = p50_p99([r[2] for r in requests(tmp_path / "run", "baseline")])
    print(
        f"trace replay: {len(rows)} sends, dispatch lag p50 {p50 / MS:.3f} ms, p99 "
        f"{p99 / MS:.3f} ms; poisson beside it p50 {base50 / MS:.3f} ms, p99 {base99 / MS:.3f} ms"
    )
    # under 2 ms on a quiet box; on one shared with other work (a 2-core runner) the lag is
    # the box's: then no worse than the Poisson schedule's beside it, by 2 ms or a factor 2
    assert p99 < max(2 * MS, base99 + 2 * MS, 2 * base99)


async def test_a_rehearsed_72h_daily_plan_shows_three_peaks(tmp_path: Path) -> None:
    phase = {
        "name": "days",
        "duration": "72h",
        "load": {"mode": "daily", "low": 2, "high": 40, "peak_hour": 15, "timezone": "UTC"},
    }
    took = await run(config(phase), tmp_path / "run", rehearse_s=90.0)

    plan = stored_plan(tmp_path / "run")
    scale = plan["scale"]
    anchor_h = plan["phases"][0]["loads"]["sim"]["anchor_s"] / 3600  # the plan start's hour
    rows = requests(tmp_path / "run")
    by_hour = [0] * 72  # sends per configured hour of the plan
    for _, scheduled, _, status in rows:
        assert status == 200
        by_hour[min(71, int(scheduled / scale / 3600e9))] += 1
    # where the calendar puts the peaks: 15:00 UTC, three times
    first_peak = (15 - anchor_h) % 24
    want = [first_peak + 24 * d for d in range(3)]
    smooth = [statistics.fmean(by_hour[max(0, h - 1) : h + 2]) for h in range(72)]
    # the busiest hour of each cycle (12 h either side of where the calendar puts a peak)
    peaks = [
        max(range(max(0, round(w) - 12), min(72, round(w) + 12)), key=lambda h: smooth[h]) + 0.5
        for w in want
    ]
    print(f"rehearsal of 72 h in {took:.1f} s, {len(rows)} sends; per configured hour: {by_hour}")
    print(f"peaks at hours {peaks} of the plan, the calendar's at {[round(w, 2) for w in want]}")
    for got, at in zip(peaks, want, strict=True):
        assert abs(got - at) <= 2.5
    troughs = [min(by_hour[24 * d : 24 * d + 24]) for d in range(3)]
    assert all(max(by_hour[24 * d : 24 * d + 24]) > 5 * troughs[d] for d in range(3))
    mean = statistics.fmean(by_hour)  # the rates are the configured ones: 21 req/s a mean
    assert mean * 72 == pytest.approx(21 * 90, rel=0.1)


async def stop_after(cfg: dict[str, Any], run_dir: Path, seconds: float, **options: Any) -> None:
    """A first session, stopped (as by SIGTERM) ``seconds`` into its plan."""
    soak = Soak(
        config_from_dict(cfg),
        RunOptions(
            run_dir=run_dir, metrics_addr=f"127.0.0.1:{free_port()}", console_logs=False, **options
        ),
    )
    task = asyncio.create_task(soak.run())
    for _ in range(round(seconds * 20) + 600):  # bounded: a start that hangs fails here
        if soak.runner is not None and soak.runner.offset_ns() >= seconds * 1e9:
            break
        await asyncio.sleep(0.05)
    assert soak.runner is not None
    soak.runner.stop()
    result = await task
    assert not result.completed


def sessions(run_dir: Path) -> dict[int, list[tuple[int, int]]]:
    """(seq, scheduled_ns) of each session's requests."""
    out: dict[int, list[tuple[int, int]]] = {}
    with sqlite3.connect(run_dir / "journal.db") as db:
        for session, seq, scheduled in db.execute(
            "SELECT session, seq, scheduled_ns FROM requests ORDER BY seq"
        ):
            out.setdefault(session, []).append((seq, scheduled))
    return out


async def test_a_resumed_trace_goes_on_at_the_instant_it_stopped(tmp_path: Path) -> None:
    stamps = sorted({round(i * 37.3) % 6000 for i in range(300)})  # 6 s of trace, looped
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 10_000 + s}) + "\n" for s in stamps))
    phase = {"name": "replay", "duration": "14s", "load": {"mode": "trace", "trace": str(trace)}}
    run_dir = tmp_path / "run"
    await stop_after(config(phase), run_dir, 5.0)
    await run(config(phase), run_dir)  # the same run dir: resumed

    first, second = sessions(run_dir)[1], sessions(run_dir)[2]
    span = (stamps[-1] - stamps[0]) * MS
    period = span + round(span / (len(stamps) - 1))  # and one mean gap
    planned = [
        p * period + (s - stamps[0]) * MS
        for p in range(3)
        for s in stamps
        if p * period + (s - stamps[0]) * MS < 14e9
    ]
    assert [t for _, t in first] == planned[: len(first)]
    # the second session starts where the first stopped sending and goes on along the
    # trace: each instant sent or counted as not made (at the stop, or a stall of the busy
    # box), none made up, none offered twice
    resumed = planned.index(second[0][1])
    assert resumed >= len(first)  # no instant the first session sent is sent again
    again = iter(planned[resumed:])
    assert all(t in again for _, t in second)  # in the trace's order
    with sqlite3.connect(run_dir / "journal.db") as db:
        (missed,) = db.execute("SELECT COALESCE(SUM(count), 0) FROM missed").fetchone()
    assert resumed <= len(first) + missed  # nothing lost between the sessions unsaid
    assert len(second) + missed >= len(planned) - resumed
    assert second[0][0] > first[-1][0]  # its seqs go on from the first session's


async def test_a_resumed_daily_plan_keeps_its_cycle_on_the_calendar(tmp_path: Path) -> None:
    phase = {
        "name": "days",
        "duration": "72h",
        "load": {"mode": "daily", "low": 4, "high": 80, "peak_hour": 3, "timezone": "UTC"},
    }
    run_dir = tmp_path / "run"
    await stop_after(config(phase), run_dir, 15.0, rehearse_s=36.0)  # 72 h in 36 s
    await asyncio.sleep(2.0)  # a downtime: the plan clock does not run
    await run(config(phase), run_dir)  # resumed, rehearsed as the first session was

    plan = stored_plan(run_dir)
    scale = plan["scale"]
    anchor_h = plan["phases"][0]["loads"]["sim"]["anchor_s"] / 3600
    second = sessions(run_dir)[2]
    by_hour = [0] * 72
    for _, scheduled in second:
        by_hour[min(71, int(scheduled / scale / 3600e9))] += 1
    resumed_h = second[0][1] / scale / 3600e9
    assert 29 <= resumed_h < 32  # 15 s of 36: hour 30 of 72
    # the peaks after the resume are where the calendar of the first session put them
    want = [w for w in ((3 - anchor_h) % 24 + 24 * d for d in range(3)) if w > resumed_h + 4]
    smooth = [statistics.fmean(by_hour[max(0, h - 1) : h + 2]) for h in range(72)]
    for w in want:
        window = range(max(0, round(w) - 8), min(72, round(w) + 8))
        got = max(window, key=lambda h: smooth[h]) + 0.5
        print(f"resumed at plan hour {resumed_h:.1f}: a peak at {got}, the calendar's {w:.2f}")
        assert abs(got - w) <= 2.5
