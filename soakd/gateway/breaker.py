"""Gateway room, breakers: the VRAM and the error-rate circuit breakers, as pure state machines.

No IO and no clock: every call takes ``now`` (monotonic seconds), so tests drive them with
a fake clock. Both have three states. ``closed`` admits everything; ``open`` rejects; in
``half_open`` exactly one request (the probe) is let through and its result decides:
closed again, or open again. Every transition is handed to ``on_change`` (the gateway logs
it and moves the gauge).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final

from soakd.config import ErrorBreaker, VramBreaker
from soakd.measure.sliding import SlidingCount


class State(enum.StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


class Admit(enum.Enum):
    YES = "yes"
    PROBE = "probe"  # the one request of a half-open breaker: report it with probe_done
    NO = "no"


Transition = Callable[[str, State, State, dict[str, Any]], None]
"""``(breaker, from, to, why)``: called on every state change."""


class _Breaker:
    name: str = ""

    def __init__(self, on_change: Transition | None) -> None:
        self.state = State.CLOSED
        self.enabled = True
        self._probing = False
        self._on_change = on_change

    def admit(self, now: float) -> Admit:
        if not self.enabled or self.state is State.CLOSED:
            return Admit.YES
        if self.state is State.HALF_OPEN and not self._probing:
            self._probing = True
            return Admit.PROBE
        return Admit.NO

    def release_probe(self) -> None:
        """The probe was admitted here but never sent (another gate refused it)."""
        self._probing = False

    def set_enabled(self, on: bool, now: float) -> None:
        """Switching a breaker off closes it (and it starts afresh when switched on)."""
        if on == self.enabled:
            return
        self.enabled = on
        self._reset(now)
        if self.state is not State.CLOSED:
            self._move(State.CLOSED, {"reason": "disabled"})

    def _move(self, to: State, why: dict[str, Any]) -> None:
        before = self.state
        self.state = to
        self._probing = False
        if self._on_change is not None:
            self._on_change(self.name, before, to, why)

    def _reset(self, now: float) -> None:
        raise NotImplementedError


class VramBreakerState(_Breaker):
    """Open after VRAM used stays above the limit for ``hold``; half-open after it stays
    below the lower mark for ``close_hold``; a successful probe (with VRAM not above the
    limit) closes it. A missing reading changes nothing: the breaker keeps its state
    (an open one stays open until readings return)."""

    name = "vram"

    def __init__(self, cfg: VramBreaker, on_change: Transition | None = None) -> None:
        super().__init__(on_change)
        self.cfg = cfg
        self.limit = cfg.limit_bytes
        self.lower = cfg.lower_mark
        self.hold = cfg.hold
        self.close_hold = cfg.hold if cfg.close_hold is None else cfg.close_hold
        self.enabled = cfg.enabled
        self.used: float | None = None
        self.above_since: float | None = None
        self.below_since: float | None = None

    def reading(self, now: float, used: float | None) -> None:
        if used is None:
            return
        self.used = used
        above = used > self.limit
        if above:
            self.below_since = None
            if self.above_since is None:
                self.above_since = now
        else:
            self.above_since = None
            if used < self.lower:
                if self.below_since is None:
                    self.below_since = now
            else:
                self.below_since = None
        if not self.enabled:
            return
        state = self.state
        if state is State.CLOSED and self.above_since is not None:
            held = now - self.above_since
            if held >= self.hold:
                self._move(
                    State.OPEN,
                    {"used_bytes": used, "limit_bytes": self.limit, "above_for_s": round(held, 3)},
                )
        elif state is State.OPEN and self.below_since is not None:
            held = now - self.below_since
            if held >= self.close_hold:
                self._move(
                    State.HALF_OPEN,
                    {
                        "used_bytes": used,
                        "lower_mark_bytes": self.lower,
                        "below_for_s": round(held, 3),
                    },
                )
        elif state is State.HALF_OPEN and above:
            self._move(
                State.OPEN,
                {
                    "used_bytes": used,
                    "limit_bytes": self.limit,
                    "reason": "above the limit while probing",
                },
            )

    def probe_done(self, now: float, ok: bool) -> None:
        if self.state is not State.HALF_OPEN:
            return
        if ok and (self.used is None or self.used <= self.limit):
            self._move(State.CLOSED, {"probe": "ok", "used_bytes": self.used})
        else:
            self.below_since = None  # start the hold below the mark again
            self._move(State.OPEN, {"probe": "ok" if ok else "failed", "used_bytes": self.used})

    def retry_after_s(self, now: float) -> float:
        return self.cfg.retry_after

    def _reset(self, now: float) -> None:
        self.above_since = self.below_since = None


class ErrorRateBreakerState(_Breaker):
    """Open when upstream failures exceed ``threshold`` of at least ``min_requests``
    requests over the last ``window``; after ``open_for`` half-open (checked at each
    admission and tick); the probe's result closes it or opens it again."""

    name = "error_rate"
    BUCKETS: Final = 30

    def __init__(self, cfg: ErrorBreaker, on_change: Transition | None = None) -> None:
        super().__init__(on_change)
        self.cfg = cfg
        self.enabled = cfg.enabled
        self._window = SlidingCount(cfg.window, self.BUCKETS)  # requests, failures
        self.open_until = 0.0

    def admit(self, now: float) -> Admit:
        self.tick(now)
        return super().admit(now)

    def tick(self, now: float) -> None:
        if self.enabled and self.state is State.OPEN and now >= self.open_until:
            self._move(State.HALF_OPEN, {"open_for_s": self.cfg.open_for})

    def result(self, now: float, failed: bool) -> None:
        """One finished upstream request (not the probe: see probe_done)."""
        self._window.add(now, 1.0, 1.0 if failed else 0.0)
        if not self.enabled or self.state is not State.CLOSED:
            return
        if self.requests >= self.cfg.min_requests and self.ratio > self.cfg.threshold:
            self.open_until = now + self.cfg.open_for
            self._move(
                State.OPEN,
                {
                    "error_ratio": round(self.ratio, 4),
                    "requests": int(self.requests),
                    "threshold": self.cfg.threshold,
                    "window_s": self.cfg.window,
                },
            )

    @property
    def requests(self) -> float:
        """Upstream requests in the window (as of the last result)."""
        return self._window.sums[0]

    @property
    def failures(self) -> float:
        return self._window.sums[1]

    @property
    def ratio(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def probe_done(self, now: float, ok: bool) -> None:
        if self.state is not State.HALF_OPEN:
            return
        if ok:
            self._clear()
            self._move(State.CLOSED, {"probe": "ok"})
        else:
            self.open_until = now + self.cfg.open_for
            self._move(State.OPEN, {"probe": "failed"})

    def retry_after_s(self, now: float) -> float:
        return max(1.0, self.open_until - now)

    def _clear(self) -> None:
        self._window.clear()

    def _reset(self, now: float) -> None:
        self._clear()
        self.open_until = 0.0
