"""sleep_until_ns: never early, cancellable, no file descriptor left behind. How late it
wakes on this machine is a figure of bench/micro.py (timer), not a budget here."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from soakd.workload import timer
from soakd.workload.timer import sleep_until_ns


def _fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


async def test_wakes_at_the_instant_never_before() -> None:
    lates = []
    for _ in range(20):
        due = time.perf_counter_ns() + 3_000_000
        await sleep_until_ns(due)
        lates.append(time.perf_counter_ns() - due)
    assert min(lates) >= 0


@pytest.mark.parametrize("due", [0, -1], ids=["zero", "just-past"])
def test_a_past_instant_returns_after_one_yield(due: int) -> None:
    """No timer for an instant already past: one yield to the loop, then it returns."""
    coro = sleep_until_ns(0 if due == 0 else time.perf_counter_ns() - 1_000_000)
    before = _fds()
    assert coro.send(None) is None  # the one yield (asyncio.sleep(0))
    assert _fds() == before  # no timerfd was opened
    with pytest.raises(StopIteration):
        coro.send(None)


async def test_cancel_leaves_no_fd_and_no_reader() -> None:
    before = _fds()
    task = asyncio.ensure_future(sleep_until_ns(time.perf_counter_ns() + 10_000_000_000))
    await asyncio.sleep(0)  # one step of the task: its timer is armed and waited on
    if timer._TIMERFD is not None:
        assert _fds() == before + 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _fds() == before


async def test_many_concurrent_sleeps_wake_in_the_order_they_are_due() -> None:
    base = time.perf_counter_ns() + 5_000_000
    dues = [base + i * 100_000 for i in range(50)]
    woke: list[int] = []

    async def one(due: int) -> int:
        await sleep_until_ns(due)
        woke.append(due)
        return time.perf_counter_ns() - due

    # started latest first: the order they wake in is the timers', not the tasks'
    lates = await asyncio.gather(*(one(d) for d in reversed(dues)))
    assert min(lates) >= 0
    assert woke == dues


async def test_falls_back_to_asyncio_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timer, "_TIMERFD", None)
    due = time.perf_counter_ns() + 2_000_000
    await sleep_until_ns(due)
    assert time.perf_counter_ns() >= due
