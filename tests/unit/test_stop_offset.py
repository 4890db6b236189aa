"""Where a stopped run resumes: the plan clock the journal keeps at a stop is the instant
sending stopped, not the last heartbeat before it (up to a second earlier), whose instants
a resume would offer again though they were sent or counted as not made."""

from __future__ import annotations

import time

from soakd.journal.progress import ClockState, Progress

S = 10**9


def frozen(last_s: float, stopped_s: float | None, ran_s: float = 1230) -> float:
    p = Progress(None, time.time)
    p.last_offset = int(last_s * S)  # the last heartbeat committed
    origin = time.perf_counter_ns() - int(ran_s * S)  # the plan started ran_s ago
    stopped = origin + int(stopped_s * S) if stopped_s is not None else 0
    p.clock = ClockState(origin, 0, finished=False, stopping=True, stopped_ns=stopped)
    offset, _ = p._plan_clock()
    again, _ = p._plan_clock()  # frozen: the drain's later heartbeats keep it
    assert again == offset
    return offset / S


def test_a_stop_keeps_the_instant_sending_stopped() -> None:
    assert frozen(last_s=1200, stopped_s=1225) == 1225


def test_never_before_the_last_heartbeat_nor_past_now() -> None:
    assert frozen(last_s=1200, stopped_s=1100) == 1200  # a clock never goes back
    assert frozen(last_s=1200, stopped_s=None) == 1200  # a stop whose instant is unknown
    assert abs(frozen(last_s=1200, stopped_s=5000) - 1230) < 1  # not past the present


def test_a_runner_says_when_it_stopped() -> None:
    import asyncio

    from soakd.model import Plan
    from soakd.workload.runner import Runner

    async def go() -> tuple[int, int, int]:
        r = Runner(Plan(()), {}, None, (), max_tokens=8, temperature=0.0)  # type: ignore[arg-type]
        before = r.stopped_ns
        t0 = time.perf_counter_ns()
        r.stop()
        return before, t0, r.stopped_ns

    before, t0, stopped = asyncio.run(go())
    assert before == 0
    assert stopped >= t0
