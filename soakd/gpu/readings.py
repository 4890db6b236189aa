"""GPU readings room: what a GPU source reads (``GpuReading``, in base units) and the parts
it is made of. Pure; the NVML sampler process sends them as JSON (``to_doc``/``from_doc``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

OTHER = "other"
"""The ``target`` label of GPU processes that belong to no configured target."""


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

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> GpuReading:
        procs = doc.get("processes")
        return cls(
            **{k: v for k, v in doc.items() if k not in ("processes", "vanished")},
            processes=None if procs is None else [ProcMem(**p) for p in procs],
            vanished=[Vanished(**v) for v in doc.get("vanished", ())],
        )


XidCallback = Callable[[str, int], None]
"""``(gpu label, xid code)``, always called on the event loop."""


def error_text(exc: BaseException) -> str:
    """An exception as one short log field."""
    return (str(exc) or type(exc).__name__)[:200]
