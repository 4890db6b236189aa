"""Workload, timer: sleep until an instant on the monotonic clock, to well under a millisecond.

asyncio's timers wake through ``epoll_wait``, whose timeout is whole milliseconds
(Python rounds it up), so ``asyncio.sleep`` returns 0-1 ms after its deadline, plus
scheduling: an open loop built on it sends every request about half a millisecond
late on average. On Linux, ``sleep_until_ns`` arms a ``timerfd`` (CLOCK_MONOTONIC,
absolute, nanosecond resolution: the clock of ``time.perf_counter_ns``) and waits
for it to become readable on the event loop: no busy wait, no extra thread, and a
wake-up within tens of microseconds of the instant. Elsewhere, or if the timerfd
cannot be had, it falls back to ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time

__all__ = ["sleep_until_ns"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_now_ns = time.perf_counter_ns


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load() -> tuple[object, object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = (ctypes.c_int, ctypes.c_int)
    create.restype = ctypes.c_int
    settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p)
    settime.restype = ctypes.c_int
    return create, settime


_TIMERFD = _load()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def sleep_until_ns(deadline_ns: int) -> None:
    """Return at ``deadline_ns`` (``time.perf_counter_ns`` clock) or just after it. An
    instant already past still yields to the loop once: a caller that has fallen behind
    its schedule must not hold the loop (the exporter, the signals). Cancellable."""
    delay = deadline_ns - _now_ns()
    if delay <= 0:
        await asyncio.sleep(0)
        return
    if _TIMERFD is None:
        await asyncio.sleep(delay / 1e9)
        return
    create, settime = _TIMERFD
    fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)  # type: ignore[operator]
    if fd < 0:
        await asyncio.sleep(delay / 1e9)
        return
    try:
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(deadline_ns, 1_000_000_000)
        if settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:  # type: ignore[operator]
            await asyncio.sleep(max(0, deadline_ns - _now_ns()) / 1e9)
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, fut)
        try:
            await fut
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
