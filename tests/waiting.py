"""Waiting on a condition, never on a guessed duration.

A test that sleeps "long enough" and then asserts is slow on a fast machine and flaky on
a loaded one. These poll ``predicate`` until it holds and fail with ``what`` when it does
not within ``timeout`` (``within``) seconds: the timeout is a bound on a hang, not a measurement, so
make it generous (the default is 10 s for things that take milliseconds).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.01


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, what: str = "the condition"
) -> None:
    """Block until ``predicate()`` is true (a thread or another process makes it so)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(POLL_S)


async def until(
    predicate: Callable[[], object], within: float = 10.0, what: str = "the condition"
) -> None:
    """Yield to the event loop until ``predicate()`` is true (a task makes it so)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(POLL_S)


async def eventually(
    check: Callable[[], Awaitable[object]], within: float = 10.0, what: str = "the condition"
) -> None:
    """Like ``until``, for a check that must itself await (a scrape, an HTTP call)."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(POLL_S)
