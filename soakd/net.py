"""Network room: HOST:PORT, URLs and headers that can go on the wire, TLS contexts and
the environment's proxy, one rule each.

The target client, the probes, the config and the CLI all read addresses, URLs and
headers and build TLS contexts; they do it here, so a bad CA file, a malformed address
or a header the client cannot write means the same thing everywhere. A leaf: it imports
no other soakd module (the config imports it). The config turns these errors into
ConfigErrors naming the field (``TargetConfig.ssl_context``, ``ExporterTls.context``), so
a bad CA file stops the client and the probes alike.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from pathlib import Path

from aiohttp import BasicAuth
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL


class TlsFileError(ValueError):
    """A CA, certificate or key file that cannot be loaded; ``str()`` says which and why."""


def parse_host_port(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:0"`` -> (host, port); brackets are stripped.
    ValueError (``expected HOST:PORT, got ...``) for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110 token): what a server parses as one header name."""
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
"""What soakd writes as a header value: printable ASCII, spaces and tabs. No CR, LF or
NUL (they would end the header or the request), no other control character, and no
character beyond ASCII: aiohttp writes those as UTF-8, which servers read as Latin-1."""


def header_problem(name: str, value: str) -> str | None:
    """Why the header ``name: value`` cannot go on the wire as written; None when it can.
    The value is never quoted (it may be a key): only its first bad character is named."""
    if not _TOKEN.fullmatch(name):
        return f"header name {name!r} is not an HTTP token (letters, digits, -, and !#$%&'*+.^_`|~)"
    problem = value_problem(value)
    return None if problem is None else f"header {name}: its value holds {problem}"


def value_problem(value: str) -> str | None:
    """The first character of ``value`` that no header value may hold, with its position
    (``"a carriage return (CR) at position 2"``); None when there is none."""
    match = _FIELD_VALUE.match(value)  # never None: the pattern matches "" at least
    end = match.end() if match else 0
    if end == len(value):
        return None
    return f"{_char_name(value[end])} at position {end + 1}"


def _char_name(ch: str) -> str:
    code = ord(ch)
    names = {0: "a NUL", 10: "a line feed (LF)", 13: "a carriage return (CR)", 127: "a DEL"}
    if code in names:
        return names[code]
    if code < 32:
        return f"a control character (U+{code:04X})"
    return f"a non-ASCII character (U+{code:04X})"


def url_problem(url: str, *, base: bool = False) -> str | None:
    """Why ``url`` cannot be asked for as written; None when it can: an http(s) scheme, a
    host, a port within 1-65535, no user info (a credential), no whitespace or control
    character; ``base``: also no query or fragment (paths are appended to it)."""
    bad = next((c for c in url if ord(c) <= 32 or ord(c) == 127), None)
    if bad is not None:
        return f"URL holds {'a space' if bad == ' ' else _char_name(bad)}: {url.strip()!r}"
    try:
        parsed = URL(url)
        port = parsed.port
    except ValueError as exc:
        return f"not a usable URL ({exc}): {url!r}"
    if parsed.scheme not in ("http", "https"):
        return f"URL scheme must be http or https, got {url!r}"
    if not parsed.host:
        return f"URL has no host: {url!r}"
    if parsed.raw_user is not None or parsed.raw_password is not None:
        return "URL must not carry user info (a credential): use api_key_env or api_key_file"
    if port is None or not 1 <= port <= 65535:
        return f"URL port must be within 1-65535, got {port}: {url!r}"
    if base and (parsed.raw_query_string or parsed.raw_fragment or "?" in url or "#" in url):
        return f"a base URL takes no query or fragment (paths are appended to it): {url!r}"
    return None


def client_ssl(verify: bool, ca_file: Path | None) -> ssl.SSLContext | bool:
    """The client's TLS setting: False (no verification), or a context trusting
    ``ca_file`` (the default store when None). A CA file that cannot be loaded raises
    TlsFileError, never a silent fall-back to the default store."""
    if not verify:
        return False
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsFileError(f"cannot load {ca_file}: {_why(exc)}") from None


def server_ssl(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server's TLS context (TLS 1.2 and up) from PEM files; TlsFileError when they
    cannot be loaded."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise TlsFileError(f"cannot load {cert_file} / {key_file}: {_why(exc)}") from None
    return ctx


async def env_proxy(url: str) -> tuple[URL | None, BasicAuth | None]:
    """HTTP(S)_PROXY / NO_PROXY (and ~/.netrc proxy auth) for ``url``, resolved once in a
    thread: the answer aiohttp's ``trust_env`` would give on every request. (None, None)
    when no proxy applies. A malformed proxy variable raises ValueError."""
    try:
        return await asyncio.to_thread(get_env_proxy_for_url, URL(url))
    except LookupError:
        return None, None


def _why(exc: OSError | ssl.SSLError) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
