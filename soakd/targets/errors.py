"""Targets room, errors: what a failed request was, in words safe to store (pure).

An error body, a status, a Retry-After header or an aiohttp exception becomes an
``ErrorKind`` and a short detail. Details are built from sanitized fields (OpenAI
``error.type``/``code``, class and errno names), never from a body's message or
``str(exc)``, which can echo the prompt, a URL or part of the key; ``redact`` takes out
whatever of the key is left.
"""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from json import loads
from typing import Final

import aiohttp

from soakd.model import SHED_BY_CODE, ErrorKind
from soakd.targets.pool import ClosedAfterAnswer

__all__ = [
    "AUTH_ERROR_WORDS",
    "REDACT_WINDOW",
    "clean",
    "client_error",
    "error_fields",
    "exc_name",
    "redact",
    "retry_after",
    "status_kind",
]

_OOM_WORDS = (b"out of memory", b"outofmemory")  # matched on the lower-cased body
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]+")


def error_fields(body: bytes) -> tuple[bool, str]:
    """(mentions out-of-memory, "type code") from an error body. Never the message:
    it can echo the prompt or part of the key."""
    low = body.lower()
    oom = any(word in low for word in _OOM_WORDS)
    try:
        obj = loads(body)
    except ValueError:
        return oom, ""
    if type(obj) is not dict:
        return oom, ""
    err = obj.get("error")
    src = err if type(err) is dict else obj  # vLLM < 0.7 put type/code at the top level
    parts = [clean(src.get(k)) for k in ("type", "code")]
    return oom, " ".join(p for p in parts if p)


REDACT_WINDOW: Final = 8
"""A word of a detail holding any this many consecutive characters of the key is masked."""


def redact(text: str, key: str) -> str:
    """``text`` without the key, whole or in part. A server that echoes the key in an
    error's type or code gets it cut to 48 characters by ``clean``: that prefix is no
    longer the key, so plain replacement would let most of it through."""
    if key in text:
        text = text.replace(key, "***")
    n = min(len(key), REDACT_WINDOW)
    parts = {key[i : i + n] for i in range(len(key) - n + 1)}
    if not any(p in text for p in parts):
        return text
    return " ".join("***" if any(p in w for p in parts) else w for w in text.split(" "))


def clean(value: object) -> str:
    """A short token safe for logs: letters, digits and ``_.:/-`` only."""
    if value is None or isinstance(value, dict | list):
        return ""
    return _UNSAFE.sub("", str(value))[:48]


AUTH_ERROR_WORDS: Final = frozenset(
    {"auth_error", "authentication_error", "invalid_api_key", "no_db_connection"}
)
"""Error ``type``/``code`` values that make a 400 an auth failure. ``no_db_connection`` is
LiteLLM's answer to any key but its master key when it runs without a database (it
cannot look the key up): in practice a wrong key (docs/gateway.md)."""


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI, Azure) or ``Retry-After``
    (seconds or an HTTP date); None when absent or unreadable."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = -1.0
        if 0 <= value < 1e7:
            return value
    text = headers.get("Retry-After")
    if text is None:
        return None
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def status_kind(status: int, fields: str = "", from_guard: bool = False) -> ErrorKind:
    if from_guard and status in (429, 503):  # the guard's own refusal, by its error code
        for word in fields.split():
            shed = SHED_BY_CODE.get(word)
            if shed is not None:
                return shed
    if status in (401, 403):
        return ErrorKind.HTTP_AUTH
    if status == 400 and fields and not AUTH_ERROR_WORDS.isdisjoint(fields.split()):
        return ErrorKind.HTTP_AUTH
    if status == 429:
        return ErrorKind.HTTP_429
    if status >= 500:
        return ErrorKind.HTTP_5XX
    if status >= 400:
        return ErrorKind.HTTP_4XX
    return ErrorKind.BAD_RESPONSE  # 3xx: redirects are not followed (the key stays put)


def exc_name(exc: BaseException) -> str:
    return type(exc).__name__


def client_error(exc: aiohttp.ClientError, responded: bool) -> tuple[ErrorKind, str]:
    """aiohttp's exception -> (kind, detail). Details are class names and errno names,
    never ``str(exc)`` (it can hold URLs and request headers)."""
    if isinstance(exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError):
        return ErrorKind.CONNECT_ERROR, f"proxy: {exc_name(exc)}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return ErrorKind.CONNECT_ERROR, "tls certificate rejected"
    if isinstance(exc, aiohttp.ClientSSLError):
        return ErrorKind.CONNECT_ERROR, "tls handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return ErrorKind.CONNECT_ERROR, "dns lookup failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return ErrorKind.CONNECT_REFUSED, "connection refused"
        return ErrorKind.CONNECT_ERROR, _os_detail(exc.os_error)
    if isinstance(exc, aiohttp.ClientResponseError):  # an unparsable HTTP response
        return ErrorKind.BAD_RESPONSE, f"invalid http response: {exc_name(exc)}"
    if isinstance(exc, ClosedAfterAnswer):  # the server closes after such answers
        return ErrorKind.CONNECTION_CLOSED_UNANNOUNCED, f"closed after a {exc.status} answer"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientConnectionError):
        when = "after" if responded else "before"
        return ErrorKind.STREAM_TRUNCATED, f"{exc_name(exc)} {when} response headers"
    return ErrorKind.CLIENT_ERROR, exc_name(exc)


def _os_detail(err: OSError) -> str:
    code = errno.errorcode.get(err.errno or 0)
    return f"connect failed: {code or type(err).__name__}"
