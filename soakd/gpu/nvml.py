"""NVML room: ``NvmlSource``, a ``GpuSource`` that talks to the driver in the process that
runs it: ``soakd.gpu.sampler``, the NVML sampling process (or a test with a fake).

Through ``pynvml`` (imported lazily) or any object with the same function names
(``NvmlApi``: tests pass a fake). Every NVML call runs in a worker thread, never on the
event loop; XID events are waited for in a dedicated thread. A call a GPU does not
support (NotSupported, no permission, missing in this driver) is skipped for that GPU from
then on, logged once. No driver, no library or no GPU: ``open`` says so in one line and
returns False, and the rest of soakd carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from soakd.childlog import ChildLog
from soakd.gpu.procfs import MappedTarget, ProcessMap, ProcFs
from soakd.gpu.readings import GpuReading, XidCallback, error_text

log = ChildLog()

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


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


class NvmlSource:
    """GPU readings from NVML. Blocking calls only ever run in threads."""

    name = "nvml"

    def __init__(
        self,
        targets: Sequence[MappedTarget] = (),
        nvml: NvmlApi | None = None,
        procfs: ProcFs | None = None,
        *,
        required: bool = False,
    ) -> None:
        self.required = required  # gpu.source: nvml (not auto): an absent GPU is a warning
        self._nvml: Any = nvml
        self._procs = ProcessMap(targets, procfs)
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._names: list[str] = []
        self._skip: set[tuple[int, str]] = set()
        self._warned: set[tuple[int, str, str]] = set()
        self._mem_v1: set[int] = set()
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
            self._absent(error_text(exc))
            return False
        self._inited = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self._absent(error_text(exc))
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
            r.processes, r.vanished = self._procs.update(i, procs)
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
                    reason=error_text(exc),
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
                log.info("gpu_call_unsupported", gpu=i, call=skip_key[1], reason=error_text(exc))
            else:
                self._warn(i, skip_key[1], exc)
            return None

    def _warn(self, i: int, call: str, exc: BaseException) -> None:
        key = (i, call, type(exc).__name__)
        if key not in self._warned:
            self._warned.add(key)
            lost = _code(exc) == ERR_GPU_IS_LOST
            log.warning("gpu_call_failed", gpu=i, call=call, reason=error_text(exc), gpu_lost=lost)

    # --- XID events (their own thread) ---------------------------------------------------------

    def _xid_worker(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.info("gpu_xid_events_unsupported", reason=error_text(exc))
            return
        try:
            registered = 0
            for i, h in enumerate(self._handles):
                try:
                    nvml.nvmlDeviceRegisterEvents(h, NVML_EVENT_XID, event_set)
                    registered += 1
                except Exception as exc:
                    log.info("gpu_xid_events_unsupported", gpu=i, reason=error_text(exc))
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
                    log.info("gpu_xid_events_unsupported", reason=error_text(exc))
                    return
                failures += 1
                if failures == 1:
                    log.warning("gpu_xid_wait_failed", reason=error_text(exc))
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
