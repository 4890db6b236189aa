"""`soakd run` with diagnostics: GC pauses per generation and event-loop stalls.

    .venv/bin/python bench/diag_soakd.py OUT.json run CONFIG --no-live ...

Runs soakd's own CLI main in this process, with a ``gc.callbacks`` hook timing every
collection and a 1 ms heartbeat task on soakd's loop measuring how late it wakes (a
stall of the loop delays every timestamp soakd takes). Writes OUT.json at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import sys
import time

_perf = time.perf_counter_ns
pauses: dict[int, list[int]] = {0: [], 1: [], 2: []}
stalls: list[int] = []
_start: list[int] = [0]
_explicit = [False]
gen2: list[tuple[float, float, int]] = []  # (t s, pause ms, objects collected) of automatic full GCs


def _gc_cb(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _start[0] = _perf()
    elif not _explicit[0]:
        d = _perf() - _start[0]
        pauses[info["generation"]].append(d)
        if info["generation"] == 2:
            gen2.append((time.monotonic(), d / 1e6, info.get("collected", 0)))


_beat = [0]
stacks: dict[str, int] = {}


async def _heartbeat() -> None:
    while True:
        t = _perf()
        _beat[0] = t
        await asyncio.sleep(0.001)
        stalls.append(_perf() - t - 1_000_000)


def _watchdog(main_id: int) -> None:
    """Every 20 ms: when the loop has not beaten for 50 ms, record the main thread's stack."""
    import traceback

    while True:
        time.sleep(0.02)
        b = _beat[0]
        if b and _perf() - b > 50_000_000:
            frame = sys._current_frames().get(main_id)
            if frame is not None:
                key = "".join(traceback.format_stack(frame)[-12:])
                stacks[key] = stacks.get(key, 0) + 1


_orig_run = asyncio.runners.Runner.run


def _run(self: asyncio.runners.Runner, coro, *, context=None):  # type: ignore[no-untyped-def]
    async def wrapped():  # type: ignore[no-untyped-def]
        _explicit[0] = True
        tracked = len(gc.get_objects())
        if os.environ.get("DIAG_FREEZE"):
            gc.collect()
            gc.freeze()
        _explicit[0] = False
        print(f"diag: {tracked} objects tracked by the GC at the start of the run"
              f"{' (frozen)' if os.environ.get('DIAG_FREEZE') else ''}", file=sys.stderr)
        hb = asyncio.get_running_loop().create_task(_heartbeat())
        try:
            return await coro
        finally:
            hb.cancel()

    return _orig_run(self, wrapped(), context=context)


def _dump(path: str) -> None:
    def q(v: list[int], p: float) -> float | None:
        if not v:
            return None
        s = sorted(v)
        return s[min(len(s) - 1, int(p * len(s)))] / 1e6

    doc = {"gc": {g: {"n": len(v), "p50_ms": q(v, 0.5), "p99_ms": q(v, 0.99),
                      "max_ms": max(v) / 1e6 if v else None} for g, v in pauses.items()},
           "gen2": gen2,
           "stall_stacks": sorted(((n, k) for k, n in stacks.items()), reverse=True)[:8],
           "stall": {"n": len(stalls), "p50_ms": q(stalls, 0.5), "p99_ms": q(stalls, 0.99),
                     "p999_ms": q(stalls, 0.999), "max_ms": max(stalls) / 1e6 if stalls else None,
                     "over_5ms": sum(1 for s in stalls if s > 5_000_000),
                     "over_20ms": sum(1 for s in stalls if s > 20_000_000)}}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    out = sys.argv[1]
    atexit.register(_dump, out)
    gc.callbacks.append(_gc_cb)
    if os.environ.get("DIAG_STACKS"):
        import threading

        threading.Thread(target=_watchdog, args=(threading.get_ident(),), daemon=True).start()
    asyncio.runners.Runner.run = _run  # type: ignore[method-assign]
    from soakd.cli import main

    sys.exit(main(sys.argv[2:]))
