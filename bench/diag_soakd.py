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
import threading
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
    """Every 1 ms: when the loop has not beaten for 4 ms, record where every thread is
    (innermost frames): a thread other than the loop's running Python then holds the GIL."""
    import traceback

    while True:
        time.sleep(0.001)
        b = _beat[0]
        if b and _perf() - b > 4_000_000:
            for tid, frame in sys._current_frames().items():
                if tid == threading.get_ident():
                    continue
                who = "loop" if tid == main_id else "other"
                key = who + ":\n" + "".join(traceback.format_stack(frame)[-3:])
                stacks[key] = stacks.get(key, 0) + 1


_orig_run = asyncio.runners.Runner.run


def _run(self: asyncio.runners.Runner, coro, *, context=None):  # type: ignore[no-untyped-def]
    async def wrapped():  # type: ignore[no-untyped-def]
        if os.environ.get("DIAG_QUIET"):
            return await coro
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
    if not os.environ.get("DIAG_QUIET"):  # QUIET: no GC hook, no heartbeat (CPU A/B)
        gc.callbacks.append(_gc_cb)
    if os.environ.get("DIAG_SWITCH"):  # GIL switch interval (s): how soon the loop gets it back
        sys.setswitchinterval(float(os.environ["DIAG_SWITCH"]))
        sys.setswitchinterval = lambda _s: None  # type: ignore[assignment]  # soakd's own: not now
    if os.environ.get("DIAG_NOGC"):
        gc.disable()
    if os.environ.get("DIAG_STACKS"):
        threading.Thread(target=_watchdog, args=(threading.get_ident(),), daemon=True).start()
    asyncio.runners.Runner.run = _run  # type: ignore[method-assign]
    if os.environ.get("DIAG_COARSE"):  # A/B: the open loop's sleep as it was (asyncio.sleep)
        import soakd.workload.runner as runner_mod

        async def _coarse(deadline_ns: int) -> None:
            delay = deadline_ns - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)

        runner_mod.sleep_until_ns = _coarse  # type: ignore[assignment]
    pumps: list[int] = []
    if os.environ.get("DIAG_SLICED_PUMP"):  # the prototype became the journal's own hand-off
        sys.exit("diag: DIAG_SLICED_PUMP is gone: the journal hands each committed batch "
                 "back as one fold (soakd/measure/fold.py)")
    if os.environ.get("DIAG_PUMP"):  # time the application of each committed batch's fold
        from soakd.journal.handoff import HandOff

        _orig_apply = HandOff.apply

        def _timed_apply(self, f):  # type: ignore[no-untyped-def]
            t = _perf()
            _orig_apply(self, f)
            pumps.append(_perf() - t)

        HandOff.apply = _timed_apply  # type: ignore[method-assign]
        atexit.register(lambda: print(
            f"diag: journal folds applied: n={len(pumps)} "
            f"p50={sorted(pumps)[len(pumps) // 2] / 1e6:.2f} ms "
            f"p99={sorted(pumps)[int(len(pumps) * 0.99)] / 1e6:.2f} ms max={max(pumps) / 1e6:.2f} ms",
            file=sys.stderr) if pumps else None)
    from soakd.cli import main

    sys.exit(main(sys.argv[2:]))
