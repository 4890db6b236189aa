"""Tracing room: the W3C ``traceparent`` of each request, derived, never stored (pure).

A request's trace id is a hash of what every journal row already holds (the run id, the
target and the prompt ``seq``), so the journal keeps the trace id at no cost per row: the
client sends it, and the export, the report and the exemplars compute the same one again.
``seq`` is unique per target within a run, across resumes (the runner continues it), so
two requests of one run never share a trace id. The sampled flag is set (``-01``): vLLM
records a span only for a sampled parent.

Which targets send it (``targets[].traceparent``): ``true`` or ``false`` as asked; unset,
the local ones do (a loopback or private address, ``localhost``, a ``simulator:`` or a
``gateway:`` target) and the others (a cloud) do not: a remote party's tracing is not
soakd's to join uninvited.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from hashlib import blake2b
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from soakd.config import TargetConfig

__all__ = [
    "HEADER",
    "is_local_url",
    "sends_traceparent",
    "span_id",
    "trace_id",
    "traced_names",
    "traceparent",
    "wants_traceparent",
]

HEADER: Final = "traceparent"
VERSION: Final = "00"
SAMPLED: Final = "01"
_TRACE_PERSON: Final = b"soakd.trace"
_SPAN_PERSON: Final = b"soakd.span"


def _key(run_id: str, target: str, seq: int) -> bytes:
    # Target names never hold "|" (config's pattern) and seq is a number: no two
    # (run_id, target, seq) give the same bytes.
    return f"{run_id}|{target}|{seq}".encode()


def trace_id(run_id: str, target: str, seq: int) -> str:
    """32 lower-case hex digits, never all zeros (W3C forbids that value)."""
    digest = blake2b(_key(run_id, target, seq), digest_size=16, person=_TRACE_PERSON).hexdigest()
    return digest if digest.strip("0") else "0" * 31 + "1"


def span_id(run_id: str, target: str, seq: int) -> str:
    """16 lower-case hex digits: the client-side parent span vLLM's span hangs under."""
    digest = blake2b(_key(run_id, target, seq), digest_size=8, person=_SPAN_PERSON).hexdigest()
    return digest if digest.strip("0") else "0" * 15 + "1"


def traceparent(run_id: str, target: str, seq: int) -> str:
    """``00-<trace id>-<span id>-01``: the header value sent with the request."""
    return f"{VERSION}-{trace_id(run_id, target, seq)}-{span_id(run_id, target, seq)}-{SAMPLED}"


def is_local_url(url: str) -> bool:
    """A loopback, private or link-local address, or ``localhost``: soakd's own box or
    its LAN. A host name other than localhost is not resolved: it counts as remote."""
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_private or addr.is_link_local


def sends_traceparent(
    setting: bool | None, base_url: str, simulator: object, gateway: object
) -> bool:
    """The rule, for a target as configured (``wants_traceparent``) or as a journal stored
    it (``soakd/journal/stored.py``): ``setting`` as asked, else a local target's do."""
    if setting is not None:
        return setting
    return simulator is not None or gateway is not None or is_local_url(base_url)


def wants_traceparent(cfg: TargetConfig) -> bool:
    """Does this target get a ``traceparent`` on every request?"""
    return sends_traceparent(cfg.traceparent, cfg.base_url, cfg.simulator, cfg.gateway)


def traced_names(targets: Iterable[TargetConfig | str]) -> list[str]:
    """The names of these targets that send a ``traceparent`` (a name: one that does)."""
    return [
        t if isinstance(t, str) else t.name
        for t in targets
        if isinstance(t, str) or wants_traceparent(t)
    ]
