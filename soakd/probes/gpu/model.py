"""Probes room, GPU model: the ``GpuSource`` seam that NVML (``nvml.py``), DCGM
(``dcgm.py``) and test fakes fill, and what a reading means.

Pure: the XID catalog and the throttle-reason bits. The reading's types live in
``soakd/gpu/readings.py`` (the NVML sampler process imports them without the probes) and
are re-exported here.
"""

from __future__ import annotations

from typing import Protocol

from soakd.gpu.readings import OTHER as OTHER
from soakd.gpu.readings import GpuReading as GpuReading
from soakd.gpu.readings import ProcMem as ProcMem
from soakd.gpu.readings import Vanished as Vanished
from soakd.gpu.readings import XidCallback as XidCallback
from soakd.gpu.readings import error_text as error_text
from soakd.metrics.run import THROTTLE_REASONS

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
