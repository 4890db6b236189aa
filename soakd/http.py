"""HTTP: soakd's own endpoints (/metrics, /healthz, /readyz, /status) in one aiohttp app.

Binds 127.0.0.1 by default; port 0 picks a free port and ``url`` tells which. Optional
basic auth (``exporter.basic_auth``) guards /metrics and /status; /healthz and /readyz
stay open (they tell nothing and serve container health checks). Optional TLS
(``exporter.tls``) serves it all over HTTPS.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from pydantic import SecretStr

from soakd.config import ConfigError, ExporterTls

StatusFn = Callable[[], dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _basic_auth(username: str, password: SecretStr) -> Any:
    user = username.encode()
    secret = password.get_secret_value().encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or _allowed(request.headers.get("Authorization", "")):
            return await handler(request)
        return web.Response(
            status=401,
            text="authentication required\n",
            headers={"WWW-Authenticate": 'Basic realm="soakd", charset="UTF-8"'},
        )

    def _allowed(header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given_user, _, given_pass = base64.b64decode(token, validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        # both compared in full, whatever the first says: no timing hint of either
        ok_user = hmac.compare_digest(given_user, user)
        ok_pass = hmac.compare_digest(given_pass, secret)
        return ok_user and ok_pass

    return check


def make_app(
    registry: CollectorRegistry,
    status: StatusFn,
    ready: Callable[[], bool],
    auth: tuple[str, SecretStr] | None = None,
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(status())

    middlewares = [_basic_auth(*auth)] if auth is not None else []
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    return app


def tls_context(tls: ExporterTls) -> ssl.SSLContext:
    """The server's TLS context from ``exporter.tls``; ConfigError naming the file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(
            f"exporter.tls: cannot load {tls.cert_file} / {tls.key_file}: {why}"
        ) from None
    return ctx


@dataclass
class HttpServer:
    runner: web.AppRunner
    url: str

    async def aclose(self) -> None:
        await self.runner.cleanup()


async def start_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    status: StatusFn,
    ready: Callable[[], bool],
    *,
    auth: tuple[str, SecretStr] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> HttpServer:
    runner = web.AppRunner(make_app(registry, status, ready, auth), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if ssl_context is not None else "http"
    return HttpServer(runner, f"{scheme}://{shown}:{bound}")
