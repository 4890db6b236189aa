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
    "ERROR_BODY",
    "REDACT_WINDOW",
    "STREAM_ERROR",
    "body_error",
    "clean",
    "client_error",
    "error_fields",
    "exc_name",
    "parse_error_name",
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
    except (ValueError, RecursionError):
        return oom, ""
    if type(obj) is not dict:
        return oom, ""
    err = obj.get("error")
    src = err if type(err) is dict else obj  # vLLM < 0.7 put type/code at the top level
    parts = [clean(src.get(k)) for k in ("type", "code")]
    return oom, " ".join(p for p in parts if p)


ERROR_BODY: Final = "error body"
"""A 200 whose JSON body is an error object: the ``bad_response`` detail's first words,
then ``error_fields``'s "type code"."""
STREAM_ERROR: Final = "stream error"
"""An error object as an event of a stream (its headers said 200 before it came)."""
SERVER_ERROR_TYPES: Final = frozenset({"server_error"})
"""An error object's ``type`` that says the server failed when its ``code`` names no status:
OpenAI's mid-stream error (``code`` null) and llama.cpp's."""


def body_error(detail: str) -> tuple[ErrorKind, int] | None:
    """An error object that came with a 200 (a ``bad_response`` detail starting with
    ``ERROR_BODY`` or ``STREAM_ERROR``), read by its code as ``status_kind`` reads a
    status: (kind, status). The status is its ``code`` when that is one (400-599), else
    500 for a ``SERVER_ERROR_TYPES`` type. None: no error object, or one that names no
    status (the run counts it ``bad_response`` either way)."""
    for head in (ERROR_BODY, STREAM_ERROR):
        if detail.startswith(head + " "):
            fields = detail[len(head) + 1 :]
            break
    else:
        return None
    words = fields.split()
    status = next(
        (int(w) for w in words if w.isascii() and w.isdigit() and 400 <= int(w) < 600), None
    )
    if status is None and not SERVER_ERROR_TYPES.isdisjoint(words):
        status = 500
    return None if status is None else (status_kind(status, fields), status)


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


RETRY_AFTER_MAX_S: Final = 1e7
"""The longest wait soakd reads from a Retry-After (~116 days; a pause is capped at
``rate_limit.max_pause`` anyway): a longer one is unreadable, like a malformed one."""
_SECONDS = re.compile(r"[0-9]{1,12}")  # HTTP's delay-seconds: ASCII digits only
_MILLIS = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


def retry_after(headers: Mapping[str, str]) -> tuple[float | None, bool]:
    """``(seconds, unreadable)``: the wait asked by ``retry-after-ms`` (OpenAI, Azure) or
    ``Retry-After`` (delay-seconds or an HTTP date), and whether one was there that soakd
    could not read (seconds is then None: the caller's default applies). Never raises.

    Read as HTTP defines them, not as Python would: ``str.isdigit`` and ``float`` accept
    "²" and Arabic-Indic digits, which are no delay-seconds; a negative number, a date
    that is not one, or a wait over RETRY_AFTER_MAX_S is unreadable."""
    seen = False
    ms = headers.get("retry-after-ms")
    if ms is not None:
        seen = True
        ms = ms.strip()
        if _MILLIS.fullmatch(ms) and float(ms) / 1000.0 <= RETRY_AFTER_MAX_S:
            return float(ms) / 1000.0, False
    text = headers.get("Retry-After")
    if text is None:
        return None, seen
    text = text.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(int(text))
        return (seconds, False) if seconds <= RETRY_AFTER_MAX_S else (None, True)
    try:
        when = parsedate_to_datetime(text)
        wait = None if when.tzinfo is None else when.timestamp() - time.time()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        wait = None
    if wait is None or wait > RETRY_AFTER_MAX_S:
        return None, True
    return max(0.0, wait), False


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
    if isinstance(exc, aiohttp.ClientResponseError):  # the HTTP parser rejected the response
        return ErrorKind.PROTOCOL_ERROR, f"invalid http response: {parse_error_name(exc)}"
    if isinstance(exc, ClosedAfterAnswer):  # the server closes after such answers
        return ErrorKind.CONNECTION_CLOSED_UNANNOUNCED, f"closed after a {exc.status} answer"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientConnectionError):
        when = "after" if responded else "before"
        return ErrorKind.STREAM_TRUNCATED, f"{exc_name(exc)} {when} response headers"
    return ErrorKind.CLIENT_ERROR, exc_name(exc)


def parse_error_name(exc: BaseException) -> str:
    """The class of the HTTP parser's own error behind ``exc`` (BadStatusLine, LineTooLong,
    TransferEncodingError...): aiohttp wraps it, once or twice, as the cause."""
    name = exc_name(exc)
    seen = 0
    cause = exc.__cause__
    while cause is not None and seen < 8:
        if isinstance(cause, aiohttp.http_exceptions.HttpProcessingError):
            name = exc_name(cause)
        cause, seen = cause.__cause__, seen + 1
    return name


def _os_detail(err: OSError) -> str:
    code = errno.errorcode.get(err.errno or 0)
    return f"connect failed: {code or type(err).__name__}"
