"""Process set-up, in one place for ``soakd run``, its workers and the benchmarks: cap
glibc's malloc arenas before soakd starts its threads, hand freed pages back, and give
the event loop the GIL back sooner.

glibc gives each new thread that allocates its own malloc arena, up to 8 per core, and an
arena keeps the memory it once held. `soakd run` has several threads (journal writer,
exporter, probes, asyncio's to_thread pool, which grows with the core count), so on a
16-core machine its RSS was ~40 MB above the same run on 2 cores (docs/benchmarks.md,
"Many cores"). Two arenas keep the threads' allocations together; the hot path runs on
the main thread and pymalloc, which this does not touch.

Freed memory glibc keeps inside its heap (below the top, so not returned by the automatic
trim) is handed back every minute by ``malloc_trim(0)``, from a thread of its own so the
event loop never waits on it (ctypes releases the GIL for the call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, cast

M_ARENA_MAX = -8  # glibc malloc.h
ARENA_MAX = 2
TRIM_EVERY_S: Final = 60.0
"""How often the trimming thread calls ``malloc_trim(0)`` (docs/benchmarks.md, "Endurance")."""


def _glibc(name: str, argtypes: tuple[Any, ...]) -> Callable[..., int] | None:
    """glibc's function ``name`` (returning int), or None: not Linux, or a libc without it
    (musl has no ``malloc_trim``; neither has ``M_ARENA_MAX``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return cast("Callable[..., int]", fn)


def limit_arenas(arenas: int = ARENA_MAX) -> bool:
    """mallopt(M_ARENA_MAX, arenas) on glibc; True when set. A no-op elsewhere (musl, macOS)
    and when the user chose already (MALLOC_ARENA_MAX or a glibc.malloc.arena_max tunable)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    if "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = _glibc("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))


def _malloc_trim() -> Callable[..., int] | None:
    """glibc's ``malloc_trim``, or None (not Linux, not glibc)."""
    return _glibc("malloc_trim", (ctypes.c_size_t,))


def trim() -> bool:
    """One ``malloc_trim(0)``: every arena's free pages back to the OS. True when glibc
    released memory; False when it had none to release or is not there."""
    fn = _malloc_trim()
    return fn is not None and bool(fn(0))


def start_trimming(every_s: float = TRIM_EVERY_S) -> threading.Thread | None:
    """A daemon thread calling ``malloc_trim(0)`` every ``every_s``; None without glibc.
    It never touches the event loop; it ends with the process."""
    fn = _malloc_trim()
    if fn is None or every_s <= 0:
        return None

    never = threading.Event()  # a timed wait on a lock, not time.sleep: the clock_nanosleep
    # behind time.sleep fails (EINVAL) under libfaketime, which the clock tests preload

    def loop() -> None:
        while not never.wait(every_s):
            fn(0)

    thread = threading.Thread(target=loop, name="soakd-malloc-trim", daemon=True)
    thread.start()
    return thread


GIL_SWITCH_S: Final = 0.0005
"""``sys.setswitchinterval`` for ``soakd run``: how soon the event loop gets the GIL back.
With the default 5 ms, a token read while another thread runs Python is stamped up to
5 ms late; 0.5 ms cut the TTFT p99 error by ~30 % at 64 streams, same CPU
(docs/benchmarks.md)."""


def prepare_process(trim_every_s: float = TRIM_EVERY_S) -> None:
    """What a process that sends requests does first, before any thread allocates: two
    malloc arenas (RSS on many cores, docs/benchmarks.md) and the trimming thread
    (freed heap pages back to the OS every minute, "Endurance")."""
    limit_arenas()
    start_trimming(trim_every_s)


def favour_the_loop() -> None:
    """The GIL switch interval of a process whose event loop times tokens."""
    sys.setswitchinterval(GIL_SWITCH_S)
