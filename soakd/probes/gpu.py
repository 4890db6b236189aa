"""Probes room, GPU: a GpuSource (NVML here, DCGM in dcgm.py) sampled into soakd's GPU gauges.

Two halves behind the ``GpuSource`` seam:

- ``NvmlSource`` talks to the driver through ``pynvml`` (imported lazily) or any object
  with the same function names (``NvmlApi``: tests pass a fake). Every NVML call runs in
  a worker thread, never on the event loop; XID events are waited for in a dedicated
  thread. A call a GPU does not support (NotSupported, no permission, missing in this
  driver) is skipped for that GPU from then on, logged once.
- ``GpuProbe`` turns readings into gauges on the loop: memory (NVML's v2 ``used``
  excludes the driver's reserved memory, shown on its own), peak, robust leak slopes,
  per-process memory mapped to targets, energy as counter increments, throttle reasons.

No driver, no library or no GPU: ``soakd_gpu_probe_up{source="nvml"}`` is 0, one line is
logged, and the rest of soakd carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from soakd.config import TargetConfig
from soakd.metrics import THROTTLE_REASONS, ProbeMetrics
from soakd.model import Sample
from soakd.probes._ticks import sleep_until_next
from soakd.probes.leak import LeakSlope

log = structlog.get_logger()

OTHER = "other"
"""The ``target`` label of GPU processes that belong to no configured target."""

# nvml.h constants: part of the driver's ABI, so fakes need not define them.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_TIMEOUT = 10
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_ARGUMENT_VERSION_MISMATCH = 25
ERR_DEPRECATED = 26
SKIP_CODES = frozenset(
    {
        ERR_NOT_SUPPORTED,
        ERR_NO_PERMISSION,
        ERR_FUNCTION_NOT_FOUND,
        ERR_ARGUMENT_VERSION_MISMATCH,
        ERR_DEPRECATED,
    }
)
XID_WAIT_MS = 500

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
_KNOWN_BITS = sum(bit for bit, _ in THROTTLE_BITS)
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


class NvmlApi(Protocol):
    """The NVML calls soakd makes, named as in ``pynvml``: the module itself fits, and so
    does a small fake. Optional calls (older fallbacks) are looked up by name."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> Any: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


class ProcFs(Protocol):
    """What the process -> target mapping reads about a PID (``/proc`` on Linux)."""

    def cmdline(self, pid: int) -> str: ...
    def ppid(self, pid: int) -> int | None: ...
    def alive(self, pid: int) -> bool: ...


class LinuxProcFs:
    """``/proc``: command line (and comm), parent PID, and whether a PID still runs."""

    def cmdline(self, pid: int) -> str:
        parts = []
        for name in ("cmdline", "comm"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/{name}", "rb") as fh:
                parts.append(fh.read(4096).replace(b"\0", b" ").decode(errors="replace"))
        return " ".join(parts)

    def ppid(self, pid: int) -> int | None:
        fields = self._stat(pid)
        return int(fields[1]) if fields and len(fields) > 1 else None

    def alive(self, pid: int) -> bool:
        """Running, and not a zombie waiting to be reaped."""
        fields = self._stat(pid)
        return bool(fields) and fields[0] not in ("Z", "X")

    @staticmethod
    def _stat(pid: int) -> list[str]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                text = fh.read().decode(errors="replace")
        except OSError:
            return []
        return text.rpartition(")")[2].split()  # after "(comm)": state, ppid, ...


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


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


def _err(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:200]


class NvmlSource:
    """GPU readings from NVML. Blocking calls only ever run in threads."""

    name = "nvml"

    def __init__(
        self,
        targets: Sequence[TargetConfig] = (),
        nvml: NvmlApi | None = None,
        procfs: ProcFs | None = None,
        *,
        required: bool = False,
    ) -> None:
        self.required = required  # gpu.source: nvml (not auto): an absent GPU is a warning
        self._nvml: Any = nvml
        self._proc: ProcFs = procfs if procfs is not None else LinuxProcFs()
        self._targets = [t for t in targets if t.pid is not None or t.process_name]
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._names: list[str] = []
        self._skip: set[tuple[int, str]] = set()
        self._warned: set[tuple[int, str, str]] = set()
        self._mem_v1: set[int] = set()
        self._known: dict[int, dict[int, ProcMem]] = {}
        self._mapped: dict[int, str] = {}
        self._lock = threading.Lock()  # reads and shutdown never overlap
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._inited = False
        self._on_xid: XidCallback | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def open(self, on_xid: XidCallback) -> bool:
        self._loop = asyncio.get_running_loop()
        self._on_xid = on_xid
        if not await asyncio.to_thread(self._open_sync):
            return False
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._xid_worker,),
            name="soakd-nvml-xid",
            daemon=True,
        )
        self._thread.start()
        return True

    async def read(self) -> list[GpuReading] | None:
        return await asyncio.to_thread(self.read_sync)

    async def aclose(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, 4 * XID_WAIT_MS / 1000)
            if thread.is_alive():
                log.warning("gpu_xid_thread_stuck", note="NVML left initialised")
                return
        if self._inited:
            await asyncio.to_thread(self._shutdown)

    def _open_sync(self) -> bool:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                self._absent("nvidia-ml-py not installed")
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError: no library, no driver
            self._absent(_err(exc))
            return False
        self._inited = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self._absent(_err(exc))
            self._shutdown()
            return False
        if not self._handles:
            self._absent("the driver sees no GPU")
            self._shutdown()
            return False
        for i, h in enumerate(self._handles):
            self._uuids.append(_text(self._call(i, "nvmlDeviceGetUUID", h)))
            self._names.append(_text(self._call(i, "nvmlDeviceGetName", h)))
        log.info(
            "gpu_probe_started",
            source="nvml",
            gpus=[
                f"{i}: {n} {u}"
                for i, (n, u) in enumerate(zip(self._names, self._uuids, strict=True))
            ],
        )
        return True

    def _absent(self, reason: str) -> None:
        """The one line saying why there is no GPU reading (a warning when NVML was asked for)."""
        (log.warning if self.required else log.info)(
            "gpu_probe_absent", source="nvml", reason=reason
        )

    def _shutdown(self) -> None:
        with self._lock:
            if self._inited:
                self._inited = False
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()

    # --- one reading (in a worker thread) ----------------------------------------------------

    def read_sync(self) -> list[GpuReading] | None:
        with self._lock:
            if not self._inited:
                return None
            return [self._read_gpu(i, h) for i, h in enumerate(self._handles)]

    def _read_gpu(self, i: int, h: Any) -> GpuReading:
        r = GpuReading(i, self._uuids[i], self._names[i])
        mem = self._memory(i, h)
        if mem is not None:
            r.total = float(mem.total)
            r.used = float(mem.used)
            r.free = float(mem.free)
            reserved = getattr(mem, "reserved", None)
            r.reserved = None if reserved is None else float(reserved)
        if (v := self._call(i, "nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)) is not None:
            r.temperature_c = float(v)
        if (v := self._call(i, "nvmlDeviceGetPowerUsage", h)) is not None:
            r.power_w = float(v) / 1000.0  # mW
        if (v := self._call(i, "nvmlDeviceGetTotalEnergyConsumption", h)) is not None:
            r.energy_j = float(v) / 1000.0  # mJ
        if (v := self._call(i, "nvmlDeviceGetClockInfo", h, NVML_CLOCK_SM, key="sm")) is not None:
            r.sm_clock_hz = float(v) * 1e6  # MHz
        if (v := self._call(i, "nvmlDeviceGetClockInfo", h, NVML_CLOCK_MEM, key="mem")) is not None:
            r.mem_clock_hz = float(v) * 1e6
        if (v := self._call(i, "nvmlDeviceGetUtilizationRates", h)) is not None:
            r.utilization = float(v.gpu) / 100.0
        v = self._first(
            i,
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            h,
        )
        if v is not None:
            r.throttle = int(v)
        procs = self._first(
            i,
            ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
            h,
        )
        if procs is not None:
            r.processes, r.vanished = self._processes(i, procs)
        return r

    def _memory(self, i: int, h: Any) -> Any:
        """v2 (total, reserved, free, used) where the driver has it, else v1 (no reserved)."""
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        if v2 is not None and i not in self._mem_v1:
            try:
                return self._nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
            except Exception as exc:
                if _code(exc) not in SKIP_CODES and not isinstance(exc, TypeError):
                    self._warn(i, "nvmlDeviceGetMemoryInfo", exc)
                    return None
                self._mem_v1.add(i)
                log.info(
                    "gpu_memory_info_v1",
                    gpu=i,
                    reason=_err(exc),
                    note="no reserved memory reading on this driver",
                )
        return self._call(i, "nvmlDeviceGetMemoryInfo", h)

    def _first(self, i: int, names: tuple[str, ...], h: Any) -> Any:
        """The first of several equivalent calls this GPU and library support."""
        for name in names:
            if (i, name) in self._skip:
                continue
            value = self._call(i, name, h)
            if value is not None or (i, name) not in self._skip:
                return value
        return None

    def _call(self, i: int, name: str, *args: Any, key: str = "") -> Any:
        """One NVML call; None when it failed. Unsupported calls are skipped from then on."""
        skip_key = (i, f"{name}({key})" if key else name)
        if skip_key in self._skip:
            return None
        try:
            return getattr(self._nvml, name)(*args)
        except Exception as exc:  # NVMLError and its subclasses
            if (
                _code(exc) in SKIP_CODES
                or isinstance(exc, AttributeError | TypeError)
                or type(exc).__name__ == "NVMLLibraryMismatchError"
            ):
                self._skip.add(skip_key)
                log.info("gpu_call_unsupported", gpu=i, call=skip_key[1], reason=_err(exc))
            else:
                self._warn(i, skip_key[1], exc)
            return None

    def _warn(self, i: int, call: str, exc: BaseException) -> None:
        key = (i, call, type(exc).__name__)
        if key not in self._warned:
            self._warned.add(key)
            lost = _code(exc) == ERR_GPU_IS_LOST
            log.warning("gpu_call_failed", gpu=i, call=call, reason=_err(exc), gpu_lost=lost)

    # --- processes -----------------------------------------------------------------------------

    def _processes(self, i: int, procs: Any) -> tuple[list[ProcMem], list[Vanished]]:
        current: dict[int, ProcMem] = {}
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            used_f = None if used is None else float(used)
            prev = current.get(pid)
            if prev is not None:  # several contexts of one process: add them up
                if used_f is not None:
                    used_f += prev.used_bytes or 0.0
                elif prev.used_bytes is not None:
                    used_f = prev.used_bytes
            current[pid] = ProcMem(pid, used_f, self._target_of(pid))
        vanished = []
        for pid, old in self._known.get(i, {}).items():
            if pid not in current:
                vanished.append(Vanished(pid, old.target, old.used_bytes, self._proc.alive(pid)))
                self._mapped.pop(pid, None)
        self._known[i] = current
        return list(current.values()), vanished

    def _target_of(self, pid: int) -> str:
        """A configured pid that is the process or its ancestor, else a process_name found
        in its (or an ancestor's) command line. Matches are kept while the PID lives;
        misses are re-read, since servers rename their processes after start."""
        cached = self._mapped.get(pid)
        if cached is not None:
            return cached
        if not self._targets:
            return OTHER
        lineage = [pid]
        p: int | None = pid
        for _ in range(32):
            p = self._proc.ppid(p) if p is not None else None
            if p is None or p <= 1 or p in lineage:
                break
            lineage.append(p)
        for t in self._targets:
            if t.pid is not None and t.pid in lineage:
                self._mapped[pid] = t.name
                return t.name
        cmdlines: list[str] | None = None
        for t in self._targets:
            if not t.process_name:
                continue
            if cmdlines is None:
                cmdlines = [self._proc.cmdline(x).lower() for x in lineage]
            needle = t.process_name.lower()
            if any(needle in c for c in cmdlines):
                self._mapped[pid] = t.name
                return t.name
        return OTHER

    # --- XID events (their own thread) ---------------------------------------------------------

    def _xid_worker(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.info("gpu_xid_events_unsupported", reason=_err(exc))
            return
        try:
            registered = 0
            for i, h in enumerate(self._handles):
                try:
                    nvml.nvmlDeviceRegisterEvents(h, NVML_EVENT_XID, event_set)
                    registered += 1
                except Exception as exc:
                    log.info("gpu_xid_events_unsupported", gpu=i, reason=_err(exc))
            if registered:
                self._wait_xids(event_set)
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlEventSetFree(event_set)

    def _wait_xids(self, event_set: Any) -> None:
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        failures = 0
        while not self._stop.is_set():
            try:
                data = wait(event_set, XID_WAIT_MS)
            except Exception as exc:
                if _code(exc) == ERR_TIMEOUT:
                    continue
                if _code(exc) in SKIP_CODES or isinstance(exc, AttributeError | TypeError):
                    log.info("gpu_xid_events_unsupported", reason=_err(exc))
                    return
                failures += 1
                if failures == 1:
                    log.warning("gpu_xid_wait_failed", reason=_err(exc))
                self._stop.wait(1.0)
                continue
            try:
                gpu = str(int(nvml.nvmlDeviceGetIndex(data.device)))
            except Exception:
                gpu = "unknown"
            self._deliver(gpu, int(data.eventData))

    def _deliver(self, gpu: str, code: int) -> None:
        loop, cb = self._loop, self._on_xid
        if loop is None or cb is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(cb, gpu, code)


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


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
                log.warning("gpu_read_failed", source=self.source.name, reason=_err(exc))
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
                "soakd_gpu_xid_errors_total",
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
            (r.used, m.mem_used, "soakd_gpu_memory_used_bytes"),
            (r.temperature_c, m.temperature, "soakd_gpu_temperature_celsius"),
            (r.power_w, m.power, "soakd_gpu_power_watts"),
        ):
            if value is not None:
                gauge.labels(g).set(value)
                out.append(Sample(wall, name, value, lg))
        if r.used is not None:
            peak = max(self.peak.get(g, 0.0), r.used)
            self.peak[g] = peak
            m.mem_peak.labels(g).set(peak)
            slope = self._slope((g, ""), now, r.used)
            m.leak_window_fill.labels(g).set(self._slopes[(g, "")].fill_ratio)
            if slope is not None:
                m.leak_slope.labels(g).set(slope)
                out.append(Sample(wall, "soakd_gpu_memory_leak_slope_bytes_per_hour", slope, lg))
        if r.energy_j is not None:
            last = self._energy_last.get(g)
            self._energy_last[g] = r.energy_j
            energy = m.energy.labels(g)  # zero from the first reading, not absent
            if last is not None and r.energy_j >= last:  # smaller: the driver reloaded
                delta = r.energy_j - last
                energy.inc(delta)
                self._energy_total[g] = self._energy_total.get(g, 0.0) + delta
            self._energy_total.setdefault(g, 0.0)
            out.append(Sample(wall, "soakd_gpu_energy_joules_total", self._energy_total[g], lg))
        if r.throttle is not None:
            for bit, reason in THROTTLE_BITS:
                m.throttle.labels(g, reason).set(1 if r.throttle & bit else 0)
            m.throttle.labels(g, "other").set(1 if r.throttle & ~_KNOWN_BITS else 0)
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
            out.append(Sample(wall, "soakd_gpu_process_memory_bytes", value, labels))
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
                    Sample(
                        wall, "soakd_gpu_process_memory_leak_slope_bytes_per_hour", slope, labels
                    )
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
