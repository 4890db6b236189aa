"""bench/stub.py's precise timer: a deadline heap behind one Linux timerfd (ns resolution),
asyncio's call_later elsewhere (about 1 ms late)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import os
import sys
import time
from collections.abc import Callable
from itertools import count

_now = time.perf_counter_ns  # CLOCK_MONOTONIC, the clock of timerfd below


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Timers:
    """Deadline heap on one timerfd. ``at(deadline_ns, fn, *args)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, precise: bool = True) -> None:
        self.loop = loop
        self.heap: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self.seq = count()
        self.armed = 0
        self.fd = -1
        if precise and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fd = libc.timerfd_create(1, os.O_NONBLOCK | os.O_CLOEXEC)  # CLOCK_MONOTONIC
                if fd >= 0:
                    self.fd = fd
                    self._settime = libc.timerfd_settime
                    self._spec = _Itimerspec()
                    loop.add_reader(fd, self._fire)
            except (OSError, AttributeError):
                self.fd = -1
        self._handle: asyncio.TimerHandle | None = None

    def at(self, deadline_ns: int, fn: Callable[..., None], *args: object) -> None:
        heapq.heappush(self.heap, (deadline_ns, next(self.seq), fn, args))
        if self.heap[0][0] == deadline_ns and (self.armed == 0 or deadline_ns < self.armed):
            self._arm(deadline_ns)

    def _arm(self, deadline_ns: int) -> None:
        self.armed = deadline_ns
        if self.fd >= 0:
            spec = self._spec
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(1, deadline_ns), 10**9)
            self._settime(self.fd, 1, ctypes.byref(spec), None)  # TFD_TIMER_ABSTIME
        else:
            if self._handle is not None:
                self._handle.cancel()
            delay = max(0.0, (deadline_ns - _now()) / 1e9)
            self._handle = self.loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        if self.fd >= 0:
            try:  # noqa: SIM105 (every timer's wake-up: no context manager on this path)
                os.read(self.fd, 8)
            except BlockingIOError:
                pass
        self.armed = 0
        heap = self.heap
        now = _now()
        while heap and heap[0][0] <= now + 20_000:  # within 20 us: due
            deadline, _, fn, args = heapq.heappop(heap)
            fn(deadline, *args)
            now = _now()
        if heap:
            self._arm(heap[0][0])
