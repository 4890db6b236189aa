"""Gateway room, proxy: the aiohttp reverse proxy and its admission control.

Every POST (the generation endpoints) passes, in order: the header and body size limits,
the VRAM breaker (429), the error-rate breaker (503), and a concurrency slot (queued up
to a bound; 429 when the queue is full, 503 when the wait times out). GETs (models,
health) only pass the size limits. The answer is streamed back chunk by chunk as the
upstream sends it: SSE is never buffered. The gateway's own answers are OpenAI-shaped
errors with a ``code`` naming the reason, and never carry a request's content.

The gateway's own paths: ``/healthz``, ``/metrics``, ``/gateway/status`` and, with an
admin token, ``PUT /gateway/modes``; everything else goes to the upstream.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from collections.abc import Callable
from typing import Any, Final

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client.aiohttp import make_aiohttp_handler
from pydantic import ValidationError

from soakd import __version__
from soakd.config import GatewayConfig, GatewayModes
from soakd.gateway.breaker import Admit, ErrorRateBreakerState, State, VramBreakerState
from soakd.gateway.concurrency import AimdLimit, Limiter
from soakd.gateway.metrics import GatewayMetrics
from soakd.model import GATEWAY_ORIGIN_HEADER, status_class
from soakd.targets.framing import HttpProcessingError
from soakd.targets.pool import NewestFirstConnector

log = structlog.get_logger()

HOP_BY_HOP: Final = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})  # fmt: skip
OWN_PATHS: Final = ("/healthz", "/metrics", "/gateway/status", "/gateway/modes")
READ_CHUNK: Final = 64 << 10
AUTO_HEADERS: Final = ("Accept-Encoding", "User-Agent", "Content-Type")
"""Headers aiohttp would add on its own (compression the client never asked for...)."""


def error_response(
    status: int, code: str, message: str, *, retry_after_s: float | None = None
) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {message, type, param, code}}``, marked as the
    gateway's own answer (``GATEWAY_ORIGIN_HEADER``): soakd counts the load it sheds apart from the
    server's failures, and a cloud's 503 with a look-alike code is never taken for it."""
    kind = {
        429: "rate_limit_exceeded",
        503: "service_unavailable",
        502: "upstream_error",
        504: "upstream_timeout",
    }.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    headers = {GATEWAY_ORIGIN_HEADER: "gateway"}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return web.json_response(body, status=status, headers=headers)


class Gateway:
    """The state behind one gateway: breakers, limiter, controller, upstream session."""

    def __init__(
        self,
        cfg: GatewayConfig,
        metrics: GatewayMetrics,
        *,
        admin_token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.m = metrics
        self.clock = clock
        self._admin_token = admin_token
        now = clock()
        self.vram = VramBreakerState(cfg.vram_breaker, self._transition)
        self.errors = ErrorRateBreakerState(cfg.error_breaker, self._transition)
        conc = cfg.concurrency
        self.adaptive = conc.adaptive
        self.aimd = AimdLimit(conc, now, self._limit_changed)
        self.limiter = Limiter(
            self.aimd.limit if self.adaptive else conc.limit, conc.queue, self.aimd.saturated
        )
        self.upstream = cfg.upstream
        self._session: aiohttp.ClientSession | None = None
        self._vram_over_logged = False
        m = metrics
        m.limit.set(self.limiter.limit)
        m.latency_target.set(conc.target_p95)
        m.vram_limit.set(cfg.vram_breaker.limit_bytes)
        m.vram_lower.set(cfg.vram_breaker.lower_mark)
        m.in_flight.set_function(lambda: self.limiter.in_flight)
        m.queue_depth.set_function(lambda: self.limiter.queued)
        self._features()

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        limits = self.cfg.limits
        self._session = aiohttp.ClientSession(
            connector=NewestFirstConnector(limit=0),  # shrinks after a burst
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=limits.connect_timeout),
            auto_decompress=False,  # bytes pass through as they came
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- state changes ----------------------------------------------------------------------

    def on_vram(self, now: float, used: float | None) -> None:
        """A VRAM reading (VramWatch)."""
        before = self.vram.above_since
        self.vram.reading(now, used)
        if used is not None and before is None and self.vram.above_since is not None:
            log.info(
                "gateway_vram_above_limit",
                used_bytes=used,
                limit_bytes=self.vram.limit,
                hold_s=self.vram.hold,
                breaker=self.vram.state.value,
            )

    def tick(self) -> None:
        """Housekeeping, every ~100 ms: the error breaker's open time, the controller."""
        now = self.clock()
        self.errors.tick(now)
        if self.adaptive:
            new = self.aimd.tick(now)
            if new is not None:
                self.limiter.set_limit(new)
                self.m.limit.set(new)
            if self.aimd.last_p95 is not None:
                self.m.ttfb_p95.set(self.aimd.last_p95)

    def set_modes(self, modes: GatewayModes) -> dict[str, bool]:
        now = self.clock()
        if modes.vram_breaker is not None:
            self.vram.set_enabled(modes.vram_breaker, now)
        if modes.error_breaker is not None:
            self.errors.set_enabled(modes.error_breaker, now)
        if modes.adaptive is not None and modes.adaptive != self.adaptive:
            self.adaptive = modes.adaptive
            static = self.cfg.concurrency.limit
            self.aimd.reset(now, static)
            limit = self.aimd.limit if self.adaptive else static
            self.limiter.set_limit(limit)
            self.m.limit.set(limit)
        state = self.modes()
        log.info("gateway_modes_changed", **state)
        self._features()
        return state

    def modes(self) -> dict[str, bool]:
        return {
            "vram_breaker": self.vram.enabled,
            "error_breaker": self.errors.enabled,
            "adaptive": self.adaptive,
        }

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "upstream": self.upstream,
            "modes": self.modes(),
            "vram": {
                "state": self.vram.state.value,
                "used_bytes": self.vram.used,
                "limit_bytes": self.vram.limit,
                "lower_mark_bytes": self.vram.lower,
            },
            "error_rate": {
                "state": self.errors.state.value,
                "ratio": round(self.errors.ratio, 4),
                "requests": int(self.errors.requests),
            },
            "concurrency": {
                "limit": self.limiter.limit,
                "in_flight": self.limiter.in_flight,
                "queued": self.limiter.queued,
                "p95_s": self.aimd.last_p95,
            },
        }

    def _features(self) -> None:
        for name, on in self.modes().items():
            self.m.feature.labels(name).set(1 if on else 0)

    def _transition(self, breaker: str, before: State, to: State, why: dict[str, Any]) -> None:
        self.m.set_breaker(breaker, to.value)
        event = {
            State.OPEN: "gateway_breaker_opened",
            State.HALF_OPEN: "gateway_breaker_half_open",
            State.CLOSED: "gateway_breaker_closed",
        }[to]
        (log.warning if to is State.OPEN else log.info)(
            event, breaker=breaker, previous=before.value, **why
        )

    def _limit_changed(self, old: int, new: int, p95_s: float | None) -> None:
        self.m.limit_changes.labels("up" if new > old else "down").inc()
        log.info(
            "gateway_concurrency_limit_changed",
            old=old,
            new=new,
            p95_ttfb_s=None if p95_s is None else round(p95_s, 4),
            target_s=self.cfg.concurrency.target_p95,
        )

    # --- requests ---------------------------------------------------------------------------

    def _reject(
        self, status: int, reason: str, message: str, retry_after_s: float | None = None
    ) -> web.Response:
        self.m.rejections.labels(reason).inc()
        return error_response(status, reason, message, retry_after_s=retry_after_s)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        limits = self.cfg.limits
        header_bytes = sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
        if header_bytes > limits.max_header_bytes:
            return self._reject(
                431,
                "headers_too_large",
                f"request headers are {header_bytes} bytes; the gateway takes "
                f"at most {limits.max_header_bytes}",
            )
        body = await self._read_body(request)
        if body is None:
            return self._reject(
                413, "body_too_large", f"request body over {limits.max_body_bytes} bytes"
            )
        if request.method != "POST":
            resp, _ = await self._forward(request, body, admitted=False)
            return resp
        now = self.clock()
        probes: list[VramBreakerState | ErrorRateBreakerState] = []
        vram = self.vram.admit(now)
        if vram is Admit.NO:
            return self._reject(
                429,
                "vram_breaker_open",
                "the server's GPU memory is over its limit; retry later",
                self.vram.retry_after_s(now),
            )
        if vram is Admit.PROBE:
            probes.append(self.vram)
        errors = self.errors.admit(now)
        if errors is Admit.NO:
            self._unprobe(probes)
            return self._reject(
                503,
                "error_breaker_open",
                "the upstream is failing too often; retry later",
                self.errors.retry_after_s(now),
            )
        if errors is Admit.PROBE:
            probes.append(self.errors)
        waited = self.clock()
        try:
            why = await self.limiter.acquire(self.cfg.concurrency.queue_timeout)
        except BaseException:
            self._unprobe(probes)
            raise
        if why is not None:
            self._unprobe(probes)
            if why == "queue_full":
                return self._reject(
                    429, "queue_full", "the gateway's queue is full; retry later", 1.0
                )
            return self._reject(
                503, "queue_timeout", "no slot for the request in time; retry later", 1.0
            )
        self.m.queue_wait.observe(self.clock() - waited)
        ok = False
        try:
            resp, ok = await self._forward(request, body, admitted=True)
            return resp
        finally:
            self.limiter.release()
            done = self.clock()
            for breaker in probes:
                breaker.probe_done(done, ok)

    @staticmethod
    def _unprobe(probes: list[VramBreakerState | ErrorRateBreakerState]) -> None:
        """The probe never reached the upstream: the next request may probe instead."""
        for breaker in probes:
            breaker.release_probe()

    async def _read_body(self, request: web.Request) -> bytes | None:
        limit = self.cfg.limits.max_body_bytes
        if (request.content_length or 0) > limit:
            return None
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await request.content.read(READ_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
        return b"".join(parts)

    async def _forward(
        self, request: web.Request, body: bytes, *, admitted: bool
    ) -> tuple[web.StreamResponse, bool]:
        """Send upstream and stream the answer back as it comes. Returns the response and
        whether the upstream did its part (answered below 500, the whole body)."""
        assert self._session is not None
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
        )
        url = self.upstream + request.raw_path
        passing = _Passing(self.clock())
        try:
            async with (
                asyncio.timeout(self.cfg.limits.total_timeout),
                self._session.request(
                    request.method,
                    url,
                    data=body or None,
                    headers=headers,
                    allow_redirects=False,
                    skip_auto_headers=AUTO_HEADERS,  # only what the client sent
                ) as up,
            ):
                await self._pass_back(request, up, passing, admitted)
        except TimeoutError:
            return self._failed(
                request,
                passing,
                "timeout",
                admitted,
                504,
                "upstream_timeout",
                "the upstream did not answer in time",
            )
        except aiohttp.ClientConnectorError:
            return self._failed(
                request,
                passing,
                "connect",
                admitted,
                502,
                "upstream_unreachable",
                "cannot connect to the upstream",
            )
        except (aiohttp.ClientResponseError, HttpProcessingError):  # soakd/targets/framing.py
            return self._failed(
                request,
                passing,
                "protocol",
                admitted,
                502,
                "upstream_protocol_error",
                "the upstream's HTTP could not be parsed",
            )
        except aiohttp.ClientError:
            return self._failed(
                request,
                passing,
                "truncated",
                admitted,
                502,
                "upstream_error",
                "the upstream closed the connection",
            )
        assert passing.resp is not None
        self.m.duration.observe(self.clock() - passing.start)
        ok = passing.client_gone or passing.status < 500
        if admitted:
            self.errors.result(self.clock(), failed=not ok)
        return passing.resp, ok

    def _failed(
        self,
        request: web.Request,
        passing: _Passing,
        kind: str,
        admitted: bool,
        status: int,
        code: str,
        message: str,
    ) -> tuple[web.StreamResponse, bool]:
        self.m.upstream_errors.labels(kind).inc()
        if admitted:
            self.errors.result(self.clock(), failed=True)
        if passing.resp is not None:  # already streaming: pass the cut on, never an end
            if request.transport is not None:
                request.transport.close()
            return passing.resp, False
        return error_response(status, code, message), False

    async def _pass_back(
        self, request: web.Request, up: aiohttp.ClientResponse, passing: _Passing, admitted: bool
    ) -> None:
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for key, value in up.headers.items():
            if key.lower() not in HOP_BY_HOP:
                resp.headers.add(key, value)
        if up.content_length is not None:
            resp.content_length = up.content_length
        self.m.responses.labels(status_class(up.status)).inc()
        passing.status = up.status
        await resp.prepare(request)
        passing.resp = resp
        first = True
        try:
            async for chunk in up.content.iter_any():
                if first:
                    first = False
                    ttfb = self.clock() - passing.start
                    self.m.ttfb.observe(ttfb)
                    if admitted and self.adaptive and up.status < 400:
                        self.aimd.sample(ttfb)
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionResetError:
            passing.client_gone = True  # the client left; the upstream request closes with us


class _Passing:
    """One proxied request's progress, for the error paths."""

    __slots__ = ("client_gone", "resp", "start", "status")

    def __init__(self, start: float) -> None:
        self.start = start
        self.resp: web.StreamResponse | None = None
        self.status = 0
        self.client_gone = False


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def make_app(gw: Gateway) -> web.Application:
    """The gateway's aiohttp app: its own paths, then the proxy for everything else."""

    async def status(_: web.Request) -> web.Response:
        return web.json_response(gw.status())

    async def modes(request: web.Request) -> web.Response:
        token = gw._admin_token
        if not token:
            return error_response(404, "not_found", "no admin token configured")
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), token.encode()):
            return error_response(401, "invalid_admin_token", "wrong or missing admin token")
        try:
            wanted = GatewayModes.model_validate(json.loads(await request.read() or b"{}"))
        except (ValueError, ValidationError):
            return error_response(
                400,
                "bad_modes",
                'expected JSON like {"vram_breaker": '
                'true, "error_breaker": true, "adaptive": false}',
            )
        return web.json_response(gw.set_modes(wanted))

    app = web.Application(client_max_size=gw.cfg.limits.max_body_bytes)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", make_aiohttp_handler(gw.m.registry))
    app.router.add_get("/gateway/status", status)
    app.router.add_put("/gateway/modes", modes)
    app.router.add_route("*", "/{tail:.*}", gw.handle)
    return app
