"""Probes room, OOM: out-of-memory events per target, counted by where soakd saw them.

Sources (``soakd_target_oom_events_total{source}``), each its own evidence; one real OOM
can show under several, so compare sources, never add them:

- ``error_body``: a request's error body said out of memory (``Outcome.oom``).
- ``restart_after_errors``: at least ``BURST_MIN`` 5xx or cut streams in the
  ``BURST_WINDOW_S`` before the target went down, then a counted restart: the shape of a
  server that died under load.
- ``process_vanished``: a GPU process mapped to the target left NVML's process list and
  is gone from /proc too (a process that only released its GPU context is not counted).
  Any death counts, an OOM kill or a plain kill: corroborate with the other sources.
- ``log``: a line of the target's ``oom_log`` matched "out of memory" (CUDA/HIP OOM,
  the kernel's "Out of memory: Killed process") or "oom-kill"/"oom_kill".
- ``xid``: never counted. No XID code means the device ran out of memory: a CUDA OOM
  is an allocation failure returned to the process, and raises no XID. The XIDs about
  memory (31 page fault, 48/63/64/92/94/95 ECC and row remapping) are faults or failing
  hardware, so calling them OOM would send people tuning the KV cache after a bad card.
  XIDs are counted on their own in ``soakd_gpu_xid_errors_total{gpu,xid}``.

Events of one source and target within ``COALESCE_S`` of the last counted one are
folded into it (one OOM fails every request in flight and prints a traceback of several
matching lines), so a storm of OOM replies counts one event per ``COALESCE_S`` while it
lasts: alerts stay on, and ``soakd_oom_errors_total`` still has every request.
Every event is logged with its evidence, trimmed and scrubbed of anything key-like.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from soakd.metrics import names as mn
from soakd.metrics.run import OOM_SOURCES, ProbeMetrics
from soakd.model import ErrorKind, Finished, Sample

log = structlog.get_logger()

COALESCE_S = 5.0
BURST_WINDOW_S = 60.0
BURST_MIN = 3
CRASH_ERRORS = frozenset({ErrorKind.HTTP_5XX, ErrorKind.STREAM_TRUNCATED})
COUNTED_SOURCES = tuple(s for s in OOM_SOURCES if s != "xid")

OOM_LINE = re.compile(r"out of memory|outofmemory|oom[-_ ]?kill", re.IGNORECASE)
_SECRETS = re.compile(
    r"(?i)(bearer\s+|authorization[=:]\s*|api[-_]?key[\"']?\s*[=:]\s*[\"']?|\bsk-)[^\s\"',;]+"
)
EVIDENCE_CHARS = 240


def scrub(text: str) -> str:
    """Trim a line for a log event and mask anything that looks like a key."""
    return _SECRETS.sub(r"\1***", text.strip())[:EVIDENCE_CHARS]


class OomWatch:
    """Counts OOM events; an OutcomeSink for ``error_body`` and the error bursts."""

    def __init__(
        self,
        metrics: ProbeMetrics,
        targets: Iterable[str],
        emit: Callable[[Sample], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._metrics = metrics
        self._emit = emit
        self._clock = clock
        self._wall = wall
        self.targets = list(targets)
        self.totals: dict[tuple[str, str], int] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._errors: dict[str, deque[float]] = {t: deque(maxlen=512) for t in self.targets}
        for target in self.targets:
            for source in COUNTED_SOURCES:
                metrics.oom_events.labels(target, source)  # start at zero, not absent
                self.totals[(target, source)] = 0

    def record(self, o: Finished) -> None:
        if o.oom:
            self.count(
                o.target,
                "error_body",
                status=o.status,
                error=o.error.value if o.error else "",
                detail=scrub(o.error_detail),
                seq=o.seq,
            )
        if o.error in CRASH_ERRORS:
            errors = self._errors.get(o.target)
            if errors is not None:
                errors.append(self._clock())

    def on_restart(self, target: str, reason: str, down_since: float | None) -> None:
        """A counted restart: was it preceded by a burst of server errors?"""
        errors = self._errors.get(target)
        if not errors:
            return
        now = self._clock()
        ref = down_since if down_since is not None else now
        burst = [t for t in errors if ref - BURST_WINDOW_S <= t <= now]
        errors.clear()
        if len(burst) >= BURST_MIN:
            self.count(
                target,
                "restart_after_errors",
                errors=len(burst),
                window_s=BURST_WINDOW_S,
                restart_reason=reason,
                errors_before_down_s=round(ref - burst[0], 3),
            )

    def process_vanished(self, target: str, **evidence: object) -> None:
        self.count(target, "process_vanished", **evidence)

    def log_line(self, target: str, line: str, path: str) -> None:
        self.count(target, "log", file=path, line=scrub(line))

    def count(self, target: str, source: str, **evidence: object) -> bool:
        """Count one event unless it continues the last one; True when counted."""
        key = (target, source)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < COALESCE_S:
            return False
        self._last[key] = now
        total = self.totals.get(key, 0) + 1
        self.totals[key] = total
        self._metrics.oom_events.labels(target, source).inc()
        log.warning("oom_event", target=target, source=source, total=total, **evidence)
        self._emit(
            Sample(
                self._wall(),
                mn.TARGET_OOM_EVENTS_TOTAL,
                float(total),
                (("source", source), ("target", target)),
            )
        )
        return True


class LogTail:
    """Follows a log file from its end, across rotation (rename or copy-truncate).

    Blocking file IO: call ``poll`` in a worker thread. A file that does not exist yet
    is read from its start once it appears (all of it is new)."""

    def __init__(self, path: Path, max_read: int = 1 << 20, max_line: int = 64 << 10) -> None:
        self.path = path
        self.max_read = max_read
        self.max_line = max_line
        self._lock = threading.Lock()  # poll runs in a thread, close may come from the loop
        self._file: int | None = None  # fd
        self._id: tuple[int, int] | None = None
        self._pos = 0
        self._partial = b""
        self._from_start = False

    def poll(self) -> list[str]:
        with self._lock:
            return self._poll()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _poll(self) -> list[str]:
        lines: list[str] = []
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        if self._file is not None and (st is None or (st.st_ino, st.st_dev) != self._id):
            lines += self._read()  # rotated or removed: finish the old file first
            self._close()
            self._from_start = True
        if self._file is None:
            if st is None:
                self._from_start = True
                return lines
            try:
                self._file = os.open(self.path, os.O_RDONLY)
            except OSError:
                return lines
            fst = os.fstat(self._file)
            self._id = (fst.st_ino, fst.st_dev)
            self._pos = 0 if self._from_start else fst.st_size
            self._partial = b""
        elif st is not None and st.st_size < self._pos:
            self._pos = 0  # truncated in place
            self._partial = b""
        lines += self._read()
        return lines

    def _close(self) -> None:
        if self._file is not None:
            os.close(self._file)
        self._file = None
        self._id = None

    def _read(self) -> list[str]:
        assert self._file is not None
        data = os.pread(self._file, self.max_read, self._pos)
        if not data:
            return []
        self._pos += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()[-self.max_line :]
        return [c[: self.max_line].decode("utf-8", errors="replace") for c in chunks]


async def tail_loop(watch: OomWatch, target: str, tail: LogTail, interval: float) -> None:
    """Poll ``tail`` every ``interval`` seconds; count matching lines. Runs until cancelled."""
    shown = str(tail.path)
    try:
        while True:
            lines = await asyncio.to_thread(tail.poll)
            for line in lines:
                if OOM_LINE.search(line):
                    watch.log_line(target, line, shown)
            await asyncio.sleep(interval)
    finally:
        tail.close()
