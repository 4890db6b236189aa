"""What NVML adds to a process's RSS, call by call (the GPU probe's calls, in its order).

    python bench/nvml_rss.py

`soakd run` on a GPU host (gpu.source auto) opened NVML and its RSS was ~30 MB above the
same run with `gpu: {source: none}` (docs/benchmarks.md, "Many cores"). This runs the
calls soakd's NvmlSource makes, in a worker thread as soakd does (asyncio.to_thread), with
the arena cap of `soakd run` applied first, and prints VmRSS, its anonymous and file-backed
parts and the thread count after each step.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def status() -> dict[str, float]:
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = round(int(v.split()[0]) / 1024, 1)
            elif k == "Threads":
                out[k] = int(v)
    return out


def main() -> None:
    from soakd import runtime

    capped = runtime.limit_arenas()
    rows: list[dict[str, Any]] = [{"step": f"start (arena cap {capped})", **status()}]

    def step(name: str, fn: Callable[[], object]) -> object:
        try:
            result = fn()
        except Exception as exc:  # a call this driver lacks: say so, go on
            result = None
            name += f" (failed: {type(exc).__name__}: {exc})"
        rows.append({"step": name, **status()})
        return result

    def probe() -> None:
        import pynvml as n

        step("import pynvml", lambda: None)
        step("nvmlInit", n.nvmlInit)
        count = int(step("nvmlDeviceGetCount", n.nvmlDeviceGetCount) or 0)  # type: ignore[call-overload]
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        step(
            "handles, UUID, name",
            lambda: [(n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetName(h)) for h in hs],
        )
        for _ in range(2):
            step(
                "power, temperature, energy",
                lambda: [
                    (
                        n.nvmlDeviceGetPowerUsage(h),
                        n.nvmlDeviceGetTemperature(h, 0),
                        n.nvmlDeviceGetTotalEnergyConsumption(h),
                    )
                    for h in hs
                ],
            )
            step(
                "clocks, utilization",
                lambda: [
                    (
                        n.nvmlDeviceGetClockInfo(h, 1),
                        n.nvmlDeviceGetClockInfo(h, 2),
                        n.nvmlDeviceGetUtilizationRates(h),
                    )
                    for h in hs
                ],
            )
            step(
                "clock event reasons",
                lambda: [n.nvmlDeviceGetCurrentClocksEventReasons(h) for h in hs],
            )
            step("memory info", lambda: [n.nvmlDeviceGetMemoryInfo(h) for h in hs])
            step(
                "compute running processes",
                lambda: [n.nvmlDeviceGetComputeRunningProcesses(h) for h in hs],
            )
        es = step("nvmlEventSetCreate", n.nvmlEventSetCreate)
        step(
            "nvmlDeviceRegisterEvents (Xid)",
            lambda: [
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es) for h in hs
            ],
        )
        step("nvmlEventSetWait 10 ms", lambda: n.nvmlEventSetWait(es, 10))
        step("nvmlEventSetFree", lambda: n.nvmlEventSetFree(es))
        step("nvmlShutdown", n.nvmlShutdown)

    t = threading.Thread(target=probe, name="nvml-probe")
    t.start()
    t.join()
    try:
        import os

        from suite import top_mappings

        rows.append({"step": "largest mappings at the end", "maps": top_mappings(os.getpid())})
    except ImportError:
        pass
    width = max(len(r["step"]) for r in rows)
    for r in rows:
        rest = {k: v for k, v in r.items() if k != "step"}
        print(f"{r['step']:<{width}}  {json.dumps(rest)}")


if __name__ == "__main__":
    main()
