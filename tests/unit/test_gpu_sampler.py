"""NVML read in a sampling process of its own (soakd/gpu/sampler.py): the readings, the
XIDs and the log lines come back, soakd's own process never loads pynvml, a sampler that
dies is started again, and ``gpu: {source: none}`` starts nothing. The sampler runs with
a stand-in pynvml (tests/fake_pynvml/), as this machine has no GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from soakd.config import TargetConfig
from soakd.metrics.run import ProbeMetrics
from soakd.model import Sample
from soakd.probes.gpu import GpuProbe, NvmlSampler
from soakd.probes.gpu import nvml as sampler_mod
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_pynvml"
GIB = 1 << 30


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The sampler (a child: it inherits the environment) imports the stand-in pynvml."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), str(ROOT)]))
    return monkeypatch


async def test_readings_xids_and_log_lines_come_from_the_sampler(
    fake_nvml: pytest.MonkeyPatch,
) -> None:
    fake_nvml.setenv("FAKE_NVML_XID", "0:79")
    fake_nvml.setenv("FAKE_NVML_USED", str(6 * GIB))
    fake_nvml.setenv("FAKE_NVML_PROC", f"{os.getpid()}:{2 * GIB}")
    xids: list[tuple[str, int]] = []
    target = TargetConfig(name="vllm", base_url="http://127.0.0.1:1", pid=os.getpid())
    source = NvmlSampler([target], required=True)
    reg, samples = CollectorRegistry(), list[Sample]()
    probe = GpuProbe(source, ProbeMetrics(reg), samples.append, interval=0.05, leak_window_s=60)
    with capture_logs() as logs:
        assert await source.open(lambda gpu, code: xids.append((gpu, code)))
        try:
            assert source.pid not in (None, os.getpid())
            readings = await source.read()
            assert readings is not None
            (r,) = readings
            assert (r.index, r.uuid, r.name) == (0, "GPU-0000", "NVIDIA H200")
            assert (r.used, r.total, r.power_w) == (6 * GIB, 141 * GIB, 118.5)
            assert r.processes is not None
            assert [(p.pid, p.used_bytes, p.target) for p in r.processes] == [
                (os.getpid(), 2 * GIB, "vllm")
            ]
            probe.apply(readings)
            get = reg.get_sample_value
            assert get("soakd_gpu_memory_used_bytes", {"gpu": "0"}) == 6 * GIB
            assert get("soakd_gpu_process_memory_bytes", {"gpu": "0", "target": "vllm"}) == 2 * GIB
            await until(lambda: xids, what="the XID")
            assert xids == [("0", 79)]
        finally:
            pid = source.pid
            await source.aclose()
    assert [e["event"] for e in logs if e["event"].startswith("gpu_")] == ["gpu_probe_started"]
    assert pid is not None
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(pid, 0)
    assert "pynvml" not in sys.modules  # the driver was only ever in the sampler


async def test_no_gpu_is_one_line_and_the_sampler_is_gone(fake_nvml: pytest.MonkeyPatch) -> None:
    fake_nvml.setenv("FAKE_NVML_GPUS", "0")
    source = NvmlSampler(required=False)
    with capture_logs() as logs:
        assert not await source.open(lambda gpu, code: None)
    absent = [e for e in logs if e["event"] == "gpu_probe_absent"]
    assert [(e["log_level"], e["reason"]) for e in absent] == [("info", "the driver sees no GPU")]
    assert source.pid is None
    assert await source.read() is None
    await source.aclose()


async def test_a_sampler_that_dies_is_logged_and_started_again(
    fake_nvml: pytest.MonkeyPatch,
) -> None:
    fake_nvml.setattr(sampler_mod, "RESTART_S", 0.0)
    source = NvmlSampler()
    assert await source.open(lambda gpu, code: None)
    first = source.pid
    assert first is not None
    try:
        with capture_logs() as logs:
            os.kill(first, signal.SIGKILL)
            await until(lambda: any(e["event"] == "gpu_sampler_exited" for e in logs))
            readings = await source.read()  # a new sampler, at once (RESTART_S is 0 here)
        assert readings is not None
        assert readings[0].uuid == "GPU-0000"
        assert source.pid not in (None, first)
    finally:
        await source.aclose()


SCRIPT = """
import asyncio, json, sys
from prometheus_client import CollectorRegistry
from soakd.config import config_from_dict
from soakd.metrics.run import ProbeMetrics
from soakd.probes import make_probes
from tests.waiting import until

async def main(source):
    cfg = config_from_dict({
        "targets": [{"name": "t", "base_url": "http://127.0.0.1:9", "scrape": False}],
        "gpu": {"source": source, "interval": "0.1s"},
        "phases": [{"name": "p", "duration": "1s", "load": {"mode": "closed", "concurrency": 1}}],
    })
    reg = CollectorRegistry()
    emitted = []
    probes = make_probes(cfg, ProbeMetrics(reg), {}, emitted.append)
    task = asyncio.create_task(probes.run())
    # every probe loop started (the journal's sends its first samples at once) and, with a
    # GPU probe, its first reading came through the sampler
    await until(lambda: emitted and (probes.gpu is None or reg.get_sample_value(
        "soakd_gpu_memory_used_bytes", {"gpu": "0"})), what="the probes' first readings")
    sampler = getattr(probes.gpu.source, "pid", None) if probes.gpu else None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await probes.aclose()
    print(json.dumps({
        "gpu_probe": probes.gpu is not None,
        "sampler": sampler is not None,
        "used": reg.get_sample_value("soakd_gpu_memory_used_bytes", {"gpu": "0"}),
        "pynvml": "pynvml" in sys.modules,
    }))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("source", ["none", "auto"])
def test_soakd_itself_never_loads_nvml(fake_nvml: pytest.MonkeyPatch, source: str) -> None:
    """``none``: no GPU probe, no sampler; ``auto``: the readings come from the sampler. In
    both, soakd's own process never imports pynvml (nor opens the driver)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), source],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if source == "none":
        assert got == {"gpu_probe": False, "sampler": False, "used": None, "pynvml": False}
    else:  # the stand-in's reading, through the sampler
        assert got == {"gpu_probe": True, "sampler": True, "used": 4 * GIB, "pynvml": False}
