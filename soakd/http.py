"""HTTP: soakd's own endpoints (/metrics, /healthz, /readyz, /status) in one aiohttp app.

The app runs on its own thread and event loop: a send loop saturated on purpose (a soak
past capacity) must not make Prometheus' scrapes time out, or a container health check
restart a soakd that is working. What it serves is what the run loop published: the
values of prometheus_client's metrics (locked; the loop sets the gauges, none is a
callback into the run), the copies soakd's own collectors serve (latency histograms, the
gateways' re-export: frozen, swapped whole), and for /status, /readyz and /healthz the
``Published`` value on the ``Board`` (soakd/run/status.py's ``RunState``, once a tick),
swapped in as one reference. No handler calls back into the run's objects: the
journal's queue depth too is a value, set by the link thread that drains the queue
(soakd/journal/link.py). ``/healthz`` says 503 when the run loop has stopped turning (its
last tick is too old).

Binds 127.0.0.1 by default; port 0 picks a free port and ``url`` tells which. Optional
basic auth (``exporter.basic_auth``) guards /metrics and /status; /healthz and /readyz
stay open (they tell nothing and serve container health checks). Optional TLS
(``exporter.tls``) serves it all over HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import errno
import hmac
import ipaddress
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from pydantic import SecretStr

from soakd.config import ConfigError, Exporter
from soakd.net import parse_host_port

log = structlog.get_logger()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Published(Protocol):
    """What the exporter serves of the run: a value the run loop built whole and never
    changes after (read on the exporter's thread)."""

    @property
    def ready(self) -> bool:
        """/readyz: 200 when true."""
        ...

    def status_doc(self) -> dict[str, Any]:
        """/status's JSON document."""
        ...

    def stalled(self) -> str | None:
        """/healthz: None while the run loop turns, else why it says 503."""
        ...


class Board:
    """The last ``Published`` value: the run loop ``publish``es a new one whole; the
    exporter's thread reads ``last``, one reference (the old value or the new, never
    half of either)."""

    __slots__ = ("last",)

    def __init__(self, first: Published) -> None:
        self.last = first

    def publish(self, value: Published) -> None:
        self.last = value


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
    registry: CollectorRegistry, board: Board, auth: tuple[str, SecretStr] | None = None
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        stalled = board.last.stalled()
        if stalled:
            return web.Response(status=503, text=f"{stalled}\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if board.last.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(board.last.status_doc())

    middlewares = [_basic_auth(*auth)] if auth is not None else []
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status", status_handler)
    return app


@dataclass
class HttpServer:
    url: str
    _thread: _ServerThread

    async def aclose(self) -> None:
        await asyncio.to_thread(self._thread.stop)


class _ServerThread(threading.Thread):
    """An event loop of its own serving one aiohttp app until ``stop``."""

    def __init__(
        self, app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None
    ) -> None:
        super().__init__(name="soakd-exporter", daemon=True)
        self._app, self._host, self._port, self._ssl = app, host, port, ssl_context
        self.loop = asyncio.new_event_loop()
        self.bound: concurrent.futures.Future[int] = concurrent.futures.Future()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self._app, access_log=None)
        try:
            port = self.loop.run_until_complete(self._bind(runner))
        except BaseException as exc:
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()
            self.bound.set_exception(exc)
            return
        self.bound.set_result(port)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(runner.cleanup())
            self.loop.close()

    async def _bind(self, runner: web.AppRunner) -> int:
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, ssl_context=self._ssl)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    def stop(self) -> None:
        if self.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.join()


async def start_http(
    host: str,
    port: int,
    registry: CollectorRegistry,
    board: Board,
    *,
    auth: tuple[str, SecretStr] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> HttpServer:
    """Serve the app on its own thread; returns once bound (OSError when it cannot)."""
    thread = _ServerThread(make_app(registry, board, auth), host, port, ssl_context)
    thread.start()
    bound = await asyncio.wrap_future(thread.bound)
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if ssl_context is not None else "http"
    return HttpServer(f"{scheme}://{shown}:{bound}", thread)


async def start_exporter(
    exp: Exporter,
    metrics_addr: str | None,
    registry: CollectorRegistry,
    board: Board,
) -> HttpServer:
    """The run's exporter on ``metrics_addr`` (the CLI's) or ``exporter.listen``, with its
    basic auth and TLS; a port it cannot bind is a ConfigError naming the setting."""
    host, port = parse_host_port(metrics_addr or exp.listen)
    auth = (exp.basic_auth.username, exp.basic_auth.password()) if exp.basic_auth else None
    if auth is None and not _loopback(host):
        log.warning(
            "exporter_exposed",
            host=host,
            note="/metrics and /status answer anyone who can reach this address; "
            "set exporter.basic_auth (and exporter.tls) or bind 127.0.0.1",
        )
    try:
        return await start_http(
            host,
            port,
            registry,
            board,
            auth=auth,
            ssl_context=exp.tls.context() if exp.tls else None,
        )
    except OSError as exc:
        where = "--metrics-addr" if metrics_addr else "exporter.listen"
        why = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        hint = " (another soakd running?)" if exc.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"{where}: cannot listen on {host}:{port}: {why}{hint}") from None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
