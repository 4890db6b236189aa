"""Probes against real local HTTP servers on 127.0.0.1:0: restarts, health, OOM log, DCGM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from soakd.config import Config, config_from_dict
from soakd.metrics.run import ProbeMetrics
from soakd.model import ErrorKind, Outcome, Sample
from soakd.probes import Probes, make_probes
from tests.waiting import until

pytestmark = pytest.mark.integration

FAST = 0.05


class FakeServer:
    """/metrics and /health of a vLLM-like server whose answers the test changes."""

    def __init__(self, start_time: float | None = 1.7e9, metrics_text: str | None = None) -> None:
        self.start_time = start_time
        self.metrics_text = metrics_text
        self.health_status = 200
        self.running = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def page(self) -> str:
        if self.metrics_text is not None:
            return self.metrics_text
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.running}.0',
            "# TYPE process_resident_memory_bytes gauge",
            "process_resident_memory_bytes 1.2e+09",
        ]
        if self.start_time is not None:
            lines += [
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {self.start_time}",
            ]
        return "\n".join(lines) + "\n"

    async def start(self) -> None:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.page())

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=self.health_status)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@asynccontextmanager
async def running(probes: Probes) -> AsyncIterator[None]:
    task = asyncio.create_task(probes.run())
    try:
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await probes.aclose()


def scrapes(samples: list[Sample], target: str) -> int:
    """Successful scrapes of ``target`` so far (each one records the running gauge)."""
    labels = (("target", target),)
    return sum(s.name == "soakd_server_requests_running" and s.labels == labels for s in samples)


async def more_scrapes(samples: list[Sample], target: str, n: int = 5) -> None:
    """Wait for ``n`` more successful scrapes: long enough for anything a scrape would
    change (a restart counted twice, a pending restart confirmed) to have happened."""
    seen = scrapes(samples, target)
    await until(lambda: scrapes(samples, target) >= seen + n, what=f"{n} more scrapes")


def config(targets: list[dict[str, Any]], **gpu: Any) -> Config:
    return config_from_dict(
        {
            "targets": targets,
            "phases": [{"name": "p", "duration": "1m"}],
            "gpu": {"source": "none", **gpu},
            "probes": {"scrape_interval": FAST, "health_interval": FAST},
        }
    )


def setup(
    cfg: Config, urls: dict[str, str]
) -> tuple[Probes, CollectorRegistry, list[Sample], Callable[..., float | None]]:
    reg = CollectorRegistry()
    samples: list[Sample] = []
    probes = make_probes(cfg, ProbeMetrics(reg), urls, samples.append)

    def get(metric: str, **labels: str) -> float | None:
        return reg.get_sample_value(metric, labels)

    return probes, reg, samples, get


async def test_new_start_time_is_one_restart() -> None:
    server = FakeServer()
    await server.start()
    cfg = config([{"name": "vllm", "base_url": server.url + "/v1"}])  # /metrics at the root
    probes, _, samples, get = setup(cfg, {"vllm": server.url + "/v1"})
    try:
        async with running(probes):
            await until(lambda: get("soakd_server_start_time_seconds", target="vllm") == 1.7e9)
            server.running = 5
            server.start_time = 1.7e9 + 3600
            await until(lambda: get("soakd_target_restarts_total", target="vllm") == 1)
            await more_scrapes(samples, "vllm")
            assert get("soakd_target_restarts_total", target="vllm") == 1
            assert get("soakd_server_requests_running", target="vllm") == 5
            assert get("soakd_server_resident_memory_bytes", target="vllm") == 1.2e9
            assert get("soakd_target_up", target="vllm") == 1
            assert get("soakd_target_scrape_errors_total", target="vllm") == 0
    finally:
        await server.stop()
    names = {s.name for s in samples}
    assert {
        "soakd_target_up",
        "soakd_target_restarts_total",
        "soakd_target_oom_events_total",
        "soakd_server_requests_running",
    } <= names


@pytest.mark.parametrize("start_time", [None, 1.7e9], ids=["no-start-time", "start-time"])
async def test_down_then_up_is_one_restart(start_time: float | None) -> None:
    server = FakeServer(start_time=start_time)
    await server.start()
    cfg = config([{"name": "llama", "base_url": server.url}])
    probes, _, samples, get = setup(cfg, {"llama": server.url})
    try:
        async with running(probes):
            await until(lambda: get("soakd_target_up", target="llama") == 1)
            await server.stop()  # the process dies: connections refused
            await until(lambda: get("soakd_target_up", target="llama") == 0)
            # a scrape has failed (all its connect retries spent) before the new process
            await until(lambda: (get("soakd_target_scrape_errors_total", target="llama") or 0) >= 1)
            if start_time is not None:
                server.start_time = start_time + 100
            await server.start()  # same port, a new process
            await until(lambda: get("soakd_target_up", target="llama") == 1)
            await until(lambda: get("soakd_target_restarts_total", target="llama") == 1)
            await more_scrapes(samples, "llama")
            assert get("soakd_target_restarts_total", target="llama") == 1
            assert (get("soakd_target_scrape_errors_total", target="llama") or 0) >= 1
    finally:
        await server.stop()


async def test_unhealthy_is_down_but_no_restart_and_refused_requests_mark_down() -> None:
    server = FakeServer()
    await server.start()
    cfg = config([{"name": "t", "base_url": server.url}])
    probes, _, samples, get = setup(cfg, {"t": server.url})
    try:
        async with running(probes):
            await until(lambda: get("soakd_target_up", target="t") == 1)
            server.health_status = 503
            await until(lambda: get("soakd_target_up", target="t") == 0)
            server.health_status = 200
            await until(lambda: get("soakd_target_up", target="t") == 1)
            # a request refused between two health checks marks the target down at once
            probes.outcome_sink.record(
                Outcome(
                    target="t", phase="p", seq=0, scheduled_ns=0, error=ErrorKind.CONNECT_REFUSED
                )
            )
            assert get("soakd_target_up", target="t") == 0
            await until(lambda: get("soakd_target_up", target="t") == 1)
            await more_scrapes(samples, "t")
            # same start time throughout: neither the 503s nor the refused request restarted it
            assert get("soakd_target_restarts_total", target="t") == 0
    finally:
        await server.stop()


async def test_oom_log_and_error_body(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO old line\nCUDA out of memory (before soakd started)\n")
    cfg = config(
        [{"name": "vllm", "base_url": "http://127.0.0.1:9", "scrape": False, "oom_log": str(log)}]
    )
    probes, _, _, get = setup(cfg, {"vllm": "http://127.0.0.1:9"})
    ((_, tail),) = probes.tails
    async with running(probes):
        # the tail has opened the log (at its end: the line from before is not counted)
        await until(lambda: tail._id is not None)
        with log.open("a") as fh:
            fh.write(
                "INFO: 127.0.0.1 - POST /v1/chat/completions 200\n"
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            )
        await until(lambda: get("soakd_target_oom_events_total", target="vllm", source="log") == 1)
        probes.outcome_sink.record(
            Outcome(
                target="vllm",
                phase="p",
                seq=3,
                scheduled_ns=0,
                status=500,
                error=ErrorKind.HTTP_5XX,
                oom=True,
            )
        )
        assert get("soakd_target_oom_events_total", target="vllm", source="error_body") == 1
    assert get("soakd_target_oom_events_total", target="vllm", source="log") == 1


def dcgm_page(used_mib: int, energy_mj: int, xid: int) -> str:
    """What dcgm-exporter (and soakd's simulator) serves for one card."""
    lbl = (
        '{gpu="0",UUID="GPU-5ec5",pci_bus_id="00000000:01:00.0",device="nvidia0",'
        'modelName="Edge 4GB",Hostname="h"}'
    )
    rows = [
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", 1500),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 6001),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", 63),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", 41.5),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", energy_mj),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 87),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", xid),
        ("DCGM_FI_DEV_FB_FREE", "gauge", 4096 - used_mib),
        ("DCGM_FI_DEV_FB_USED", "gauge", used_mib),
    ]
    return "".join(f"# HELP {n} x\n# TYPE {n} {k}\n{n}{lbl} {v}\n" for n, k, v in rows)


async def test_dcgm_text_drives_the_gpu_gauges() -> None:
    server = FakeServer(metrics_text=dcgm_page(3500, 1_000_000, 0))
    await server.start()
    # gpu.source dcgm without dcgm_url: the first simulator target's /metrics
    cfg = config([{"name": "sim", "simulator": "edge-4gb"}], source="dcgm", interval=FAST)
    probes, _, samples, get = setup(cfg, {"sim": server.url})
    mib = 1 << 20
    try:
        async with running(probes):
            await until(lambda: get("soakd_gpu_memory_used_bytes", gpu="0") == 3500 * mib)
            assert get("soakd_gpu_probe_up", source="dcgm") == 1
            assert get("soakd_gpu_info", gpu="0", uuid="GPU-5ec5", name="Edge 4GB") == 1
            assert get("soakd_gpu_memory_free_bytes", gpu="0") == 596 * mib
            assert get("soakd_gpu_memory_total_bytes", gpu="0") == 4096 * mib
            assert get("soakd_gpu_temperature_celsius", gpu="0") == 63
            assert get("soakd_gpu_power_watts", gpu="0") == 41.5
            assert get("soakd_gpu_sm_clock_hertz", gpu="0") == 1500e6
            assert get("soakd_gpu_utilization_ratio", gpu="0") == pytest.approx(0.87)
            server.metrics_text = dcgm_page(3700, 1_250_000, 43)
            await until(lambda: get("soakd_gpu_memory_used_bytes", gpu="0") == 3700 * mib)
            assert get("soakd_gpu_energy_joules_total", gpu="0") == pytest.approx(250.0)
            assert get("soakd_gpu_memory_used_peak_bytes", gpu="0") == 3700 * mib
            assert get("soakd_gpu_xid_errors_total", gpu="0", xid="43") == 1
            await server.stop()  # the exporter goes away: the probe says so, nothing breaks
            await until(lambda: get("soakd_gpu_probe_up", source="dcgm") == 0)
    finally:
        await server.stop()
    assert any(s.name == "soakd_gpu_memory_used_bytes" and s.value == 3700 * mib for s in samples)


async def test_the_simulator_drives_the_gpu_and_server_gauges() -> None:
    """End to end with the embedded simulator: its DCGM and vllm:* names, soakd's gauges."""
    from soakd.profiles import get_profile
    from soakd.sim.server import start_sim

    profile = get_profile("edge-4gb")
    sim = await start_sim("127.0.0.1", 0, profile)
    cfg = config([{"name": "sim", "simulator": "edge-4gb"}], source="dcgm", interval=FAST)
    probes, _, _, get = setup(cfg, {"sim": sim.url})
    try:
        async with running(probes):
            await until(lambda: get("soakd_gpu_memory_used_bytes", gpu="0") is not None)
            await until(lambda: get("soakd_server_kv_cache_usage_ratio", target="sim") is not None)
            # its own loop; a health check that times out on a loaded box marks it down for
            # a moment: wait for it to be up rather than assert the instant's value
            await until(lambda: get("soakd_target_up", target="sim") == 1)
            total = get("soakd_gpu_memory_total_bytes", gpu="0")
            assert total == pytest.approx(profile.vram_total_mib * (1 << 20), rel=1e-3)
            used = get("soakd_gpu_memory_used_bytes", gpu="0")
            assert used == pytest.approx(profile.vram_used_mib * (1 << 20), rel=0.01)
            assert get("soakd_gpu_probe_up", source="dcgm") == 1
            assert get("soakd_gpu_temperature_celsius", gpu="0") is not None
            assert get("soakd_server_requests_running", target="sim") == 0
            assert get("soakd_server_start_time_seconds", target="sim") is not None
            # counted, and rare: a scrape can time out on a loaded 2-core CI box
            assert get("soakd_target_scrape_errors_total", target="sim") is not None
    finally:
        await sim.aclose()
