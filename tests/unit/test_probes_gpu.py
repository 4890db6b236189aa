"""GPU probe with a fake NVML: sampling, absent GPU, unsupported calls, XIDs, process mapping."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.config import TargetConfig
from soakd.metrics.run import ProbeMetrics
from soakd.model import Sample
from soakd.probes.gpu import GpuProbe, NvmlSource
from soakd.probes.oom import OomWatch
from tests.fake_nvml import (
    LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
)
from tests.waiting import until

GIB = 1 << 30


class FakeProc:
    def __init__(self, procs: dict[int, tuple[int, str]], dead: set[int] | None = None) -> None:
        self.procs = procs  # pid -> (ppid, cmdline)
        self.dead = dead if dead is not None else set()

    def cmdline(self, pid: int) -> str:
        return self.procs.get(pid, (0, ""))[1]

    def ppid(self, pid: int) -> int | None:
        return self.procs[pid][0] if pid in self.procs else None

    def alive(self, pid: int) -> bool:
        return pid in self.procs and pid not in self.dead


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def value(reg: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return reg.get_sample_value(metric, labels)


def make(
    nvml: FakeNvml,
    targets: list[TargetConfig] | None = None,
    proc: FakeProc | None = None,
    **kw: Any,
) -> tuple[NvmlSource, GpuProbe, CollectorRegistry, list[Sample], Clock]:
    reg = CollectorRegistry()
    samples: list[Sample] = []
    clock = Clock()
    source = NvmlSource(targets or [], nvml=nvml, procfs=proc or FakeProc({}))
    probe = GpuProbe(
        source,
        ProbeMetrics(reg),
        samples.append,
        interval=0.05,
        leak_window_s=kw.pop("leak_window_s", 600.0),
        clock=clock,
        **kw,
    )
    return source, probe, reg, samples, clock


def test_sampling_fills_the_gauges_in_base_units() -> None:
    nvml = FakeNvml([FakeGpu(0)])
    source, probe, reg, samples, clock = make(nvml)
    assert source._open_sync()
    probe.apply(source.read_sync())
    g = {"gpu": "0"}
    assert value(reg, "soakd_gpu_probe_up", source="nvml") == 1
    assert value(reg, "soakd_gpu_info", gpu="0", uuid="GPU-0000", name="NVIDIA H200") == 1
    assert value(reg, "soakd_gpu_memory_total_bytes", **g) == 141 * GIB
    assert value(reg, "soakd_gpu_memory_used_bytes", **g) == 4 * GIB
    assert value(reg, "soakd_gpu_memory_reserved_bytes", **g) == 512 << 20
    assert value(reg, "soakd_gpu_memory_free_bytes", **g) == 141 * GIB - 4 * GIB - (512 << 20)
    assert value(reg, "soakd_gpu_temperature_celsius", **g) == 41
    assert value(reg, "soakd_gpu_power_watts", **g) == pytest.approx(118.5)
    assert value(reg, "soakd_gpu_sm_clock_hertz", **g) == 1980e6
    assert value(reg, "soakd_gpu_memory_clock_hertz", **g) == 3201e6
    assert value(reg, "soakd_gpu_utilization_ratio", **g) == pytest.approx(0.37)
    throttle = {
        r: value(reg, "soakd_gpu_throttle_active", gpu="0", reason=r)
        for r in ("gpu_idle", "sw_power_cap", "hw_thermal", "other")
    }
    assert throttle == {"gpu_idle": 1, "sw_power_cap": 1, "hw_thermal": 0, "other": 1}
    # energy: the first reading is the baseline, then increments (mJ -> J)
    assert value(reg, "soakd_gpu_energy_joules_total", **g) == 0
    nvml.gpus[0].energy_mj += 2500
    nvml.gpus[0].used = 6 * GIB
    clock.t += 1
    probe.apply(source.read_sync())
    assert value(reg, "soakd_gpu_energy_joules_total", **g) == pytest.approx(2.5)
    nvml.gpus[0].used = 5 * GIB
    probe.apply(source.read_sync())
    assert value(reg, "soakd_gpu_memory_used_bytes", **g) == 5 * GIB
    assert value(reg, "soakd_gpu_memory_used_peak_bytes", **g) == 6 * GIB
    names = {s.name for s in samples}
    assert {
        "soakd_gpu_memory_used_bytes",
        "soakd_gpu_temperature_celsius",
        "soakd_gpu_power_watts",
        "soakd_gpu_energy_joules_total",
    } <= names
    energy = [s for s in samples if s.name == "soakd_gpu_energy_joules_total"]
    assert energy[-1].value == pytest.approx(2.5)
    assert energy[-1].labels == (("gpu", "0"),)


def test_leak_slope_of_total_vram() -> None:
    nvml = FakeNvml([FakeGpu(0)])
    source, probe, reg, _, clock = make(nvml, leak_window_s=600.0)
    assert source._open_sync()
    for i in range(700):  # 100 MB per hour for 700 s
        clock.t = 1000.0 + i
        nvml.gpus[0].used = int(3e9 + 100e6 * i / 3600)
        probe.apply(source.read_sync())
    slope = value(reg, "soakd_gpu_memory_leak_slope_bytes_per_hour", gpu="0")
    assert slope == pytest.approx(100e6, rel=0.01)


async def test_absent_gpu_is_one_gauge_and_one_line() -> None:
    _source, probe, reg, samples, _ = make(FakeNvml([], init_error=LIBRARY_NOT_FOUND))
    with capture_logs() as logs:
        await asyncio.wait_for(probe.run(), 2)  # returns: nothing to sample
        await probe.aclose()
    assert value(reg, "soakd_gpu_probe_up", source="nvml") == 0
    assert [e["event"] for e in logs] == ["gpu_probe_absent"]
    assert samples == []


async def test_no_gpu_under_a_driver_is_absent_too() -> None:
    nvml = FakeNvml([])
    _source, probe, reg, _, _ = make(nvml)
    with capture_logs() as logs:
        await asyncio.wait_for(probe.run(), 2)
    assert value(reg, "soakd_gpu_probe_up", source="nvml") == 0
    assert [e["event"] for e in logs] == ["gpu_probe_absent"]
    assert nvml.shutdown


def test_unsupported_calls_are_skipped_and_logged_once() -> None:
    gpu = FakeGpu(0, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"})
    nvml = FakeNvml([gpu, FakeGpu(1, uuid="GPU-1111")])
    source, probe, reg, _, _ = make(nvml)
    with capture_logs() as logs:
        assert source._open_sync()
        for _ in range(5):
            probe.apply(source.read_sync())
    unsupported = [e for e in logs if e["event"] == "gpu_call_unsupported"]
    assert sorted((e["gpu"], e["call"]) for e in unsupported) == [
        (0, "nvmlDeviceGetPowerUsage"),
        (0, "nvmlDeviceGetTotalEnergyConsumption"),
    ]
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1 + 5  # GPU 0 once, GPU 1 every time
    assert value(reg, "soakd_gpu_power_watts", gpu="0") is None
    assert value(reg, "soakd_gpu_power_watts", gpu="1") == pytest.approx(118.5)
    assert value(reg, "soakd_gpu_temperature_celsius", gpu="0") == 41
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]


def test_memory_info_falls_back_to_v1() -> None:
    nvml = FakeNvml([FakeGpu(0, v2=False)])
    source, probe, reg, _, _ = make(nvml)
    with capture_logs() as logs:
        assert source._open_sync()
        probe.apply(source.read_sync())
        probe.apply(source.read_sync())
    assert value(reg, "soakd_gpu_memory_used_bytes", gpu="0") == 4 * GIB
    assert value(reg, "soakd_gpu_memory_reserved_bytes", gpu="0") is None
    assert [e["event"] for e in logs].count("gpu_memory_info_v1") == 1


async def test_xid_events_are_counted_by_code() -> None:
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1, uuid="GPU-1111")])
    source, probe, reg, samples, _ = make(nvml)
    task = asyncio.create_task(probe.run())
    for gpu, xid in ((0, 79), (0, 79), (1, 31)):
        nvml.xids.put((gpu, xid))
    await until(
        lambda: value(reg, "soakd_gpu_xid_errors_total", gpu="1", xid="31"), what="XID events"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await probe.aclose()
    assert value(reg, "soakd_gpu_xid_errors_total", gpu="0", xid="79") == 2
    assert value(reg, "soakd_gpu_xid_errors_total", gpu="1", xid="31") == 1
    assert nvml.freed
    assert nvml.shutdown
    assert source._thread is not None
    assert not source._thread.is_alive()
    xid = [s for s in samples if s.name == "soakd_gpu_xid_errors_total"]
    assert xid[-1].labels == (("gpu", "1"), ("xid", "31"))
    # the codes soakd knows exist at 0 from the first reading: "no XID" is a value
    assert value(reg, "soakd_gpu_xid_errors_total", gpu="0", xid="13") == 0


def test_processes_map_to_targets_and_vanish() -> None:
    targets = [
        TargetConfig(name="vllm", base_url="http://127.0.0.1:8000", pid=100),
        TargetConfig(name="llama", base_url="http://127.0.0.1:8080", process_name="llama-server"),
    ]
    proc = FakeProc(
        {
            100: (1, "python -m vllm.entrypoints.openai.api_server"),
            101: (100, "VLLM::EngineCore"),  # the engine is a child of the configured pid
            200: (1, "/opt/llama/llama-server -m tiny.gguf --metrics"),
            300: (1, "python train.py"),
        }
    )
    gpu = FakeGpu(0, procs=[(101, 3 * GIB), (200, 1 * GIB), (300, 2 * GIB), (301, None)])
    nvml = FakeNvml([gpu])
    reg = CollectorRegistry()
    metrics = ProbeMetrics(reg)
    oom = OomWatch(metrics, ["vllm", "llama"], lambda s: None)
    source = NvmlSource(targets, nvml=nvml, procfs=proc)
    probe = GpuProbe(
        source,
        metrics,
        lambda s: None,
        interval=0.05,
        leak_window_s=600,
        on_vanished=oom.process_vanished,
    )
    assert source._open_sync()
    probe.apply(source.read_sync())

    def proc_mem(target: str) -> float | None:
        return value(reg, "soakd_gpu_process_memory_bytes", gpu="0", target=target)

    assert proc_mem("vllm") == 3 * GIB
    assert proc_mem("llama") == 1 * GIB
    assert proc_mem("other") == 2 * GIB  # 300, and 301 whose memory NVML cannot tell

    # the engine dies (gone from /proc); llama-server only releases the GPU (still running)
    proc.dead.add(101)
    gpu.procs = [(300, 2 * GIB)]
    with capture_logs() as logs:
        probe.apply(source.read_sync())
    assert proc_mem("vllm") == 0
    assert proc_mem("llama") == 0
    assert (
        value(reg, "soakd_target_oom_events_total", target="vllm", source="process_vanished") == 1
    )
    assert (
        value(reg, "soakd_target_oom_events_total", target="llama", source="process_vanished") == 0
    )
    vanished = next(e for e in logs if e["event"] == "oom_event")
    assert vanished["pid"] == 101
    assert vanished["last_gpu_memory_bytes"] == 3 * GIB
    assert any(e["event"] == "gpu_process_left" and e["pid"] == 200 for e in logs)
