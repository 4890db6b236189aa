"""Network room: HOST:PORT, TLS contexts and the environment's proxy, one rule each.

The target client, the probes, the config and the CLI all read addresses and build TLS
contexts; they do it here, so a bad CA file or a malformed address means the same thing
everywhere. A leaf: it imports no other soakd module (the config imports it). The config
turns these errors into ConfigErrors naming the field (``TargetConfig.ssl_context``,
``ExporterTls.context``), so a bad CA file stops the client and the probes alike.
"""

from __future__ import annotations

import asyncio
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
