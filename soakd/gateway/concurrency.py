"""Gateway room, concurrency: how many requests go to the upstream at once, and the queue.

``AimdLimit`` is the adaptive controller, pure (time passed in): every ``interval`` it
takes the P95 of the upstream's time to first byte over that interval (intervals with
fewer than ``min_samples`` are merged into the next: a slow server at a low limit gives
few samples, and must still be able to climb back); above the target
the limit is multiplied by ``decrease`` (8 -> 4 -> 2 ...), at or below it, and only when
the limit was actually reached in the interval, it grows by one. Multiplicative decrease
gets off an overloaded server fast; additive increase probes back up gently (TCP's AIMD).
Time to first byte is the signal because queueing in the server shows there first, and
unlike the whole duration it does not depend on how long the answer is.

``Limiter`` holds the slots: at most ``limit`` in flight, then a bounded FIFO queue whose
waiters give up after a timeout. It tells the controller when the limit was reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from typing import Final

from soakd.config import Concurrency

MAX_SAMPLES: Final = 10_000
"""Samples kept per interval (the latest ones beyond), so memory stays flat."""

LimitChange = Callable[[int, int, float | None], None]
"""``(old, new, p95_s)``."""


def p95(samples: list[float]) -> float:
    """The 95th percentile, nearest rank."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class AimdLimit:
    """The adaptive limit. ``sample()`` each upstream first byte, ``saturated()`` when the
    limit is reached, ``tick(now)`` often; it changes ``limit`` at most once an interval."""

    def __init__(self, cfg: Concurrency, now: float, on_change: LimitChange | None = None) -> None:
        self.cfg = cfg
        self.limit = min(max(cfg.limit, cfg.min_limit), cfg.max_limit)
        self.last_p95: float | None = None
        self._samples: list[float] = []
        self._seen = 0
        self._saturated = False
        self._since = now
        self._on_change = on_change

    def sample(self, ttfb_s: float) -> None:
        if len(self._samples) < MAX_SAMPLES:
            self._samples.append(ttfb_s)
        else:  # a ring: the interval's latest samples
            self._samples[self._seen % MAX_SAMPLES] = ttfb_s
        self._seen += 1

    def saturated(self) -> None:
        self._saturated = True

    def tick(self, now: float) -> int | None:
        """Decide when an interval has passed; returns the new limit when it changed."""
        if now - self._since < self.cfg.interval:
            return None
        self._since = now
        if len(self._samples) < self.cfg.min_samples:
            return None  # too little traffic to judge yet: the next interval adds to it
        samples, saturated = self._samples, self._saturated
        self._samples, self._seen, self._saturated = [], 0, False
        value = self.last_p95 = p95(samples)
        cfg = self.cfg
        if value > cfg.target_p95:
            new = max(cfg.min_limit, math.floor(self.limit * cfg.decrease))
        elif saturated:
            new = min(cfg.max_limit, self.limit + 1)
        else:
            return None
        if new == self.limit:
            return None
        old, self.limit = self.limit, new
        if self._on_change is not None:
            self._on_change(old, new, value)
        return new

    def reset(self, now: float, limit: int) -> None:
        self.limit = min(max(limit, self.cfg.min_limit), self.cfg.max_limit)
        self._samples, self._seen, self._saturated, self._since = [], 0, False, now


class Limiter:
    """At most ``limit`` holders; then a FIFO queue of at most ``max_queue`` waiters.

    ``acquire`` returns None with a slot held (``release`` it), or why not:
    ``"queue_full"`` at once, ``"queue_timeout"`` after waiting ``timeout_s``."""

    def __init__(
        self, limit: int, max_queue: int, on_saturated: Callable[[], None] | None = None
    ) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_saturated = on_saturated

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    async def acquire(self, timeout_s: float) -> str | None:
        if self.in_flight < self.limit and not self.queued:
            self._take()
            return None
        self._saturation()
        if self.queued >= self.max_queue:
            return "queue_full"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(timeout_s):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return None  # the slot came as the time ran out: keep it
            self._forget(fut)
            return "queue_timeout"
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted, but the client left
            else:
                self._forget(fut)
            raise
        return None

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _take(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.limit:
            self._saturation()

    def _saturation(self) -> None:
        if self._on_saturated is not None:
            self._on_saturated()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._take()
            fut.set_result(None)

    def _forget(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)
        if not fut.done():
            fut.cancel()
