"""Loop-stall diagnosis for `soakd run`: which event-loop callbacks and GC passes run long.

Imported before soakd's CLI (bench/suite.py's `soakd-diag` variant): wraps
``asyncio.events.Handle._run`` to time every callback (no asyncio debug mode, whose own
overhead hides the culprits) and ``gc.callbacks`` to time every collection. At exit it
writes ``$SLOWCB_OUT`` (default /tmp/slowcb-<pid>.json): the callbacks over 1 ms by what
they ran, with count, total and max, and the GC pauses per generation.
"""

from __future__ import annotations

import asyncio.events
import atexit
import gc
import json
import os
import threading
import time

_perf = time.perf_counter_ns
_slow: dict[str, list[int]] = {}
_gc: dict[int, list[int]] = {0: [], 1: [], 2: []}
_gc_start = [0]
_orig_run = asyncio.events.Handle._run
LIMIT_NS = 1_000_000


def _name(h: asyncio.events.Handle) -> str:
    cb = h._callback  # type: ignore[attr-defined]
    task = getattr(cb, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"
        return f"task {getattr(coro, '__qualname__', coro)} @ {where}"
    return getattr(cb, "__qualname__", repr(cb))


def _run(self: asyncio.events.Handle) -> None:
    t = _perf()
    _orig_run(self)
    d = _perf() - t
    if d > LIMIT_NS:
        _slow.setdefault(_name(self), []).append(d)


def _gc_cb(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_start[0] = _perf()
    else:
        _gc[info["generation"]].append(_perf() - _gc_start[0])


def _dump() -> None:
    out = os.environ.get("SLOWCB_OUT", f"/tmp/slowcb-{os.getpid()}.json")
    slow = [
        {"what": k, "n": len(v), "total_ms": sum(v) / 1e6, "max_ms": max(v) / 1e6}
        for k, v in sorted(_slow.items(), key=lambda kv: -sum(kv[1]))
    ]
    gcs = {
        g: {
            "n": len(v),
            "over_1ms": sum(x > LIMIT_NS for x in v),
            "max_ms": max(v, default=0) / 1e6,
            "total_ms": sum(v) / 1e6,
        }
        for g, v in _gc.items()
    }
    names = {t.native_id: t.name for t in threading.enumerate()}
    threads = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1 : st.rindex(")")]
        utime, stime = (int(x) for x in st[st.rindex(")") + 2 :].split()[11:13])
        threads[f"{names.get(int(tid), comm)} {tid}"] = (utime + stime) / tick
    with open(out, "w") as f:
        json.dump({"slow_callbacks": slow[:40], "gc": gcs, "thread_cpu_s": threads}, f, indent=1)


asyncio.events.Handle._run = _run  # type: ignore[method-assign]
gc.callbacks.append(_gc_cb)
atexit.register(_dump)
