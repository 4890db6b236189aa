"""Targets room, OpenAI client: one RequestSpec becomes one Outcome over aiohttp.

Talks ``/v1/chat/completions`` or ``/v1/completions``, streamed (SSE) or not, and
records named instants into the Outcome as bytes arrive. Every failure is data
(``Outcome.error``); ``send`` only raises ``CancelledError``, after recording it, and
``NotSent`` for a request that never left soakd: too late for its instant, or one the
client refuses to build (a header or URL that cannot go on the wire, a body that is not
JSON): counted with its reason (``invalid_request``), never an outcome the server did
not see. The config refuses all of these first (``soakd check``); this is the last line.

Secrets: the API key lives in the session's default headers and in a ``SecretStr``
used to scrub; no repr, log line, exception text or ``error_detail`` carries it, and
error details are built from sanitized fields (OpenAI ``error.type``/``code``),
never from a body or an exception message (``errors.py``).
"""

from __future__ import annotations

import asyncio
import time
from json import dumps, loads
from typing import Any, Final, NoReturn

import aiohttp
import structlog
from aiohttp import (
    BasicAuth,
    ClientSession,
    ClientTimeout,
    DummyCookieJar,
)
from pydantic import SecretStr
from yarl import URL

from soakd.config import TargetConfig
from soakd.model import GATEWAY_ORIGIN_HEADER, ErrorKind, MissReason, Outcome, RequestSpec
from soakd.net import env_proxy, header_problem, url_problem
from soakd.targets.errors import (
    ERROR_BODY,
    clean,
    client_error,
    error_fields,
    exc_name,
    parse_error_name,
    redact,
    retry_after,
    status_kind,
)
from soakd.targets.framing import HttpProcessingError, overrun
from soakd.targets.headers import target_headers
from soakd.targets.pool import NewestFirstConnector, OnLearn
from soakd.targets.sse import SSEDecoder, SSEError, SSELineTooLong
from soakd.targets.stream import (
    NO_BOUNDS,
    Bounds,
    Fault,
    StreamParser,
    answer_text,
    apply_usage,
    choice_text,
    idle_cut,
    served_by,
    settle_usage,
)
from soakd.tracing import HEADER as TRACEPARENT
from soakd.tracing import traceparent, wants_traceparent
from soakd.types import NotSent
from soakd.workload.answers import asked_whole, target_asks
from soakd.workload.build import GIVEN, Builds

__all__ = ["ERROR_BODY_LIMIT", "JSON_BODY_LIMIT", "OpenAITarget", "open_target"]

log = structlog.get_logger()

ERROR_BODY_LIMIT: Final = 4096
"""Bytes of an error body read for its type/code and OOM words; the rest is dropped."""
JSON_BODY_LIMIT: Final = 8 << 20
"""Largest non-streamed response body accepted (TOO_LARGE above)."""
DRAIN_GRACE_S: Final = 1.0
"""After ``[DONE]``, how long to wait for the body's end so the connection is reused."""

_perf_ns = time.perf_counter_ns
# Keys soakd itself controls: extra_body must not desynchronize the parser or the prompt.
_RESERVED = ("stream", "messages", "prompt")


class OpenAITarget:
    """A Target speaking the OpenAI API. Build it with ``open_target``; one aiohttp
    session (connection pool) per target, closed by ``aclose``."""

    def __init__(
        self,
        cfg: TargetConfig,
        session: ClientSession,
        *,
        proxy: URL | None = None,
        proxy_auth: BasicAuth | None = None,
        secret: SecretStr | None = None,
        run_id: str | None = None,
        refused: str | None = None,
        builder: Builds = GIVEN,
    ) -> None:
        self.name = cfg.name
        self._builder = builder  # makes each spec's text (GIVEN: the spec's own prompt)
        # why every request would be refused before it is written (open_target's check of
        # the headers and URL); None: they can go on the wire
        self._refused = refused
        self._refusal_logged = False
        # the run id the traceparent is derived from; None: no traceparent (soakd/tracing.py)
        self._trace_run = run_id if run_id is not None and wants_traceparent(cfg) else None
        self._session = session
        # its connection pool, kept past the session's close: what it learned (pool.py)
        connector = session.connector
        self.pool = connector if isinstance(connector, NewestFirstConnector) else None
        self._url = URL(cfg.endpoint)
        self._endpoint = cfg.endpoint
        self._chat = cfg.api == "chat"
        self._stream = cfg.stream
        self._model = cfg.model
        self._ttft_s = cfg.timeouts.ttft
        self._idle_s = cfg.timeouts.idle
        self._total_s = cfg.timeouts.total
        self._proxy = proxy
        self._proxy_auth = proxy_auth
        self._secret = secret  # only to scrub details; the header is in the session
        self._factor = cfg.max_output_factor
        extra = {k: v for k, v in cfg.extra_body.items() if k not in _RESERVED}
        # extra_body's own output cap, which wins over the workload's on the wire
        caps = [extra.get(k) for k in ("max_tokens", "max_completion_tokens")]
        self._max_tokens = max((c for c in caps if type(c) is int and c > 0), default=None)
        for key in sorted(set(cfg.extra_body) - set(extra)):
            log.warning("extra_body_key_ignored", target=cfg.name, key=key)
        fixed: dict[str, Any] = {"stream": cfg.stream}
        if cfg.stream:
            opts = extra.pop("stream_options", None)
            more = opts if isinstance(opts, dict) else {}
            fixed["stream_options"] = {"include_usage": True, **more}
        fixed.update(extra)  # extra_body wins over soakd's defaults (max_tokens, ...)
        self._fixed = fixed
        # how a planned answer length is asked for whole (soakd/workload/answers.py)
        self._asks = target_asks(cfg)

    def __repr__(self) -> str:
        return (
            f"OpenAITarget(name={self.name!r}, endpoint={self._endpoint!r}, "
            f"stream={self._stream}, proxy={self._proxy is not None})"
        )

    async def aclose(self) -> None:
        await self._session.close()

    async def get(
        self, url: str, timeout_s: float, limit: int = ERROR_BODY_LIMIT
    ) -> tuple[int, bytes]:
        """GET ``url`` with this target's key, TLS and proxy: (status, at most ``limit``
        bytes of the body). For the preflight's models list; raises aiohttp's errors and
        TimeoutError (the caller words them with ``client_error``)."""
        async with (
            asyncio.timeout(timeout_s),
            self._session.get(
                url,
                headers={"Accept": "application/json"},
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
                allow_redirects=False,
            ) as resp,
        ):
            body = await resp.content.read(limit)
            return resp.status, body

    def body(self, spec: RequestSpec) -> bytes:
        """The request body for ``spec``: JSON, the config's extra_body merged in."""
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
        }
        if spec.output_planned:  # the planned length, whole (soakd/workload/answers.py)
            body.update(asked_whole(self._asks, spec.max_tokens))
        if spec.seed is not None:  # a check's: the same answer each time
            body["seed"] = spec.seed
        body.update(self._fixed)
        if self._chat:
            body["messages"] = self._builder.messages(spec)
        else:
            body["prompt"] = self._builder.text(spec)
        return dumps(body).encode()

    async def send(self, spec: RequestSpec, outcome: Outcome | None = None) -> Outcome:
        """Send one request and return its Outcome; never raises except CancelledError,
        and ``NotSent(late)`` before anything is sent when ``spec.deadline_ns`` has passed.

        ``outcome`` (from ``Outcome.planned``) is filled in place when given, so a caller
        that cancels still holds the CANCELLED record.

        Sent once, never again: a connection the server had closed is never handed out
        (soakd/targets/pool.py), and a request that fails after it was written was read by
        the server, so it is an outcome (a second send would hide the server's failure).
        """
        if spec.deadline_ns and _perf_ns() > spec.deadline_ns:
            raise NotSent(MissReason.LATE)  # too late to be this instant's send: counted, not sent
        if self._refused is not None:
            self._refuse(self._refused)
        out = outcome if outcome is not None else Outcome.planned(spec)
        try:
            payload = self.body(spec)
        except (TypeError, ValueError) as exc:  # an extra_body that json cannot encode
            self._refuse(f"the body is not JSON ({type(exc).__name__})")
        run = self._trace_run
        hdrs = None if run is None else {TRACEPARENT: traceparent(run, spec.target, spec.seq)}
        bounds = Bounds.of(self._factor, self._max_tokens or spec.max_tokens, len(payload))
        await self._attempt(out, payload, self._session, hdrs, bounds, spec.keep_answer)
        self._finish(out)
        return out

    def _refuse(self, cause: str) -> NoReturn:
        """NotSent(invalid_request): the request cannot be built, so no server saw it."""
        if not self._refusal_logged:
            self._refusal_logged = True
            log.error(
                "request_not_buildable",
                target=self.name,
                cause=cause,
                counted_as=MissReason.INVALID_REQUEST,
            )
        raise NotSent(MissReason.INVALID_REQUEST)

    async def _attempt(
        self,
        out: Outcome,
        payload: bytes,
        session: ClientSession,
        headers: dict[str, str] | None = None,
        bounds: Bounds = NO_BOUNDS,
        keep: bool = False,
    ) -> None:
        """The request on ``session``; fills ``out`` (its answer's text too when ``keep``)."""
        loop = asyncio.get_running_loop()
        stream = self._stream
        cm: asyncio.Timeout | None = None
        try:
            # One deadline, measured from the send: the ttft one until the first token
            # (streams only: a plain response has no first token before its end), then
            # the total one. Both include waiting for a pooled connection and connecting,
            # so a ttft below timeouts.connect turns a slow connect into TIMEOUT_TTFT.
            start = loop.time()
            total_at = start + self._total_s
            if stream and self._ttft_s < self._total_s:
                cm = asyncio.timeout_at(start + self._ttft_s)
                resched_at: float | None = total_at
            else:
                cm = asyncio.timeout_at(total_at)
                resched_at = None
            out.wall_start = time.time()
            out.sent_ns = _perf_ns()
            async with (
                cm,
                session.post(
                    self._url,
                    data=payload,
                    headers=headers,
                    proxy=self._proxy,
                    proxy_auth=self._proxy_auth,
                    allow_redirects=False,
                ) as resp,
            ):
                out.status = status = resp.status
                if status >= 300:
                    await self._read_error(resp, out)
                elif stream:
                    parser = StreamParser(
                        out, self._chat, cm, resched_at, self._idle_s, total_at, bounds, keep
                    )
                    try:
                        await self._read_stream(resp, out, parser)
                    finally:
                        parser.keep_answer()
                else:
                    await self._read_json(resp, out, bounds, keep)
        except asyncio.CancelledError:
            self._fail(out, ErrorKind.CANCELLED, "cancelled")
            self._finish(out)
            raise
        except TimeoutError as exc:
            # Ours (the single deadline), or aiohttp's sock_connect timeout.
            if cm is not None and cm.expired():
                if out.end_ns == 0:  # else it cut the drain after [DONE]: a success
                    ttft = stream and out.first_token_ns is None and self._ttft_s < self._total_s
                    if ttft:
                        self._fail(out, ErrorKind.TIMEOUT_TTFT, f"no token in {self._ttft_s:g}s")
                    elif idle_cut(out, self._idle_s, total_at):
                        self._fail(out, ErrorKind.TIMEOUT_IDLE, f"silent for {self._idle_s:g}s")
                    else:
                        self._fail(out, ErrorKind.TIMEOUT_TOTAL, f"over {self._total_s:g}s")
            elif isinstance(exc, aiohttp.ServerTimeoutError):  # only sock_connect is set
                self._fail(out, ErrorKind.TIMEOUT_CONNECT, "connect timed out")
            else:
                self._fail(out, ErrorKind.CLIENT_ERROR, exc_name(exc))
        except aiohttp.InvalidURL:  # the request or proxy URL: refused before any connection
            self._refuse("aiohttp refused the URL (InvalidURL)")
        except aiohttp.ClientError as exc:
            kind, detail = client_error(exc, out.status != 0)
            self._fail(out, kind, detail)
        except HttpProcessingError as exc:  # the parser, through a reader (framing.py)
            self._fail(out, ErrorKind.PROTOCOL_ERROR, parse_error_name(exc))
        except ValueError as exc:
            # aiohttp wraps every failure on the wire in a ClientError: a bare ValueError
            # before any answer is the request refused as it was built (a header with a
            # control character...), never written
            if out.status or out.first_byte_ns is not None:
                self._fail(out, ErrorKind.CLIENT_ERROR, type(exc).__name__)
            else:
                self._refuse(f"aiohttp refused to write the request ({type(exc).__name__})")
        except Exception as exc:  # a bug or an unforeseen library error: still data
            self._fail(out, ErrorKind.CLIENT_ERROR, type(exc).__name__)

    # --- readers -------------------------------------------------------------------------

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, out: Outcome, p: StreamParser
    ) -> None:
        """The hot path: SSE events -> token instants. Keeps what arrived before a fault."""
        ctype = resp.content_type
        if ctype != "text/event-stream":
            await self._not_sse(resp, out, ctype)
            return
        decoder = SSEDecoder()
        feed = decoder.feed
        event = p.event
        try:
            async for raw in resp.content.iter_any():
                now = _perf_ns()
                if out.first_byte_ns is None:
                    out.first_byte_ns = now
                try:
                    events = feed(raw)
                except SSEError as exc:
                    for data in exc.events:
                        event(data, now)
                    raise
                for data in events:
                    event(data, now)
                if p.done:
                    out.end_ns = p.answer_end(now)
                    break
        except aiohttp.ClientError as exc:
            now = _perf_ns()
            if p.finished:  # after a finish_reason the answer is whole
                out.end_ns = p.answer_end(now)
            else:
                out.end_ns = now
                self._fail(out, ErrorKind.STREAM_TRUNCATED, f"{exc_name(exc)} mid-stream")
            return
        except HttpProcessingError as exc:  # the HTTP framing broke (framing.py)
            now = _perf_ns()
            if p.finished:
                out.end_ns = p.answer_end(now)
            else:
                out.end_ns = now
                self._fail(out, ErrorKind.PROTOCOL_ERROR, f"{parse_error_name(exc)} mid-stream")
            return
        except (SSEError, Fault) as exc:
            self._fail_parse(out, exc)
            return
        if not p.done:
            # EOF without [DONE]: flush a last event sent without its blank line. A
            # half-written one means the stream was cut, not that it was corrupt.
            now = out.end_ns = _perf_ns()
            try:
                for data in decoder.close():
                    event(data, now)
            except (SSEError, Fault):
                if not p.finished:
                    self._cut(resp, out, "cut inside an event")
                    return
            if not p.done and not p.finished:
                self._cut(resp, out, "ended before [DONE]")
                return
            out.end_ns = p.answer_end(now)
        if not p.choices_seen:
            self._fail(out, ErrorKind.BAD_RESPONSE, "stream had no choices")
            return
        if p.done and not resp.content.at_eof():
            # Read to the body's end so the connection goes back to the pool. A server
            # that holds it open costs at most the grace: send() ignores that timeout.
            grace_at = asyncio.get_running_loop().time() + DRAIN_GRACE_S
            when = p.cm.when()
            p.cm.reschedule(grace_at if when is None else min(when, grace_at))
            try:
                async for _ in resp.content.iter_any():
                    pass
            except aiohttp.ClientError:
                pass  # the answer was whole; only the connection is lost

    async def _read_json(
        self,
        resp: aiohttp.ClientResponse,
        out: Outcome,
        bounds: Bounds = NO_BOUNDS,
        keep: bool = False,
    ) -> None:
        """A non-streamed answer. It has no first token before its end, so
        first_token_ns = last_token_ns = end_ns (TTFT equals E2E) when it has content."""
        if (resp.content_length or 0) > JSON_BODY_LIMIT:
            self._fail(out, ErrorKind.TOO_LARGE, f"body over {JSON_BODY_LIMIT} bytes")
            return
        body, cut = await _read_prefix(resp, JSON_BODY_LIMIT, out)
        end = out.end_ns = _perf_ns()
        if cut:
            self._fail(out, ErrorKind.TOO_LARGE, f"body over {JSON_BODY_LIMIT} bytes")
            return
        try:
            obj = loads(body)
        except (ValueError, RecursionError):
            if overrun(getattr(resp, "_protocol", None)):
                self._fail(out, ErrorKind.PROTOCOL_ERROR, "body longer than its Content-Length")
            else:
                self._fail(out, ErrorKind.BAD_RESPONSE, "body is not JSON")
            return
        if type(obj) is not dict:
            self._fail(out, ErrorKind.BAD_RESPONSE, "body is not a JSON object")
            return
        if obj.get("error") or obj.get("object") == "error":
            out.oom, detail = error_fields(body)
            self._fail(out, ErrorKind.BAD_RESPONSE, f"{ERROR_BODY} {detail}".rstrip())
            return
        try:
            choices = obj.get("choices")
            if not choices:
                self._fail(out, ErrorKind.BAD_RESPONSE, "no choices")
                return
            c0 = choices[0]
            if self._chat:
                text = answer_text(c0.get("message") or {}, "message")
            else:
                text = choice_text(c0)
            usage = obj.get("usage")
            if usage:
                apply_usage(out, usage, bounds)
        except Fault as exc:
            self._fail_parse(out, exc)
            return
        except (AttributeError, LookupError, TypeError):
            self._fail(out, ErrorKind.BAD_RESPONSE, "body has an unexpected shape")
            return
        if keep:
            out.answer = text or ""
            out.identity = served_by(obj)
        if text:
            out.content_chunks = 1
            out.first_token_ns = out.last_token_ns = end

    async def _read_error(self, resp: aiohttp.ClientResponse, out: Outcome) -> None:
        """A 3xx/4xx/5xx: read at most ERROR_BODY_LIMIT bytes for type/code and OOM."""
        status = out.status
        try:
            body, _ = await _read_prefix(resp, ERROR_BODY_LIMIT, out)
        except aiohttp.ClientError:
            body = b""  # the status already says what happened
        out.end_ns = _perf_ns()
        out.oom, fields = error_fields(body)
        if status in (429, 503):
            out.retry_after_s, out.retry_after_unreadable = retry_after(resp.headers)
        from_guard = resp.headers.get(GATEWAY_ORIGIN_HEADER) == "gateway"
        self._fail(out, status_kind(status, fields, from_guard), f"http {status} {fields}".rstrip())

    async def _not_sse(self, resp: aiohttp.ClientResponse, out: Outcome, ctype: str) -> None:
        """A stream was asked for, something else came (often a JSON error with 200)."""
        detail = f"expected text/event-stream, got {clean(ctype)}"
        if ctype == "application/json":
            try:
                body, _ = await _read_prefix(resp, ERROR_BODY_LIMIT, out)
            except aiohttp.ClientError:
                body = b""
            out.oom, fields = error_fields(body)
            if fields:
                detail = f"{ERROR_BODY} {fields}"
        out.end_ns = _perf_ns()
        self._fail(out, ErrorKind.BAD_RESPONSE, detail)

    # --- bookkeeping ---------------------------------------------------------------------

    def _fail(self, out: Outcome, kind: ErrorKind, detail: str) -> None:
        if out.error is None:  # the first cause wins
            out.error = kind
            out.error_detail = self._scrub(detail)

    def _cut(self, resp: aiohttp.ClientResponse, out: Outcome, detail: str) -> None:
        """The body ended before the stream did: cut short, or framed wrong by the server
        (``_protocol``: the connection's, kept by the response after its release)."""
        if overrun(getattr(resp, "_protocol", None)):
            self._fail(out, ErrorKind.PROTOCOL_ERROR, "body longer than its Content-Length")
        else:
            self._fail(out, ErrorKind.STREAM_TRUNCATED, detail)

    def _fail_parse(self, out: Outcome, exc: SSEError | Fault) -> None:
        if isinstance(exc, Fault):
            out.oom = out.oom or exc.oom
            self._fail(out, exc.kind, exc.detail)
        elif isinstance(exc, SSELineTooLong):
            self._fail(out, ErrorKind.TOO_LARGE, str(exc))
        else:
            self._fail(out, ErrorKind.BAD_CHUNK, str(exc))

    def _finish(self, out: Outcome) -> None:
        if out.end_ns == 0:
            out.end_ns = _perf_ns()
        settle_usage(out, self._stream)

    def _scrub(self, text: str) -> str:
        if self._secret is not None:
            key = self._secret.get_secret_value()
            if key:
                text = redact(text, key)
        return text[:200]


async def open_target(
    cfg: TargetConfig,
    *,
    run_id: str | None = None,
    on_learn: OnLearn | None = None,
    builder: Builds = GIVEN,
) -> OpenAITarget:
    """Build the client for one target: read its key once, set up TLS, the proxy and
    the connection pool. Raises ConfigError (naming the setting, never the key).
    ``run_id``: the run's, from which each request's traceparent is derived (when the
    target sends one: soakd/tracing.py). ``on_learn``: told when the pool learns that the
    server closes (or keeps again) its connections after answers with a status.
    ``builder``: makes each request's text (soakd/workload/build.py)."""
    key = cfg.api_key()
    ssl_arg = cfg.ssl_context()
    proxy, proxy_auth = (
        (URL(cfg.proxy), None) if cfg.proxy is not None else await env_proxy(cfg.endpoint)
    )
    accept = {"Accept": "text/event-stream" if cfg.stream else "application/json"}
    if cfg.stream:
        accept["Accept-Encoding"] = "identity"  # compression would batch tokens
    headers = target_headers(cfg, key, accept)
    refused = next(
        (p for p in (header_problem(k, v) for k, v in headers.items()) if p is not None),
        url_problem(cfg.endpoint),
    )
    if refused is not None and key is not None:
        refused = redact(refused, key.get_secret_value())

    session = ClientSession(
        # idle connections reused newest first: the pool shrinks after a burst (pool.py)
        connector=NewestFirstConnector(
            limit=cfg.max_connections,
            ssl=ssl_arg,
            force_close=not cfg.keep_alive,
            on_learn=on_learn,
        ),
        headers=headers,
        # Only the socket connect (with TLS and proxy setup) is aiohttp's to time:
        # waiting for a pooled connection is soakd's own queue, and the ttft/total
        # deadlines are applied per request.
        timeout=ClientTimeout(total=None, sock_connect=cfg.timeouts.connect),
        # Proxy settings from the environment were resolved once above; trust_env
        # would redo it (and read ~/.netrc) in a thread on every request.
        trust_env=False,
        cookie_jar=DummyCookieJar(),  # requests stay independent (no sticky cookies)
    )

    target = OpenAITarget(
        cfg,
        session,
        proxy=proxy,
        proxy_auth=proxy_auth,
        secret=key,
        run_id=run_id,
        refused=refused,
        builder=builder,
    )
    log.debug("target_opened", target=cfg.name, endpoint=cfg.endpoint, proxy=proxy is not None)
    return target


# --- helpers ---------------------------------------------------------------------------


async def _read_prefix(
    resp: aiohttp.ClientResponse, limit: int, out: Outcome
) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether there was more."""
    parts: list[bytes] = []
    size = 0
    async for raw in resp.content.iter_any():
        if out.first_byte_ns is None:
            out.first_byte_ns = _perf_ns()
        if size + len(raw) > limit:
            parts.append(raw[: limit - size])
            return b"".join(parts), True
        parts.append(raw)
        size += len(raw)
    return b"".join(parts), False
