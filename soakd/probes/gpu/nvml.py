"""Probes room, GPU through NVML: ``NvmlSampler``, the ``GpuSource`` that reads NVML through
the sampling process ``python -m soakd.gpu.sampler`` (soakd/gpu/sampler.py).

soakd's own process never loads the driver: NVML's thread, the XID waiter, the driver
calls and their ~28 MB are in the sampler, so none of them holds the GIL of the loop that
times tokens (``workers: 1``) or plans the sends. Each ``read`` asks the sampler for one
reading and waits for it (``READ_TIMEOUT_S`` at most: a late answer is dropped, the reading
is None); XIDs and the sampler's log lines arrive on their own. A sampler that died (a
driver crash) is logged and started again at the next read, at most once every
``RESTART_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import structlog

from soakd.childlog import relog
from soakd.config import TargetConfig
from soakd.gpu.readings import GpuReading, XidCallback
from soakd.spawn import die_with_parent

log = structlog.get_logger()

START_TIMEOUT_S: Final = 60.0
"""The sampler says whether NVML opened within this (imports, a slow driver start)."""
READ_TIMEOUT_S: Final = 10.0
RESTART_S: Final = 30.0
STOP_GRACE_S: Final = 5.0


class NvmlSampler:
    """GPU readings from NVML, read in the sampler process (see the module's doc)."""

    name = "nvml"

    def __init__(self, targets: Sequence[TargetConfig] = (), *, required: bool = False) -> None:
        self.required = required
        self._hello = {
            "targets": [
                {"name": t.name, "pid": t.pid, "process_name": t.process_name}
                for t in targets
                if t.pid is not None or t.process_name
            ],
            "required": required,
        }
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: deque[asyncio.Future[list[GpuReading] | None]] = deque()
        self._on_xid: XidCallback | None = None
        self._started = 0.0
        self._closing = False

    @property
    def pid(self) -> int | None:
        """The sampler's pid while it runs (None otherwise)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def open(self, on_xid: XidCallback) -> bool:
        self._on_xid = on_xid
        return await self._start()

    async def _start(self) -> bool:
        self._started = time.monotonic()
        proc = self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "soakd.gpu.sampler",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,  # a SIGKILLed soakd leaves no sampler behind
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps(self._hello).encode() + b"\n")
        try:
            opened = await asyncio.wait_for(self._opened(proc.stdout), START_TIMEOUT_S)
        except (TimeoutError, OSError, ValueError) as exc:
            log.warning("gpu_sampler_failed", source="nvml", reason=type(exc).__name__)
            opened = False
        if not opened:
            await self._stop(proc)
            return False
        self._reader = asyncio.create_task(self._read_lines(proc.stdout))
        return True

    async def _opened(self, stdout: asyncio.StreamReader) -> bool:
        while line := await stdout.readline():
            doc = json.loads(line)
            if "open" in doc:
                return bool(doc["open"])
            self._dispatch(doc)
        return False  # it exited before it said

    def _dispatch(self, doc: dict[str, Any]) -> None:
        if "readings" in doc:
            got = doc["readings"]
            readings = None if got is None else [GpuReading.from_doc(r) for r in got]
            while self._waiting:
                fut = self._waiting.popleft()
                if not fut.done():  # one that timed out is skipped: its answer is late
                    fut.set_result(readings)
                    break
        elif "xid" in doc and self._on_xid is not None:
            gpu, code = doc["xid"]
            self._on_xid(str(gpu), int(code))
        elif "log" in doc:
            level, event, fields = doc["log"]
            relog(level, event, fields)

    async def _read_lines(self, stdout: asyncio.StreamReader) -> None:
        try:
            while line := await stdout.readline():
                self._dispatch(json.loads(line))
        except (OSError, ValueError) as exc:
            log.warning("gpu_sampler_failed", source="nvml", reason=type(exc).__name__)
        for fut in self._waiting:
            if not fut.done():
                fut.set_result(None)
        self._waiting.clear()
        if not self._closing:
            code = await self._proc.wait() if self._proc is not None else None
            log.error("gpu_sampler_exited", source="nvml", code=code, restart_in_s=RESTART_S)

    async def read(self) -> list[GpuReading] | None:
        if self.pid is None or self._reader is None or self._reader.done():
            if self._closing or time.monotonic() - self._started < RESTART_S:
                return None
            if not await self._start():
                return None
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        fut: asyncio.Future[list[GpuReading] | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            proc.stdin.write(b"read\n")
            return await asyncio.wait_for(fut, READ_TIMEOUT_S)
        except (TimeoutError, OSError):
            return None

    async def aclose(self) -> None:
        """End of stdin: the sampler shuts NVML down and exits (killed if it does not)."""
        self._closing = True
        if self._proc is not None:
            await self._stop(self._proc)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
