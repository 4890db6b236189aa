"""Probes room, GPU model: what a GPU source reads (``GpuReading``, in base units) and the
``GpuSource`` seam that NVML (``nvml.py``), DCGM (``dcgm.py``) and test fakes fill.

Pure: the XID catalog, the throttle-reason bits, and the types a reading is made of.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from soakd.metrics import THROTTLE_REASONS

OTHER = "other"
"""The ``target`` label of GPU processes that belong to no configured target."""

# Clock event ("throttle") reason bits -> THROTTLE_REASONS labels; other bits -> "other".
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clock"),
)
KNOWN_BITS = sum(bit for bit, _ in THROTTLE_BITS)
assert {r for _, r in THROTTLE_BITS} | {"other"} == set(THROTTLE_REASONS)

XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
MEMORY_XIDS = frozenset({31, 48, 63, 64, 92, 94, 95})
"""XIDs about device memory: faults and failing ECC, not out-of-memory (see oom.py)."""


@dataclass(frozen=True, slots=True)
class ProcMem:
    """A GPU process: its memory (None where NVML cannot tell) and its target."""

    pid: int
    used_bytes: float | None
    target: str


@dataclass(frozen=True, slots=True)
class Vanished:
    """A mapped GPU process that left NVML's list since the last reading."""

    pid: int
    target: str
    last_bytes: float | None
    alive: bool  # still running (it only released the GPU): not a vanished process


@dataclass(slots=True)
class GpuReading:
    """One GPU at one instant, in base units; None where the source could not say."""

    index: int
    uuid: str = ""
    name: str = ""
    total: float | None = None
    used: float | None = None
    free: float | None = None
    reserved: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    energy_j: float | None = None  # cumulative since some origin (driver load, boot)
    sm_clock_hz: float | None = None
    mem_clock_hz: float | None = None
    utilization: float | None = None  # 0-1
    throttle: int | None = None  # clock event reason bitmask
    processes: list[ProcMem] | None = None  # None: the source cannot list processes
    vanished: list[Vanished] = field(default_factory=list)


XidCallback = Callable[[str, int], None]
"""``(gpu label, xid code)``, always called on the event loop."""


class GpuSource(Protocol):
    """Where GPU readings come from (NVML, a DCGM exporter, the simulator's DCGM page)."""

    name: str

    async def open(self, on_xid: XidCallback) -> bool:
        """Start; False (after one log line) when there is nothing to read."""
        ...

    async def read(self) -> list[GpuReading] | None:
        """One reading per GPU, or None when this read failed."""
        ...

    async def aclose(self) -> None: ...


def error_text(exc: BaseException) -> str:
    """An exception as one short log field."""
    return (str(exc) or type(exc).__name__)[:200]
