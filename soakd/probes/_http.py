"""Probes room, HTTP: one GET with a short deadline that never raises (scrapes, health).

tenacity retries the connect only (a refused or unreachable socket, a few times within
a second): a slow or failing answer is itself the reading, never retried.
"""

from __future__ import annotations

import errno
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from soakd.config import TargetConfig
from soakd.net import env_proxy

BODY_LIMIT = 8 << 20
"""Largest /metrics page read (vLLM's is ~60 kB); a longer one is a failed scrape."""
CONNECT_ATTEMPTS = 3
CONNECT_RETRY_WAIT_S = 0.1


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one GET gave: a status and body, or why there was none."""

    status: int = 0  # 0: no HTTP answer
    text: str = ""
    error: str = ""  # short and secret-free: "connection refused", "timeout", "HTTP 503"
    refused: bool = False  # nothing listened (or the connection was reset): the process is gone

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A probed URL with the target's TLS and proxy settings."""

    url: str
    ssl: ssl.SSLContext | bool = True
    proxy: str | None = None

    @property
    def shown(self) -> str:
        """The URL without query or fragment, for logs."""
        p = urlsplit(self.url)
        return f"{p.scheme}://{p.netloc}{p.path}"


def endpoint_for(url: str, tcfg: TargetConfig | None) -> Endpoint:
    """The URL with the target's TLS settings (a CA file is read here, once). A CA file
    that cannot be loaded is a ConfigError naming the field, as for the target client."""
    if tcfg is None:
        return Endpoint(url)
    return Endpoint(url, tcfg.ssl_context(), tcfg.proxy)


async def resolve_proxy(ep: Endpoint) -> Endpoint:
    """HTTP(S)_PROXY / NO_PROXY for the URL, once, as the target client does. A probe
    goes direct when the environment's proxy cannot be read (the client reports it)."""
    if ep.proxy is not None:
        return ep
    try:
        proxy, _auth = await env_proxy(ep.url)
    except (ValueError, OSError):
        return ep
    return ep if proxy is None else Endpoint(ep.url, ep.ssl, str(proxy))


def base_root(base_url: str) -> str:
    """``http://h:8000/v1`` -> ``http://h:8000``: /metrics and /health live at the root."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1")


async def fetch(
    session: aiohttp.ClientSession,
    ep: Endpoint,
    timeout_s: float,
    *,
    attempts: int = CONNECT_ATTEMPTS,
    limit: int = BODY_LIMIT,
) -> Fetched:
    """GET ``ep``. Never raises except CancelledError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(max(1, attempts)),
            wait=wait_fixed(CONNECT_RETRY_WAIT_S),
            retry=retry_if_exception_type(aiohttp.ClientConnectorError),
            reraise=True,
        ):
            with attempt:
                async with session.get(
                    ep.url, timeout=timeout, ssl=ep.ssl, proxy=ep.proxy, allow_redirects=False
                ) as resp:
                    body = await _read(resp, limit)
                    if body is None:
                        return Fetched(resp.status, "", f"body over {limit} bytes")
                    text = body.decode("utf-8", errors="replace")
                    error = "" if 200 <= resp.status < 300 else f"HTTP {resp.status}"
                    return Fetched(resp.status, text, error)
    except aiohttp.ClientConnectorError as exc:
        refused = _is_refused(exc.os_error)
        return Fetched(error="connection refused" if refused else "connect failed", refused=refused)
    except (aiohttp.ServerDisconnectedError, ConnectionResetError):
        return Fetched(error="connection reset", refused=True)
    except TimeoutError:
        return Fetched(error="timeout")
    except aiohttp.ClientOSError as exc:
        refused = _is_refused(exc)
        return Fetched(
            error="connection refused" if refused else "connection error", refused=refused
        )
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return Fetched(error=type(exc).__name__)
    return Fetched(error="no attempt")  # pragma: no cover - tenacity always tries once


async def _read(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def _is_refused(exc: OSError) -> bool:
    if exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET):
        return True
    # asyncio joins the errors of every address tried (::1 and 127.0.0.1) into one
    return "refused" in str(exc).lower()
