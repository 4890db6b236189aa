"""Where soakd's RSS goes: the in-process hot path (bench/clients.py soakd) with allocator
counters read along the run.

    .venv/bin/python bench/memdiag.py --url http://127.0.0.1:PORT --requests 300000

Every ``--every`` requests it prints VmRSS and its split (RssAnon / RssFile), glibc's
``mallinfo2`` (arena bytes obtained from the OS, bytes in use, bytes free inside the
arenas, mmapped blocks), CPython's allocated blocks (objects alive) and the objects the
GC tracks. A flat "in use" and "blocks" with a growing "arena"/"free" is allocator
fragmentation or arena growth, not a leak; growing blocks is a leak of Python objects.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def mallinfo() -> dict[str, float]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    mb = 1 / 2**20
    return {"arena_mb": m.arena * mb, "in_use_mb": m.uordblks * mb, "free_mb": m.fordblks * mb,
            "mmapped_mb": m.hblkhd * mb}


def status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    return out


async def run(url: str, n: int, every: int, conc: int) -> list[dict[str, float]]:
    from soakd.config import TargetConfig, Workload
    from soakd.metrics.run import Metrics
    from soakd.model import Phase, Plan
    from soakd.run.stats import RunStats
    from soakd.targets.openai import open_target
    from soakd.workload.prompts import make_prompt_source
    from soakd.workload.runner import Runner
    from soakd.shapes import Closed

    target = await open_target(TargetConfig(name="t", base_url=url, model="tiny-llama"))
    metrics = Metrics()
    stats = RunStats(["t"])
    metrics.add_target("t", ["p"])
    rows: list[dict[str, float]] = []
    state = {"done": 0}
    t0 = time.monotonic()
    runner: Runner

    class Probe:
        def record(self, o: object) -> None:
            state["done"] += 1
            d = state["done"]
            if d % every == 0 or d == 1000:
                row = {"done": d, "t": time.monotonic() - t0, **status(), **mallinfo(),
                       "blocks": sys.getallocatedblocks(), "gc_objects": len(gc.get_objects())}
                rows.append(row)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                  for k, v in row.items()}), flush=True)
            if d >= n:
                runner.stop()

    plan = Plan((Phase(0, "p", 0, 3600 * 10**9, {"t": Closed(conc)}),))
    workload = Workload(max_tokens=16, prompts={"input_tokens": {"mean": 20}})
    runner = Runner(plan, {"t": target}, make_prompt_source(workload), [metrics, stats, Probe()],
                    max_tokens=16, temperature=0.0)
    await runner.run()
    await runner.drain(30)
    await target.aclose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--requests", type=int, default=300_000)
    ap.add_argument("--every", type=int, default=25_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not a.url.startswith("http://127."):
        ap.error("loopback only")
    rows = asyncio.run(run(a.url, a.requests, a.every, a.concurrency))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
