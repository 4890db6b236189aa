"""Where the endurance run's RSS goes: the same plan as bench/endurance.py, in-process and
never killed, with the allocators' own counters every 30 s.

    .venv/bin/python bench/endurance_mem.py --duration 85m --out /tmp/endure/mem
    .venv/bin/python bench/endurance_mem.py --duration 30m --trim-every 0 --out /tmp/m/off
    .venv/bin/python bench/endurance_mem.py --duration 30m --out /tmp/m/on   # trim, as shipped
    .venv/bin/python bench/endurance_mem.py --compare /tmp/m/off/mem.csv /tmp/m/on/mem.csv

Each line (and mem.csv): requests so far, RssAnon, glibc's ``mallinfo2`` (heap obtained
from the OS by every arena, bytes in use, bytes free inside the arenas, mmapped blocks),
CPython's live blocks (``sys.getallocatedblocks``: pymalloc and large objects alike), the
objects the GC tracks and the open fds (the sockets to the simulators, mostly). Live memory
that stays flat ("in use", blocks) while RssAnon creeps is the allocators keeping freed
memory (fragmentation), not a leak; growing blocks is a leak of Python objects. No
tracemalloc: its own tables would be the growth.
glibc's arenas are capped at 2 first and ``malloc_trim(0)`` runs every minute, as ``soakd
run`` does (soakd/runtime.py); ``--trim-every 0`` leaves the trim out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import ctypes
import gc
import os
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from endurance import CONFIG, duration
from suite import rss_anon_mb

from soakd import runtime
from soakd.config import config_from_dict
from soakd.run.app import RunOptions, Soak


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


async def run(args: argparse.Namespace, out: Path) -> None:
    cfg = config_from_dict(yaml.safe_load(CONFIG.format(duration_s=int(args.duration))))
    soak = Soak(
        cfg, RunOptions(run_dir=out / "run", metrics_addr="127.0.0.1:0", console_logs=False)
    )
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    sink = (out / "mem.csv").open("w")
    sink.write(
        "t_s,requests,rss_anon_mb,arena_mb,in_use_mb,free_mb,mmap_mb,blocks,gc_objects,fds\n"
    )

    async def watch() -> None:
        t0 = time.monotonic()
        while True:
            await asyncio.sleep(args.every)
            mi = libc.mallinfo2()
            done = sum(s.requests for s in soak.stats.total.values())
            row = [
                round(time.monotonic() - t0),
                done,
                round(rss_anon_mb(), 1),
                round(mi.arena / 2**20, 1),
                round(mi.uordblks / 2**20, 1),
                round(mi.fordblks / 2**20, 1),
                round(mi.hblkhd / 2**20, 1),
                sys.getallocatedblocks(),
                len(gc.get_objects()),
                len(os.listdir("/proc/self/fd")),
            ]
            sink.write(",".join(map(str, row)) + "\n")
            sink.flush()
            print(*row, flush=True)

    task = asyncio.create_task(watch())
    try:
        await soak.run()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sink.close()


def compare(without: Path, with_trim: Path, docs: Path) -> None:
    """Two runs' mem.csv (without and with the trim): RssAnon and the open fds, plotted."""
    from endurance import svg_lines

    runs = [list(csv.DictReader(f.open())) for f in (without, with_trim)]
    n = min(len(r) for r in runs)
    xs = [float(r["t_s"]) for r in runs[0][:n]]
    labels = ("without malloc_trim", "malloc_trim every 60 s")
    for col, name, title, unit in (
        ("rss_anon_mb", "trim_rss.svg", "RssAnon, without and with malloc_trim", "MB"),
        ("fds", "trim_fds.svg", "open fds (the pool shrinks after each burst)", "fds"),
    ):
        series = [
            (label, [float(r[col]) for r in run[:n]])
            for label, run in zip(labels, runs, strict=True)
        ]
        (docs / name).write_text(svg_lines(xs, series, title, unit, []))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("WITHOUT_CSV", "WITH_CSV"),
        help="only plot two runs' mem.csv into --docs (trim_rss.svg, trim_fds.svg)",
    )
    p.add_argument("--docs", type=Path, default=Path("docs/endurance"))
    p.add_argument("--duration", type=duration, default=3600.0)
    p.add_argument("--every", type=duration, default=30.0)
    p.add_argument("--out", default="/tmp/endure/mem")
    p.add_argument(
        "--trim-every",
        type=duration,
        default=runtime.TRIM_EVERY_S,
        help="malloc_trim(0) period, as `soakd run` does; 0: never (the baseline)",
    )
    args = p.parse_args()
    if args.compare:
        without, with_trim = args.compare
        compare(without, with_trim, args.docs)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runtime.prepare_process(args.trim_every)  # as `soakd run` does, unless --trim-every 0
    asyncio.run(run(args, out))


if __name__ == "__main__":
    main()
