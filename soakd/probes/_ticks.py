"""Probes room, ticks: probe loops run on a fixed monotonic grid, not "sleep after work"."""

from __future__ import annotations

import asyncio
import time


async def sleep_until_next(last: float, interval: float) -> float:
    """Sleep to the next tick after ``last`` (ticks already missed are skipped, not
    bunched up), and return it: readings stay evenly spaced whatever a probe costs."""
    next_t = last + interval
    now = time.monotonic()
    if next_t < now:
        next_t = now
    await asyncio.sleep(next_t - now)
    return next_t
