"""Simulator room: the simulated card under the engine (VRAM, power, heat, clocks).

Pure and clock-free like the engine: the caller says when the engine starts and
stops being busy, and reads samples at given instants. What it models, and why:

- VRAM: vLLM reserves its share at start, so memory used is flat by design; it
  grows only a little with the batch (activations) and with a simulated leak.
- utilisation is the fraction of time the engine had work (DCGM's GPU_UTIL is the
  fraction of time a kernel ran), smoothed over about a second;
- power follows load between idle and full-load draw: a busy card with one
  sequence draws ~60% of the way up (decode is memory-bound), a full batch 100%;
  energy integrates it;
- temperature approaches a load-dependent steady state with a time constant, and
  the SM clock drops when it passes the throttle temperature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from soakd.profiles import MIB, Profile

_UTIL_WINDOW_S = 1.0


@dataclass(frozen=True, slots=True)
class GpuSample:
    """What dcgm-exporter would report for the card at one instant (its units)."""

    fb_total_mib: float
    fb_used_mib: float
    fb_free_mib: float
    gpu_temp_c: float
    power_w: float
    total_energy_mj: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    gpu_util_pct: float
    xid_last: int


class GpuModel:
    """Integrates the card's state lazily, at each busy/idle switch and each sample."""

    def __init__(self, profile: Profile, now: float) -> None:
        self.profile = profile
        self._start = now
        self._t = now
        self._load = 0.0  # 0 idle, 0.6 .. 1 busy
        self._util = 0.0  # smoothed 0..1
        self._temp = profile.temp_idle_c
        self._power_w = profile.power_idle_w  # smoothed like the utilisation
        self._energy_mj = 0.0

    def set_activity(self, now: float, running: int, busy: bool) -> None:
        """From ``now`` on the engine is busy (or idle) with ``running`` sequences."""
        self._advance(now)
        if not busy:
            self._load = 0.0
        else:
            self._load = 0.6 + 0.4 * min(1.0, running / self.profile.max_num_seqs)

    def vram_used_mib(self, now: float, running: int) -> float:
        """Device memory the server would use, unclamped (may exceed the card)."""
        p = self.profile
        leak_mib = p.vram_leak_bytes_per_hour * max(0.0, now - self._start) / 3600.0 / MIB
        return p.vram_used_mib + p.vram_mib_per_running_seq * running + leak_mib

    def vram_exhausted(self, now: float, running: int) -> bool:
        """Would a batch of ``running`` sequences need more memory than the card has?"""
        return self.vram_used_mib(now, running) > self.profile.vram_total_mib

    def sample(self, now: float, running: int) -> GpuSample:
        self._advance(now)
        p = self.profile
        used = min(self.vram_used_mib(now, running), p.vram_total_mib)
        if self._util < 0.05:
            sm_clock = p.sm_clock_idle_mhz
        else:
            over = max(0.0, self._temp - p.throttle_temp_c)
            sm_clock = p.sm_clock_max_mhz * max(0.5, 1.0 - 0.05 * over)
        return GpuSample(
            fb_total_mib=p.vram_total_mib,
            fb_used_mib=used,
            fb_free_mib=p.vram_total_mib - used,
            gpu_temp_c=self._temp,
            power_w=self._power_w,
            total_energy_mj=self._energy_mj,
            sm_clock_mhz=sm_clock,
            mem_clock_mhz=p.mem_clock_mhz,
            gpu_util_pct=100.0 * self._util,
            xid_last=0,
        )

    def _power(self, util: float) -> float:
        p = self.profile
        return p.power_idle_w + (p.power_max_w - p.power_idle_w) * util

    def _advance(self, now: float) -> None:
        dt = now - self._t
        if dt <= 0.0:
            return
        self._t = now
        p = self.profile
        load = self._load
        busy = 1.0 if load > 0.0 else 0.0
        self._energy_mj += self._power(load) * dt * 1000.0
        self._util += (busy - self._util) * -math.expm1(-dt / _UTIL_WINDOW_S)
        self._power_w += (self._power(load) - self._power_w) * -math.expm1(-dt / _UTIL_WINDOW_S)
        target = p.temp_idle_c + (p.temp_max_c - p.temp_idle_c) * load
        self._temp += (target - self._temp) * -math.expm1(-dt / p.thermal_time_constant_s)
