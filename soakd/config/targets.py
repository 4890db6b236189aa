"""Config room, targets: one server to soak, how to reach it, what it may cost, and how
its keys are read (by reference, never written in the config)."""

from __future__ import annotations

import json
import os
import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from soakd.config.base import (
    MAX_CONCURRENCY,
    ConfigError,
    Count,
    Duration,
    Name,
    PositiveDuration,
    Strict,
    base_http_url,
    http_url,
)
from soakd.config.gateway import GatewaySettings
from soakd.config.slo import Slo, TargetCost
from soakd.model import SpendCap
from soakd.net import TlsFileError, client_ssl, header_problem, value_problem
from soakd.profiles import PROFILES

MAX_MODEL_NAME = 1024
"""Longest model name accepted: a repository id or a local path, not a pasted file."""
MAX_EXTRA_BODY = 1 << 20
"""Largest ``extra_body``, as JSON (1 MiB): it goes out with every request."""
_DEPLOYMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""An Azure deployment name: it is a segment of the request's URL path."""


class Timeouts(Strict):
    connect: PositiveDuration = 10.0  # to open a connection (TCP and TLS)
    ttft: PositiveDuration = 60.0  # from the send to the first token (streams)
    idle: PositiveDuration | None = 60.0  # longest silence between content chunks; None: none
    total: PositiveDuration = 600.0  # the whole request, from the send


class Tls(Strict):
    verify: bool = True  # check the server's certificate (false: a self-signed test server)
    ca_file: Path | None = None  # a PEM bundle to trust instead of the system's


class SpendGuard(Strict):
    """Caps on what soakd sends a target, so a 72 h soak of a paid endpoint cannot run up
    an unbounded bill. Requests count when sent, tokens (prompt + output, from the
    server's usage) when they finish; per-hour caps are over the last hour, sliding.
    When a cap is reached the target pauses (logged, journaled, exported), never silently."""

    max_requests_per_hour: Count | None = None  # over the last hour, sliding
    max_tokens_per_hour: Count | None = None  # prompt + output tokens, the last hour
    max_requests: Count | None = None  # in the whole run
    max_tokens: Count | None = None  # in the whole run

    @property
    def enabled(self) -> bool:
        return any(self.limit(cap) is not None for cap in SpendCap)

    def limit(self, cap: SpendCap) -> int | None:
        """The cap's configured limit (None: not capped)."""
        match cap:
            case SpendCap.REQUESTS_PER_HOUR:
                return self.max_requests_per_hour
            case SpendCap.TOKENS_PER_HOUR:
                return self.max_tokens_per_hour
            case SpendCap.REQUESTS:
                return self.max_requests
            case SpendCap.TOKENS:
                return self.max_tokens


class RateLimit(Strict):
    """What a 429 (or a 503 with Retry-After) does to the target's sends. The 429s are
    counted either way; honouring pauses the target's sends for the time asked."""

    honour_retry_after: bool = True  # pause the target's sends for the time a 429 asks
    default_pause: Duration = 1.0  # a 429 without Retry-After pauses this long (0: none)
    max_pause: Duration = 300.0  # the longest pause one answer can cause


class Failing(Strict):
    """What soakd does with a target that fails every request in a way no request can fix
    (nothing listens, no connection, the key refused, the model or path unknown: see
    soakd/workload/failing.py): after ``after`` of nothing else it pauses the target's
    sends, then sends one request at a time after each pause (2 s, doubling up to
    ``max_pause``) and resumes on the first answer that is not such a failure."""

    after: Duration | None = 30.0  # a streak of such failures this long pauses; null: never
    max_pause: PositiveDuration = 30.0  # the longest wait between two probing requests


class TargetConfig(Strict):
    name: Name  # unique
    # required unless `simulator` is set; http(s), a port within 1-65535, no user info, no
    # query or fragment (paths are appended to it)
    base_url: str = ""
    simulator: str | None = None  # start the embedded simulator with this profile
    api: Literal["chat", "completions"] = "chat"  # /v1/chat/completions or /v1/completions
    model: str = "soakd-sim"  # the request's model field
    stream: bool = True  # stream the answer (SSE): TTFT and ITL need it
    api_key_env: str | None = None  # the environment variable holding the API key
    api_key_file: Path | None = None  # or a file holding it (never the key in the config)
    # sent on every request: names are HTTP tokens, values printable ASCII (no CR, LF, NUL)
    headers: dict[str, str] = Field(default_factory=dict)
    # merged into every request body: JSON (no NaN, no dates), at most 1 MiB
    extra_body: dict[str, Any] = Field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    proxy: str | None = None  # an http(s) proxy URL; None: honour HTTP(S)_PROXY / NO_PROXY
    tls: Tls = Tls()
    max_connections: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] = 1024  # open at once
    # the most an answer may stream, in multiples of max_tokens: past it the answer is cut
    # (too_many_tokens), and a usage count above it is not taken (soakd/targets/stream.py)
    max_output_factor: Annotated[float, Field(ge=1, le=1000)] = 10.0
    # False: a new connection per request, for servers that drop kept-alive connections
    # unannounced (llama-server, llama.cpp's cpp-httplib 0.58: after each streamed answer)
    keep_alive: bool = True
    metrics_url: str | None = None  # the server's own /metrics (default: base_url/metrics)
    health_url: str | None = None  # default: base_url/health
    scrape: bool = True  # scrape metrics_url and probe health_url
    pid: int | None = None  # the server's PID, to map per-process GPU memory to this target
    process_name: str | None = None  # or a substring of its command line / process name
    oom_log: Path | None = None  # a log file to tail for out-of-memory lines
    cost: TargetCost = TargetCost()
    slo: Slo = Slo()  # overrides of the run-wide slo block for this target
    # Cloud endpoints (docs/gateway.md): the API's dialect, a spend cap, 429 handling, and
    # a `soakd gateway` that soakd starts in front of the target.
    kind: Literal["openai", "azure"] = "openai"
    api_version: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,40}$")] | None = None  # azure
    deployment: Annotated[str, Field(pattern=_DEPLOYMENT.pattern)] | None = None
    organization: str | None = None  # OpenAI-Organization header
    project: str | None = None  # OpenAI-Project header
    path: Annotated[str, Field(pattern=r"^/[^?#\s]*$")] | None = None  # request path, as is
    spend: SpendGuard = SpendGuard()
    rate_limit: RateLimit = RateLimit()
    failing: Failing = Failing()
    # A target meant to fail (a fault test): its preflight failure is logged, not fatal,
    # and a run in which it never succeeded does not exit 3 (docs/architecture.md)
    expect_failure: bool = False
    gateway: GatewaySettings | None = None
    # A W3C traceparent on every request, so the server's trace joins it (docs/tracing.md).
    # None: on for local targets (loopback/private host, simulator:, gateway:), else off.
    traceparent: bool | None = None
    # How a planned answer length (workload.prompts.output_tokens) is asked to be served:
    # ignore_eos (vLLM, llama.cpp, SGLang), min_tokens (vLLM: min_tokens = max_tokens) or
    # none (max_tokens alone: an answer may end early). None: ignore_eos for local targets
    # (loopback/private host, simulator:), none for others (a cloud refuses unknown keys).
    planned_output: Literal["ignore_eos", "min_tokens", "none"] | None = None
    # the longest request the target takes, prompt and answer, in its tokens (vLLM's
    # max_model_len); unset: what its models list says at the start (vLLM's and the
    # simulator's say it), else unchecked. A plan whose longest request is longer stops
    # before the journal opens (docs/workloads.md, "A request longer than the context")
    max_model_len: Annotated[int, Field(ge=1)] | None = None

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return base_http_url(value) or value

    @field_validator("metrics_url", "health_url", "proxy")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return http_url(value)

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if key.lower() in ("authorization", "api-key", "x-api-key"):
                raise ValueError(
                    f"header {key!r} would put a secret in the config: "
                    "use api_key_env or api_key_file"
                )
            problem = header_problem(key, text)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("organization", "project")
    @classmethod
    def _header_value(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = "OpenAI-Organization" if info.field_name == "organization" else "OpenAI-Project"
        problem = header_problem(name, value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the model name is empty")
        if len(value) > MAX_MODEL_NAME:
            raise ValueError(f"a model name of {len(value)} characters (at most {MAX_MODEL_NAME})")
        bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:
            raise ValueError(f"the model name holds a control character (U+{ord(bad):04X})")
        return value

    @field_validator("simulator")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is not None and value not in PROFILES:
            raise ValueError(f"unknown simulator profile {value!r} (known: {', '.join(PROFILES)})")
        return value

    @field_validator("extra_body")
    @classmethod
    def _json_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:  # as the client encodes it (a NaN or a date is not JSON; a cycle never ends)
            size = len(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not JSON, as every request must carry it: {exc}") from None
        if size > MAX_EXTRA_BODY:
            raise ValueError(
                f"{size:,} bytes as JSON, sent with every request (at most {MAX_EXTRA_BODY:,})"
            )
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> TargetConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("set api_key_env or api_key_file, not both")
        if not self.base_url and not self.simulator:
            raise ValueError("base_url is required (or simulator: PROFILE for the embedded one)")
        if self.kind == "azure":
            if not self.api_version:
                raise ValueError("kind 'azure' needs api_version (e.g. \"2024-06-01\")")
            if self.organization or self.project:
                raise ValueError(
                    "organization and project are OpenAI headers: not for kind 'azure'"
                )
            if self.path:
                raise ValueError("kind 'azure' builds its own path: use kind 'openai' with path")
            if self.deployment is None and not _DEPLOYMENT.fullmatch(self.model):
                raise ValueError(
                    f"kind 'azure' puts the deployment in the URL path; model {self.model!r} "
                    "cannot be one: set deployment (letters, digits, _ . -)"
                )
        elif self.api_version or self.deployment:
            raise ValueError("api_version and deployment are for kind 'azure'")
        return self

    def api_key(self) -> SecretStr | None:
        """Read the key by reference. Raises ConfigError naming the reference, never the
        key: unset, unreadable, empty, or holding a character no header can carry."""
        if self.api_key_env:
            where = f"targets[{self.name}].api_key_env"
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ConfigError(f"{where}: environment variable {self.api_key_env} is not set")
            return _key(where, f"environment variable {self.api_key_env}", value.strip())
        if self.api_key_file:
            where = f"targets[{self.name}].api_key_file"
            try:
                value = self.api_key_file.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                why = getattr(exc, "strerror", None) or "not UTF-8 text"
                raise ConfigError(f"{where}: cannot read {self.api_key_file}: {why}") from None
            if not value:
                raise ConfigError(f"{where}: {self.api_key_file} is empty")
            return _key(where, str(self.api_key_file), value)
        return None

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS setting both the client and the probes use. A CA file that cannot be
        loaded is a ConfigError naming the field, for both (never the default store)."""
        try:
            return client_ssl(self.tls.verify, self.tls.ca_file)
        except TlsFileError as exc:
            raise ConfigError(f"targets[{self.name}].tls.ca_file: {exc}") from None

    @property
    def models_url(self) -> str | None:
        """The OpenAI models list beside the endpoint; None where soakd cannot tell where
        it is (kind azure: a deployment is not a model; a custom ``path``)."""
        if self.kind == "azure" or self.path:
            return None
        base = self.base_url.rstrip("/")
        return base + "/models" if base.endswith("/v1") else base + "/v1/models"

    @property
    def endpoint(self) -> str:
        path = "/chat/completions" if self.api == "chat" else "/completions"
        base = self.base_url.rstrip("/")
        if self.kind == "azure":
            base = base.removesuffix("/openai")
            deployment = self.deployment or self.model
            return f"{base}/openai/deployments/{deployment}{path}?api-version={self.api_version}"
        if self.path:
            return base + self.path
        return base + path if base.endswith("/v1") else base + "/v1" + path


def _key(where: str, source: str, value: str) -> SecretStr:
    """The key as a SecretStr, once a header can carry it (the key itself is never shown)."""
    problem = value_problem(value)
    if problem is not None:
        raise ConfigError(f"{where}: the key in {source} holds {problem}: no header can carry it")
    return SecretStr(value)
