"""Config room, redaction: the effective config as it may be stored or shown, with no secret in it.

Keys are referenced in the config (env or file), never written in it, so the dump holds
references only; header values and URL query values whose name looks secret are replaced
too, in case someone put one there anyway. The journal stores this document (``meta``)
and compares it on resume; ``soakd report --config`` judges a run by another one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from soakd.config.run import Config

_SECRETISH = ("auth", "key", "token", "secret", "password", "cookie", "session", "signature")


def config_doc(cfg: Config) -> dict[str, Any]:
    """The effective config as stored: key *references* only (never a key), and header
    values or URL query values whose name looks secret replaced, in case someone put one
    there."""
    doc = cfg.model_dump(mode="json")
    for target in doc.get("targets", []):
        for name in list(target.get("headers", {})):
            if any(s in name.lower() for s in _SECRETISH):
                target["headers"][name] = "<redacted>"
        for key in ("base_url", "metrics_url", "health_url", "proxy"):
            if target.get(key):
                target[key] = scrub_url(target[key])
    gpu = doc.get("gpu", {})
    if gpu.get("dcgm_url"):
        gpu["dcgm_url"] = scrub_url(gpu["dcgm_url"])
    return doc


def scrub_url(url: str) -> str:
    """``url`` with every query value replaced by ``<redacted>`` (names kept)."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    query = "&".join(f"{kv.partition('=')[0]}=<redacted>" for kv in parts.query.split("&"))
    return urlunsplit(parts._replace(query=query))
