"""Probes room, GPU through DCGM: GPU readings from a dcgm-exporter's /metrics (or the simulator's).

dcgm-exporter reports framebuffer memory in MiB, power in W, energy in mJ since boot,
clocks in MHz and utilisation in percent; everything is converted to soakd's base
units. ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID seen, not a count, so an XID is
counted when that value changes to a non-zero code (the same code twice in a row is
seen once; the value present at soakd's start is history, not counted). DCGM has no
per-process memory, so there is no per-target VRAM and no vanished-process evidence
from this source.
"""

from __future__ import annotations

import aiohttp
import structlog

from soakd.metrics import names as mn
from soakd.probes._http import Endpoint, fetch
from soakd.probes.gpu.model import GpuReading, XidCallback
from soakd.probes.server import parse_samples

log = structlog.get_logger()

MIB = 1 << 20
DCGM_TIMEOUT_S = 5.0

FB_USED = mn.DCGM_FB_USED
FB_FREE = mn.DCGM_FB_FREE
FB_RESERVED = mn.DCGM_FB_RESERVED
FB_TOTAL = mn.DCGM_FB_TOTAL
TEMP = mn.DCGM_GPU_TEMP
POWER = mn.DCGM_POWER_USAGE
ENERGY = mn.DCGM_TOTAL_ENERGY
SM_CLOCK = mn.DCGM_SM_CLOCK
MEM_CLOCK = mn.DCGM_MEM_CLOCK
UTIL = mn.DCGM_GPU_UTIL
XID = mn.DCGM_XID_ERRORS
THROTTLE = (mn.DCGM_CLOCKS_EVENT_REASONS, mn.DCGM_CLOCK_THROTTLE_REASONS)
WANTED = frozenset(
    {
        FB_USED,
        FB_FREE,
        FB_RESERVED,
        FB_TOTAL,
        TEMP,
        POWER,
        ENERGY,
        SM_CLOCK,
        MEM_CLOCK,
        UTIL,
        XID,
        *THROTTLE,
    }
)


def parse_dcgm(text: str) -> tuple[list[GpuReading], dict[str, int]]:
    """A dcgm-exporter page -> (readings by GPU, last XID by GPU). Raises ValueError."""
    by_gpu: dict[str, dict[str, float]] = {}
    ident: dict[str, tuple[str, str]] = {}
    for name, labels, value in parse_samples(text, WANTED):
        gpu = labels.get("gpu", "0")
        fields = by_gpu.setdefault(gpu, {})
        fields.setdefault(name, value)  # pod-labelled duplicates: the first one
        ident.setdefault(gpu, (labels.get("UUID", ""), labels.get("modelName", "")))
    readings: list[GpuReading] = []
    xids: dict[str, int] = {}
    for gpu in sorted(by_gpu, key=lambda g: (len(g), g)):
        f = by_gpu[gpu]
        uuid, model = ident[gpu]
        r = GpuReading(int(gpu) if gpu.isdigit() else len(readings), uuid, model)
        used, free, reserved = f.get(FB_USED), f.get(FB_FREE), f.get(FB_RESERVED)
        r.used = None if used is None else used * MIB
        r.free = None if free is None else free * MIB
        r.reserved = None if reserved is None else reserved * MIB
        total = f.get(FB_TOTAL)
        if total is not None:
            r.total = total * MIB
        elif used is not None and free is not None:
            r.total = (used + free + (reserved or 0.0)) * MIB
        r.temperature_c = f.get(TEMP)
        r.power_w = f.get(POWER)
        energy = f.get(ENERGY)
        r.energy_j = None if energy is None else energy / 1000.0
        sm, mem, util = f.get(SM_CLOCK), f.get(MEM_CLOCK), f.get(UTIL)
        r.sm_clock_hz = None if sm is None else sm * 1e6
        r.mem_clock_hz = None if mem is None else mem * 1e6
        r.utilization = None if util is None else util / 100.0
        for name in THROTTLE:
            if name in f:
                r.throttle = int(f[name])
                break
        if XID in f:
            xids[str(r.index)] = int(f[XID])
        readings.append(r)
    return readings, xids


class DcgmSource:
    """Reads a DCGM exporter page each interval. Owns its HTTP session."""

    name = "dcgm"

    def __init__(self, ep: Endpoint, timeout_s: float = DCGM_TIMEOUT_S) -> None:
        self.ep = ep
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._on_xid: XidCallback | None = None
        self._xid_last: dict[str, int] | None = None
        self._failing = False

    async def open(self, on_xid: XidCallback) -> bool:
        self._on_xid = on_xid
        self._session = aiohttp.ClientSession(trust_env=False)
        log.info("gpu_probe_started", source="dcgm", url=self.ep.shown)
        return True

    async def read(self) -> list[GpuReading] | None:
        if self._session is None:
            return None
        res = await fetch(self._session, self.ep, self.timeout_s)
        if not res.ok:
            self._failed(res.error or f"HTTP {res.status}")
            return None
        try:
            readings, xids = parse_dcgm(res.text)
        except ValueError as exc:
            self._failed(f"unparsable page: {str(exc)[:120]}")
            return None
        if not readings:
            self._failed("no DCGM_FI_DEV_* samples on the page")
            return None
        if self._failing:
            self._failing = False
            log.info("dcgm_scrape_recovered", url=self.ep.shown)
        self._xids(xids)
        return readings

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _failed(self, why: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning("dcgm_scrape_failed", url=self.ep.shown, error=why)

    def _xids(self, xids: dict[str, int]) -> None:
        last = self._xid_last
        self._xid_last = dict(xids)
        if last is None or self._on_xid is None:
            return  # the first page's values happened before soakd looked
        for gpu, code in xids.items():
            if code and code != last.get(gpu, 0):
                self._on_xid(gpu, code)
