"""Gateway room, server: builds a gateway from its config, runs it, shuts it down.

``start_gateway`` is the async factory (port 0 picks a free port; ``url`` says which);
``run_gateway`` is what ``soakd gateway`` runs: until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from soakd import __version__
from soakd.config import GatewayConfig
from soakd.gateway.metrics import GatewayMetrics
from soakd.gateway.proxy import Gateway, make_app
from soakd.gateway.vram import VramWatch
from soakd.probes.gpu import make_gpu_source

log = structlog.get_logger()

TICK_S = 0.1
HEADER_BACKSTOP = 4
"""aiohttp's own per-line header limits are this many times ``max_header_bytes``: a
larger header is refused by the parser (400); below that the gateway's 431 is clearer."""


@dataclass
class GatewayServer:
    """A running gateway: ``url``, the ``gateway`` state (tests read it), ``aclose()``."""

    url: str
    gateway: Gateway
    _runner: web.AppRunner
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _watch: VramWatch | None = None

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watch is not None:
            await self._watch.aclose()
        await self._runner.cleanup()
        await self.gateway.aclose()


async def start_gateway(
    cfg: GatewayConfig,
    *,
    metrics: GatewayMetrics | None = None,
    admin_token: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> GatewayServer:
    """Start listening on ``cfg.listen`` with the VRAM watch and the housekeeping tick."""
    gw = Gateway(cfg, metrics or GatewayMetrics(), admin_token=admin_token, clock=clock)
    await gw.open()
    backstop = HEADER_BACKSTOP * cfg.limits.max_header_bytes
    runner = web.AppRunner(
        make_app(gw),
        access_log=None,
        shutdown_timeout=2.0,
        max_line_size=backstop,
        max_field_size=backstop,
    )
    try:
        await runner.setup()
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        await gw.aclose()
        raise
    port = runner.addresses[0][1]
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    server = GatewayServer(f"http://{host}:{port}", gw, runner)
    watch = VramWatch(
        make_gpu_source(cfg.gpu, dcgm_base=cfg.upstream),
        gw.on_vram,
        gw.m,
        interval=cfg.gpu.interval,
        gpu=cfg.vram_breaker.gpu,
        clock=clock,
    )
    server._watch = watch
    server._tasks = [
        asyncio.create_task(watch.run(), name="soakd-gateway-vram"),
        asyncio.create_task(_tick(gw), name="soakd-gateway-tick"),
    ]
    log.info(
        "gateway_listening",
        url=server.url,
        upstream=cfg.upstream,
        version=__version__,
        **gw.modes(),
    )
    return server


async def _tick(gw: Gateway) -> None:
    while True:
        try:
            gw.tick()
        except Exception:  # a bug here must not stop admission control
            log.exception("gateway_tick_failed")
        await asyncio.sleep(TICK_S)


async def run_gateway(cfg: GatewayConfig, admin_token: str | None = None) -> None:
    """Serve until SIGTERM / SIGINT, then close (in-flight streams get a short grace)."""
    server = await start_gateway(cfg, admin_token=admin_token)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.aclose()
        log.info("gateway_stopped", url=server.url)
