"""Process set-up: cap glibc's malloc arenas before soakd starts its threads.

glibc gives each new thread that allocates its own malloc arena, up to 8 per core, and an
arena keeps the memory it once held. `soakd run` has several threads (journal writer,
exporter, probes, asyncio's to_thread pool, which grows with the core count), so on a
16-core machine its RSS was ~40 MB above the same run on 2 cores (docs/benchmarks.md,
"Many cores"). Two arenas keep the threads' allocations together; the hot path runs on
the main thread and pymalloc, which this does not touch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_ARENA_MAX = -8  # glibc malloc.h
ARENA_MAX = 2


def limit_arenas(arenas: int = ARENA_MAX) -> bool:
    """mallopt(M_ARENA_MAX, arenas) on glibc; True when set. A no-op elsewhere (musl, macOS)
    and when the user chose already (MALLOC_ARENA_MAX or a glibc.malloc.arena_max tunable)."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    if "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
