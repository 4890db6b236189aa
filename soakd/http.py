"""HTTP: soakd's own endpoints (/metrics, /healthz, /readyz, /status) in one aiohttp app.

Binds 127.0.0.1 by default; port 0 picks a free port and ``url`` tells which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

StatusFn = Callable[[], dict[str, Any]]


def make_app(registry: CollectorRegistry, status: StatusFn, ready: Callable[[], bool]) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(status())

    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    return app


@dataclass
class HttpServer:
    runner: web.AppRunner
    url: str

    async def aclose(self) -> None:
        await self.runner.cleanup()


async def start_http(
    host: str, port: int, registry: CollectorRegistry, status: StatusFn, ready: Callable[[], bool]
) -> HttpServer:
    runner = web.AppRunner(make_app(registry, status, ready), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host
    return HttpServer(runner, f"http://{shown}:{bound}")
