"""Probes room, GPU probe: samples a ``GpuSource`` into soakd's GPU gauges, on the loop.

Memory (NVML's v2 ``used`` excludes the driver's reserved memory, shown on its own), peak,
robust leak slopes, per-process memory mapped to targets, energy as counter increments,
throttle reasons, XIDs. A source that is absent leaves ``soakd_gpu_probe_up`` at 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from soakd.metrics import names as mn
from soakd.metrics.run import ProbeMetrics
from soakd.model import Sample
from soakd.probes._ticks import sleep_until_next
from soakd.probes.gpu.model import (
    KNOWN_BITS,
    MEMORY_XIDS,
    OTHER,
    THROTTLE_BITS,
    XID_MEANINGS,
    GpuReading,
    GpuSource,
    error_text,
)
from soakd.probes.leak import LeakSlope

log = structlog.get_logger()


VanishedCallback = Callable[..., None]
"""``(target, **evidence)``: a mapped GPU process died."""


class GpuProbe:
    """Samples a GpuSource every ``interval`` seconds into the GPU gauges (on the loop)."""

    def __init__(
        self,
        source: GpuSource,
        metrics: ProbeMetrics,
        emit: Callable[[Sample], None],
        *,
        interval: float,
        leak_window_s: float,
        leak_limit_bytes_per_hour: float = float("inf"),
        on_vanished: VanishedCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.interval = interval
        self.leak_window_s = leak_window_s
        self.leak_limit = leak_limit_bytes_per_hour
        self.peak: dict[str, float] = {}
        self.used: dict[str, float] = {}  # the last reading per GPU (the live view, /status)
        self.xids: dict[tuple[str, int], int] = {}
        self._m = metrics
        self._emit = emit
        self._on_vanished = on_vanished
        self._clock = clock
        self._wall = wall
        self._up = metrics.probe_up.labels(source.name)
        self._state: bool | None = None
        self._named: set[tuple[str, str, str]] = set()
        self._xid_ready: set[str] = set()
        self._energy_last: dict[str, float] = {}
        self._energy_total: dict[str, float] = {}
        self._slopes: dict[tuple[str, str], LeakSlope] = {}  # (gpu, "" or target)
        self._pids: dict[tuple[str, str], frozenset[int]] = {}
        self._proc_seen: dict[str, set[str]] = {}
        self._leaking: set[tuple[str, str]] = set()

    async def run(self) -> None:
        """Open the source and sample until cancelled; returns at once if it is absent."""
        if not await self.source.open(self.on_xid):
            self._up.set(0)
            return
        next_t = time.monotonic()
        while True:
            try:
                readings = await self.source.read()
            except Exception as exc:  # a source bug must not end the probe
                log.warning("gpu_read_failed", source=self.source.name, reason=error_text(exc))
                readings = None
            self.apply(readings)
            next_t = await sleep_until_next(next_t, self.interval)

    async def aclose(self) -> None:
        await self.source.aclose()

    # --- on the loop ---------------------------------------------------------------------------

    def on_xid(self, gpu: str, code: int) -> None:
        key = (gpu, code)
        total = self.xids.get(key, 0) + 1
        self.xids[key] = total
        self._m.xid.labels(gpu, str(code)).inc()
        log.warning(
            "gpu_xid",
            gpu=gpu,
            xid=code,
            meaning=XID_MEANINGS.get(code, "see NVIDIA's XID catalog"),
            memory_related=code in MEMORY_XIDS,
            total=total,
        )
        self._emit(
            Sample(
                self._wall(),
                mn.GPU_XID_ERRORS_TOTAL,
                float(total),
                (("gpu", gpu), ("xid", str(code))),
            )
        )

    def apply(self, readings: list[GpuReading] | None) -> None:
        ok = bool(readings) and any(r.used is not None for r in readings or ())
        self._up.set(1 if ok else 0)
        if ok != self._state:
            if self._state is not None or not ok:
                log.info("gpu_probe_up" if ok else "gpu_probe_failing", source=self.source.name)
            self._state = ok
        if not readings:
            return
        now, wall = self._clock(), self._wall()
        for r in readings:
            self._apply_one(r, now, wall)

    def _apply_one(self, r: GpuReading, now: float, wall: float) -> None:
        m, g = self._m, str(r.index)
        lg = (("gpu", g),)
        out: list[Sample] = []
        if g not in self._xid_ready:
            # the XID codes soakd knows, at 0 from the first reading: "no XID" is a value
            self._xid_ready.add(g)
            for code in XID_MEANINGS:
                m.xid.labels(g, str(code))
        if r.uuid or r.name:
            ident = (g, r.uuid, r.name)
            if ident not in self._named:
                self._named.add(ident)
                m.gpu_info.labels(*ident).set(1)
        for value, gauge in (
            (r.total, m.mem_total),
            (r.free, m.mem_free),
            (r.reserved, m.mem_reserved),
            (r.sm_clock_hz, m.sm_clock),
            (r.mem_clock_hz, m.mem_clock),
            (r.utilization, m.utilization),
        ):
            if value is not None:
                gauge.labels(g).set(value)
        for value, gauge, name in (
            (r.used, m.mem_used, mn.GPU_MEMORY_USED_BYTES),
            (r.temperature_c, m.temperature, mn.GPU_TEMPERATURE_CELSIUS),
            (r.power_w, m.power, mn.GPU_POWER_WATTS),
        ):
            if value is not None:
                gauge.labels(g).set(value)
                out.append(Sample(wall, name, value, lg))
        if r.used is not None:
            self.used[g] = r.used
            peak = max(self.peak.get(g, 0.0), r.used)
            self.peak[g] = peak
            m.mem_peak.labels(g).set(peak)
            slope = self._slope((g, ""), now, r.used)
            m.leak_window_fill.labels(g).set(self._slopes[(g, "")].fill_ratio)
            if slope is not None:
                m.leak_slope.labels(g).set(slope)
                out.append(Sample(wall, mn.GPU_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR, slope, lg))
        if r.energy_j is not None:
            last = self._energy_last.get(g)
            self._energy_last[g] = r.energy_j
            energy = m.energy.labels(g)  # zero from the first reading, not absent
            if last is not None and r.energy_j >= last:  # smaller: the driver reloaded
                delta = r.energy_j - last
                energy.inc(delta)
                self._energy_total[g] = self._energy_total.get(g, 0.0) + delta
            self._energy_total.setdefault(g, 0.0)
            out.append(Sample(wall, mn.GPU_ENERGY_JOULES_TOTAL, self._energy_total[g], lg))
        if r.throttle is not None:
            for bit, reason in THROTTLE_BITS:
                m.throttle.labels(g, reason).set(1 if r.throttle & bit else 0)
            m.throttle.labels(g, "other").set(1 if r.throttle & ~KNOWN_BITS else 0)
        if r.processes is not None:
            out += self._apply_processes(g, r, now, wall)
        for sample in out:
            self._emit(sample)

    def _apply_processes(self, g: str, r: GpuReading, now: float, wall: float) -> list[Sample]:
        m = self._m
        sums: dict[str, float] = {}
        pids: dict[str, set[int]] = {}
        for p in r.processes or ():
            sums[p.target] = sums.get(p.target, 0.0) + (p.used_bytes or 0.0)
            pids.setdefault(p.target, set()).add(p.pid)
        seen = self._proc_seen.setdefault(g, set())
        seen.update(sums)
        out = []
        for target in sorted(seen):
            value = sums.get(target, 0.0)
            labels = (("gpu", g), ("target", target))
            m.proc_mem.labels(g, target).set(value)
            out.append(Sample(wall, mn.GPU_PROCESS_MEMORY_BYTES, value, labels))
            key = (g, target)
            now_pids = frozenset(pids.get(target, ()))
            if self._pids.get(key) != now_pids:  # another process: its memory is a new series
                self._pids[key] = now_pids
                if key in self._slopes:
                    self._slopes[key].reset()
                    m.proc_leak_slope.labels(g, target).set(0)
            if not now_pids:
                continue
            slope = self._slope(key, now, value)
            if slope is not None:
                m.proc_leak_slope.labels(g, target).set(slope)
                out.append(
                    Sample(wall, mn.GPU_PROCESS_MEMORY_LEAK_SLOPE_BYTES_PER_HOUR, slope, labels)
                )
        for v in r.vanished:
            if v.target == OTHER:
                continue
            if v.alive:
                log.info(
                    "gpu_process_left",
                    gpu=g,
                    target=v.target,
                    pid=v.pid,
                    note="still running: it released the GPU, not counted as vanished",
                )
            elif self._on_vanished is not None:
                self._on_vanished(
                    v.target,
                    gpu=g,
                    pid=v.pid,
                    last_gpu_memory_bytes=v.last_bytes,
                    gpu_free_bytes=r.free,
                )
        return out

    def _slope(self, key: tuple[str, str], now: float, value: float) -> float | None:
        est = self._slopes.get(key)
        if est is None:
            est = self._slopes[key] = LeakSlope(self.leak_window_s)
        est.add(now, value)
        slope = est.slope_per_hour()
        if slope is None:
            return None
        if slope > self.leak_limit and key not in self._leaking:
            self._leaking.add(key)
            log.warning(
                "vram_leak_suspected",
                gpu=key[0],
                target=key[1] or None,
                slope_bytes_per_hour=round(slope),
                limit=self.leak_limit,
                window_s=self.leak_window_s,
            )
        elif slope <= self.leak_limit and key in self._leaking:
            self._leaking.discard(key)
            log.info(
                "vram_leak_cleared",
                gpu=key[0],
                target=key[1] or None,
                slope_bytes_per_hour=round(slope),
            )
        return slope
