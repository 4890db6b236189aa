"""Adaptive concurrency (AIMD on P95 time to first byte) on a fake clock; the slot queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from soakd.config import Concurrency
from soakd.gateway.concurrency import AimdLimit, Limiter, p95


def aimd(**kw: Any) -> tuple[AimdLimit, list[tuple[int, int]]]:
    changes: list[tuple[int, int]] = []
    cfg = Concurrency(**({"limit": 8, "adaptive": True, "min_limit": 1, "max_limit": 16,
                          "target_p95": 0.5, "interval": 1.0, "min_samples": 5} | kw))  # fmt: skip
    return AimdLimit(cfg, 0.0, lambda old, new, _p95: changes.append((old, new))), changes


def feed(c: AimdLimit, value: float, n: int = 20, saturated: bool = True) -> None:
    for _ in range(n):
        c.sample(value)
    if saturated:
        c.saturated()


def test_p95_nearest_rank() -> None:
    assert p95([1.0]) == 1.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([float(i) for i in range(1, 21)]) == 19.0


def test_limit_halves_while_p95_is_above_target_then_climbs_back() -> None:
    c, changes = aimd()
    t = 0.0
    for _ in range(4):  # a latency rise: 8 -> 4 -> 2 -> 1 -> 1
        t += 1.0
        feed(c, 2.0)
        c.tick(t)
    assert c.limit == 1
    assert changes == [(8, 4), (4, 2), (2, 1)]
    for _ in range(5):  # recovered, and the limit is reached each interval: +1 each
        t += 1.0
        feed(c, 0.1)
        c.tick(t)
    assert c.limit == 6
    assert changes[3:] == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]


def test_limit_only_grows_when_reached_and_changes_once_an_interval() -> None:
    c, changes = aimd()
    feed(c, 0.1, saturated=False)
    assert c.tick(1.0) is None  # fast, but the limit was never reached: no reason to grow
    feed(c, 2.0)
    assert c.tick(1.5) is None  # half an interval: no decision yet
    assert c.tick(2.0) == 4
    assert c.last_p95 == 2.0
    assert changes == [(8, 4)]


def test_too_few_samples_wait_for_the_next_interval() -> None:
    c, changes = aimd(min_samples=10)
    feed(c, 5.0, n=9)
    assert c.tick(1.0) is None
    assert c.limit == 8
    assert changes == []
    feed(c, 5.0, n=1)  # with the next interval's sample there are enough
    assert c.tick(1.5) is None
    assert c.tick(2.0) == 4


def test_bounds_and_decrease_factor() -> None:
    c, _ = aimd(limit=16, max_limit=16, decrease=0.75, min_limit=3)
    feed(c, 0.1)
    c.tick(1.0)
    assert c.limit == 16  # max
    for t in range(2, 8):
        feed(c, 9.0)
        c.tick(float(t))
    assert c.limit == 3  # 16 -> 12 -> 9 -> 6 -> 4 -> 3 (floor), then held at min_limit


def test_concurrency_config_bounds() -> None:
    with pytest.raises(ValueError, match="min_limit"):
        Concurrency(min_limit=5, max_limit=4)
    with pytest.raises(ValueError, match="within"):
        Concurrency(adaptive=True, limit=100, max_limit=64)


async def test_limiter_queues_fifo_and_times_out() -> None:
    saturated: list[int] = []
    lim = Limiter(2, max_queue=2, on_saturated=lambda: saturated.append(1))
    assert await lim.acquire(1.0) is None
    assert await lim.acquire(1.0) is None
    assert lim.in_flight == 2
    assert saturated  # the limit was reached
    order: list[str] = []

    async def wait(name: str, wait_s: float) -> str | None:
        why = await lim.acquire(wait_s)
        order.append(f"{name}:{why}")
        return why

    a = asyncio.create_task(wait("a", 5.0))
    b = asyncio.create_task(wait("b", 0.05))
    await asyncio.sleep(0)
    assert lim.queued == 2
    assert await lim.acquire(1.0) == "queue_full"  # a third waiter: refused at once
    assert await b == "queue_timeout"
    lim.release()
    assert await a is None
    assert order == ["b:queue_timeout", "a:None"]
    assert lim.in_flight == 2
    assert lim.queued == 0


async def test_limiter_raising_the_limit_wakes_waiters_and_cancel_frees_the_slot() -> None:
    lim = Limiter(1, max_queue=10)
    assert await lim.acquire(1.0) is None
    waiters = [asyncio.create_task(lim.acquire(5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    lim.set_limit(3)
    done = await asyncio.gather(waiters[0], waiters[1])
    assert done == [None, None]
    assert lim.in_flight == 3
    waiters[2].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[2]
    assert lim.queued == 0
    for _ in range(3):
        lim.release()
    assert lim.in_flight == 0
