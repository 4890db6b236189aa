"""A fake NVML with pynvml's function names and error shape (tests/unit/test_probes_gpu.py),
and the same fake as a ``pynvml`` module (tests/fake_pynvml/) for the sampler process."""

from __future__ import annotations

import queue
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 1 << 30


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


NOT_SUPPORTED = 3
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
VERSION_MISMATCH = 25


@dataclass
class FakeGpu:
    index: int
    uuid: str = "GPU-0000"
    name: str = "NVIDIA H200"
    total: int = 141 * GIB
    used: int = 4 * GIB
    reserved: int = 512 << 20
    temp: int = 41
    power_mw: int = 118_500
    energy_mj: int = 1_000_000
    sm_mhz: int = 1980
    mem_mhz: int = 3201
    util: int = 37
    reasons: int = 0x1 | 0x4 | 0x200  # idle, sw power cap, and an unnamed bit
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    v2: bool = True


class FakeNvml:
    """The pynvml calls soakd makes, with the same names and error shape."""

    NVMLError = FakeNvmlError
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.xids: queue.Queue[tuple[int, int]] = queue.Queue()
        self.shutdown = False
        self.freed = False

    def _use(self, call: str, h: FakeGpu) -> FakeGpu:
        self.calls[call] += 1
        if call in h.unsupported:
            raise FakeNvmlError(NOT_SUPPORTED)
        return h

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._use("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return self._use("nvmlDeviceGetName", h).name.encode()  # older pynvml: bytes

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: Any = None) -> Any:
        self._use("nvmlDeviceGetMemoryInfo", h)
        if version is not None:
            if not h.v2:
                raise FakeNvmlError(VERSION_MISMATCH)
            free = h.total - h.used - h.reserved
            return SimpleNamespace(total=h.total, reserved=h.reserved, free=free, used=h.used)
        return SimpleNamespace(total=h.total, free=h.total - h.used, used=h.used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        self._use("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.procs]

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == 0
        return self._use("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._use("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._use("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        g = self._use("nvmlDeviceGetClockInfo", h)
        return g.sm_mhz if clock == 1 else g.mem_mhz

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        return SimpleNamespace(gpu=self._use("nvmlDeviceGetUtilizationRates", h).util, memory=5)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._use("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetFanSpeed(self, h: FakeGpu) -> int:  # datacenter cards: NotSupported
        raise FakeNvmlError(NOT_SUPPORTED)

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, es: str) -> None:
        assert types == 0x8

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> Any:
        try:
            gpu, xid = self.xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise FakeNvmlError(TIMEOUT) from None
        return SimpleNamespace(device=self.gpus[gpu], eventType=0x8, eventData=xid)

    def nvmlEventSetFree(self, es: str) -> None:
        self.freed = True
