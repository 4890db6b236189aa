"""Targets room, preflight: each target asked once before the plan starts, so a wrong
address, key, model or API ends the start in one line instead of a run of errors.

Per target, all targets at once: GET the models list (``TargetConfig.models_url``), then
one request of one token (``max_tokens`` 1, and any token cap in ``extra_body`` set to 1)
through the target's own client: its key, TLS, proxy, headers and body, as the run sends
them. That request is not the run's: no outcome, no journal row, no metric, no spend; the
server sees it (docs/architecture.md, "Preflight").

The request's answer decides. What no next request could fix is a *problem* (the start
ends, exit 2): nothing listening, no connection (DNS, TLS, a connect timeout), the key
refused (401/403), an unknown model or path (404), any other 4xx, or an answer that is not
OpenAI's (another content type, not JSON, no choices, not even HTTP). A 5xx, a 429, a
timeout, a cut stream or more tokens than asked for is the server's own trouble, which a
soak is there to measure: a *warning*, and the run goes on. An error object that comes
with a 200 (the whole body, or an event of the stream: a server that already sent its
headers has no other way to say it) is judged by its code as its status would be
(``errors.body_error``): code 500 or type ``server_error`` is a warning, 401 the key, 404
the model; one that names no status is not an OpenAI answer. The models list only words
the lines: a model it lacks that still answers is a warning (aliases: Ollama's
``llama3`` for ``llama3:latest``, LiteLLM's wildcard routes, llama-server answering any
name).
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from json import loads
from typing import Final
from urllib.parse import urlsplit

import aiohttp

from soakd.config import TargetConfig, Timeouts
from soakd.model import ErrorKind, Outcome, RequestSpec
from soakd.targets.errors import body_error, client_error
from soakd.targets.openai import OpenAITarget, open_target

__all__ = ["PREFLIGHT_TIMEOUT_S", "Preflight", "preflight", "preflight_one"]

PREFLIGHT_TIMEOUT_S: Final = 30.0
"""The longest the tiny request may take (the target's own timeouts when shorter)."""
MODELS_TIMEOUT_S: Final = 10.0
MODELS_LIMIT: Final = 4 << 20
"""Bytes of a models list read (OpenRouter's, the longest seen, is ~1 MB)."""
PROMPT: Final = "Say OK."
TOKEN_CAPS: Final = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""Keys of ``extra_body`` that would raise the one token: set to 1 for the preflight."""
_UNREACHED: Final = frozenset(
    {ErrorKind.CONNECT_REFUSED, ErrorKind.CONNECT_ERROR, ErrorKind.TIMEOUT_CONNECT}
)
_NOT_OPENAI: Final = frozenset(
    {ErrorKind.BAD_RESPONSE, ErrorKind.BAD_CHUNK, ErrorKind.PROTOCOL_ERROR}
)


@dataclass(frozen=True, slots=True)
class Preflight:
    """One target's preflight: ``line`` says what was found (one line, naming the field)."""

    target: str
    ok: bool  # no problem (a warning may remain)
    line: str
    seconds: float
    unreached: bool = False  # the problem is that nothing answered (refused, no connection)
    warning: bool = False
    # what the target said it is at start (docs/checks.md): its models list, vLLM's
    # /version, and the model and system_fingerprint its answer named (None: not seen)
    models: tuple[str, ...] | None = None
    version: str | None = None
    identity: tuple[str, str] | None = None
    # the model's context, as its models list entry says (vLLM's and the simulator's
    # ``max_model_len``); None: not said
    max_model_len: int | None = None


async def preflight(cfgs: Sequence[TargetConfig], *, identity: bool = False) -> list[Preflight]:
    """Every target at once, each as the run's client would ask it. ``identity``: its one
    token asked as a check is (temperature 0, a seed, its answer's model and fingerprint
    kept: docs/checks.md)."""
    return list(await asyncio.gather(*(preflight_one(c, identity=identity) for c in cfgs)))


async def preflight_one(cfg: TargetConfig, *, identity: bool = False) -> Preflight:
    """Ask one target. Raises ConfigError only for the key or TLS files (as ``run``)."""
    started = time.monotonic()
    target = await open_target(_tiny(cfg))
    try:
        models: list[str] | None = None
        context: int | None = None
        url = cfg.models_url
        if url is not None:
            try:
                status, body = await target.get(url, MODELS_TIMEOUT_S, MODELS_LIMIT)
            except (aiohttp.ClientError, TimeoutError) as exc:
                o = Outcome(cfg.name, "preflight", 0, 0)
                if isinstance(exc, aiohttp.ClientError):
                    o.error, o.error_detail = client_error(exc, False)
                if o.error in _UNREACHED:  # the request would meet the same: say it once
                    return _judge(cfg, o, None, started)
            else:
                if status == 200:
                    models, context = _models_list(body, cfg.model)
        version = await _version(target, url) if identity else None
        spec = RequestSpec(cfg.name, "preflight", 0, PROMPT, 3, 1, 0.0, time.perf_counter_ns())
        outcome = await target.send(replace(spec, keep_answer=identity))
        found = _judge(cfg, outcome, models, started)
        listed = tuple(models) if models is not None else None
        return replace(
            found,
            models=listed,
            version=version,
            identity=outcome.identity,
            max_model_len=context,
        )
    finally:
        await target.aclose()


async def _version(target: OpenAITarget, models_url: str | None) -> str | None:
    """vLLM's ``GET /version`` (``{"version": "0.11.0"}``), beside the models list's
    ``/v1``; None: no such answer (another server)."""
    if models_url is None or "/v1/models" not in models_url:
        return None
    try:
        url = models_url.rsplit("/v1/models", 1)[0] + "/version"
        status, body = await target.get(url, MODELS_TIMEOUT_S, 4096)
        doc = loads(body) if status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return version[:100] if isinstance(version, str) else None


def _tiny(cfg: TargetConfig) -> TargetConfig:
    """The target as the preflight asks it: one token, and no wait past the preflight's."""
    t = cfg.timeouts
    cap = min(t.total, PREFLIGHT_TIMEOUT_S)
    timeouts = Timeouts(
        connect=min(t.connect, cap),
        ttft=min(t.ttft, cap),
        idle=None if t.idle is None else min(t.idle, cap),
        total=cap,
    )
    extra = {k: (1 if k in TOKEN_CAPS else v) for k, v in cfg.extra_body.items()}
    return cfg.model_copy(update={"timeouts": timeouts, "extra_body": extra, "max_connections": 1})


def _models_list(body: bytes, model: str) -> tuple[list[str] | None, int | None]:
    """The ids of an OpenAI models list (``{"data": [{"id": ...}]}``; None: not one), and
    the ``max_model_len`` of ``model``'s entry (vLLM's, the simulator's; None: not there,
    or not a positive whole number)."""
    try:
        doc = loads(body)
    except ValueError:
        return None, None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None, None
    entries = [m for m in data if isinstance(m, dict) and "id" in m]
    context = next((m.get("max_model_len") for m in entries if m["id"] == model), None)
    fits = context if type(context) is int and context > 0 else None
    return [str(m["id"]) for m in entries], fits


def _where(url: str) -> str:
    """``scheme://host:port/path``: no query (it can hold a key), nothing else."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{p.path}"


def _listed(cfg: TargetConfig, models: list[str]) -> str:
    if not models:
        return "the server lists no model"
    near = difflib.get_close_matches(cfg.model, models, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    shown = ", ".join(models[:5]) + (f" and {len(models) - 5} more" if len(models) > 5 else "")
    return f"the server lists: {shown}{hint}"


def _judge(cfg: TargetConfig, o: Outcome, models: list[str] | None, started: float) -> Preflight:
    """The one line for what the preflight found."""
    seconds = time.monotonic() - started
    name, error, detail, status = f"targets[{cfg.name}]", o.error, o.error_detail, o.status
    coded = body_error(detail) if error is ErrorKind.BAD_RESPONSE else None
    if coded is not None:  # an error object with a 200: as its code's status would be
        error, status = coded
    unlisted = models is not None and cfg.model not in models
    listed = _listed(cfg, models or [])

    def problem(line: str, *, unreached: bool = False) -> Preflight:
        return Preflight(cfg.name, False, f"{name}.{line}", seconds, unreached)

    if error is None:
        if unlisted:
            line = f"{name}.model: {cfg.model!r} answered but is not in the models list; {listed}"
            return Preflight(cfg.name, True, line, seconds, warning=True)
        took = f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
        return Preflight(cfg.name, True, f"{name}: ok, one token in {took}", seconds)
    host = urlsplit(cfg.base_url).netloc
    post = f"POST {_where(cfg.endpoint)}"
    if error in _UNREACHED:
        if error is ErrorKind.CONNECT_REFUSED:
            why = f"base_url: connection refused at {host}: nothing listens there"
        elif error is ErrorKind.TIMEOUT_CONNECT:
            why = f"base_url: no connection to {host} within timeouts.connect"
        elif detail.startswith("tls"):
            return problem(f"tls: {detail} at {host} (tls.ca_file, tls.verify; or http://?)")
        elif detail.startswith("proxy"):
            why = f"proxy: {detail} on the way to {host} (proxy, or HTTP(S)_PROXY / NO_PROXY)"
        elif detail.startswith("dns"):
            why = f"base_url: cannot resolve {urlsplit(cfg.base_url).hostname}"
        else:
            why = f"base_url: cannot connect to {host} ({detail})"
        return problem(f"{why} (--no-preflight if it comes up later)", unreached=True)
    if error is ErrorKind.HTTP_AUTH:
        if cfg.api_key_env:
            return problem(f"api_key_env: {post} refused the key in ${cfg.api_key_env} ({detail})")
        if cfg.api_key_file:
            return problem(f"api_key_file: {post} refused the key in {cfg.api_key_file} ({detail})")
        return problem(f"api_key_env: {post} wants a key ({detail}); none is configured")
    if error is ErrorKind.HTTP_4XX and status == 404:
        if unlisted:
            return problem(f"model: unknown model {cfg.model!r} ({detail}); {listed}")
        if models is not None:
            return problem(
                f"api: {post} answered {detail} though the server lists {cfg.model!r}: "
                "the wrong api (chat or completions), or a wrong path in base_url?"
            )
        return problem(
            f"model: {post} answered {detail}: an unknown model {cfg.model!r}, or a wrong "
            "path in base_url (the server has no models list to tell which)"
        )
    if error is ErrorKind.HTTP_4XX:
        also = f"; {listed}" if unlisted else ""
        return problem(
            f"model: {post} refused the request ({detail}): model, api, extra_body?{also}"
        )
    if error in _NOT_OPENAI:
        return problem(f"api: not an OpenAI answer from {post}: {detail}")
    line = f"{name}: {detail or error.value}: the server's own trouble, not a setup problem"
    return Preflight(cfg.name, True, line, seconds, warning=True)
