"""Gateway room, VRAM: readings for the VRAM breaker, from soakd's own GPU sources.

The same ``GpuSource`` the probes use, from the same factory (``make_gpu_source``): NVML
on the box, or a DCGM exporter's page (the simulator serves one on its /metrics). One
reading each ``gpu.interval`` on a fixed grid; the breaker sees the chosen GPU's memory used (by
default the fullest GPU's), or nothing when the source failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from soakd.gateway.metrics import GatewayMetrics
from soakd.probes._ticks import sleep_until_next
from soakd.probes.gpu import GpuReading, GpuSource

log = structlog.get_logger()

Reading = Callable[[float, float | None], None]
"""``(now, used bytes or None)``."""


def pick(readings: list[GpuReading] | None, gpu: int | None) -> float | None:
    """Memory used of GPU ``gpu``, or of the fullest GPU when None."""
    if not readings:
        return None
    used = [r.used for r in readings if r.used is not None and (gpu is None or r.index == gpu)]
    return max(used) if used else None


class VramWatch:
    """Reads the source on a grid and hands each reading to ``on_reading``."""

    def __init__(
        self,
        source: GpuSource | None,
        on_reading: Reading,
        metrics: GatewayMetrics,
        *,
        interval: float,
        gpu: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.interval = interval
        self.gpu = gpu
        self._on_reading = on_reading
        self._m = metrics
        self._clock = clock
        self._failing = False

    async def run(self) -> None:
        """Until cancelled; returns at once when there is no source (one line logged)."""
        source = self.source
        if source is None or not await source.open(self._on_xid):
            self._m.vram_up.set(0)
            log.warning(
                "gateway_vram_absent",
                source=source.name if source else "none",
                note="the VRAM breaker has no readings and stays as it is",
            )
            return
        next_t = self._clock()
        while True:
            try:
                readings = await source.read()
            except Exception as exc:  # a source bug must not end the watch
                log.warning("gateway_vram_read_failed", reason=f"{type(exc).__name__}: {exc}"[:200])
                readings = None
            used = pick(readings, self.gpu)
            self._m.vram_up.set(0 if used is None else 1)
            if used is None and not self._failing:
                self._failing = True
                log.warning("gateway_vram_failing", source=source.name, gpu=self.gpu)
            elif used is not None and self._failing:
                self._failing = False
                log.info("gateway_vram_recovered", source=source.name)
            if used is not None:
                self._m.vram_used.set(used)
            self._on_reading(self._clock(), used)
            next_t = await sleep_until_next(next_t, self.interval)

    async def aclose(self) -> None:
        if self.source is not None:
            await self.source.aclose()

    def _on_xid(self, gpu: str, code: int) -> None:
        log.warning("gateway_gpu_xid", gpu=gpu, xid=code)
