"""Config: one strict model tree, loaded once from YAML plus ``SOAKD__`` env overrides.

Nothing else in soakd reads config files or environment variables (API keys are
read here too, by reference, and kept out of every repr).
"""

from __future__ import annotations

import difflib
import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "SOAKD__"


class ConfigError(Exception):
    """A config problem, already phrased for the user: one line per problem, the first
    leading and the others indented under it (``str()``), each naming its field path."""

    def __init__(self, message: str, more: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = [message, *(more or [])]

    def __str__(self) -> str:
        return "\n  ".join(self.problems)

    @classmethod
    def of(cls, problems: list[str]) -> ConfigError:
        return cls(problems[0], problems[1:])


# --- durations -------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


MAX_DURATION_S = 100 * 365 * 86400
MAX_CONCURRENCY = 28_000
"""The most requests one soakd can hold open to one server: each needs its own source
port, and Linux hands out about 28,000 of them (net.ipv4.ip_local_port_range) per
destination. A larger closed-loop concurrency or in-flight cap is a config error."""

_YamlLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a safe loader)
"""Longest duration accepted (100 years): beyond it calendar arithmetic overflows."""


def parse_duration(value: Any) -> float:
    """``"72h"``, ``"1h30m"``, ``"500ms"``, ``"2.5s"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic turns only ValueError into a field error
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ValueError("empty duration")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_RE.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text):
                raise ValueError(
                    f"bad duration {value!r}: use a number and a unit (ms, s, m, h, d), "
                    "e.g. 72h or 1h30m"
                ) from None
    else:
        raise ValueError(f"not a duration: {value!r}")  # noqa: TRY004 (as above)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # nan, 1e400
        raise ValueError(f"not a finite duration: {value!r}")
    if seconds < 0:
        raise ValueError(f"negative duration {value!r}")
    if seconds > MAX_DURATION_S:  # past what a calendar (datetime) can add up
        raise ValueError(f"duration {value!r} is over {MAX_DURATION_S // 86400}d")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> a short human form (``"72h"``, ``"1h30m"``, ``"2.5s"``)."""
    if seconds < 60:
        return f"{seconds:g}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in YAML as ``72h``, ``5m``, ``500ms``... ."""
PositiveDuration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
"""A Duration that must be above zero (a deadline of 0 s would fail every request)."""

PositiveRate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- targets ----------------------------------------------------------------------------


class Timeouts(Strict):
    connect: PositiveDuration = 10.0
    ttft: PositiveDuration = 60.0
    idle: PositiveDuration | None = 60.0  # longest silence between content chunks; None: none
    total: PositiveDuration = 600.0


class Tls(Strict):
    verify: bool = True
    ca_file: Path | None = None


class Hardware(Strict):
    """A box bought outright, written off over ``months`` (docs/slo.md: cost)."""

    price: Annotated[float, Field(ge=0)]
    months: Annotated[float, Field(gt=0)] = 36.0


class TokenPrice(Strict):
    """What a cloud bills per million prompt (input) and output tokens."""

    input: Annotated[float, Field(ge=0)] = 0.0
    output: Annotated[float, Field(ge=0)] = 0.0


class TargetCost(Strict):
    """What the report charges a target, summed: an all-in hourly price (a rented box),
    hardware amortisation, the tokens at a cloud's price, and, without ``per_hour``, the
    energy of its GPUs at ``report.energy_price_per_kwh``."""

    per_hour: Annotated[float, Field(ge=0)] | None = None
    hardware: Hardware | None = None
    per_mtok: TokenPrice | None = None
    gpus: list[str] | None = None  # GPU indexes charged to it (default: where its process ran)


Count = Annotated[int, Field(ge=1)]

Limit = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
"""A latency limit: a duration above zero (``2s``, ``100ms``)."""


class Slo(Strict):
    """Service level objectives: the one source of the report's verdicts, goodput, and
    the exporter's limit gauges (docs/slo.md). Every key is optional: unset, not judged."""

    ttft_p99: Limit | None = None
    tpot_p99: Limit | None = None
    e2e_p99: Limit | None = None
    error_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    jitter: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    oom_events: Annotated[int, Field(ge=0)] | None = None
    vram_peak: Annotated[float, BeforeValidator(lambda v: parse_bytes(v)),
                         Field(gt=0, allow_inf_nan=False)] | None = None

    def over(self, base: Slo) -> Slo:
        """``base`` with the keys set here replacing its own (a target's overrides)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class SpendGuard(Strict):
    """Caps on what soakd sends a target, so a 72 h soak of a paid endpoint cannot run up
    an unbounded bill. Requests count when sent, tokens (prompt + output, from the
    server's usage) when they finish; per-hour caps are over the last hour, sliding.
    When a cap is reached the target pauses (logged, journaled, exported), never silently."""

    max_requests_per_hour: Count | None = None
    max_tokens_per_hour: Count | None = None
    max_requests: Count | None = None  # in the whole run
    max_tokens: Count | None = None

    @property
    def enabled(self) -> bool:
        return any(
            v is not None
            for v in (self.max_requests_per_hour, self.max_tokens_per_hour, self.max_requests,
                      self.max_tokens)
        )


class RateLimit(Strict):
    """What a 429 (or a 503 with Retry-After) does to the target's sends. The 429s are
    counted either way; honouring pauses the target's sends for the time asked."""

    honour_retry_after: bool = True
    default_pause: Duration = 1.0  # a 429 without Retry-After pauses this long (0: none)
    max_pause: Duration = 300.0  # the longest pause one answer can cause


class TargetConfig(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    base_url: str = ""  # required unless `simulator` is set
    simulator: str | None = None  # start the embedded simulator with this profile
    api: Literal["chat", "completions"] = "chat"
    model: str = "soakd-sim"
    stream: bool = True
    api_key_env: str | None = None
    api_key_file: Path | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    proxy: str | None = None  # an http(s) proxy URL; None: honour HTTP(S)_PROXY / NO_PROXY
    tls: Tls = Tls()
    max_connections: Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)] = 1024
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
    api_version: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,40}$")] | None = None
    deployment: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")] | None = None
    organization: str | None = None  # OpenAI-Organization header
    project: str | None = None  # OpenAI-Project header
    path: Annotated[str, Field(pattern=r"^/[^?#\s]*$")] | None = None  # request path, as is
    spend: SpendGuard = SpendGuard()
    rate_limit: RateLimit = RateLimit()
    gateway: GatewaySettings | None = None
    # A W3C traceparent on every request, so the server's trace joins it (docs/tracing.md).
    # None: on for local targets (loopback/private host, simulator:, gateway:), else off.
    traceparent: bool | None = None

    @field_validator("base_url", "metrics_url", "health_url", "proxy")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if not value:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"URL scheme must be http or https, got {value!r}")
        if not parts.netloc:
            raise ValueError(f"URL has no host: {value!r}")
        if parts.password:
            raise ValueError("URL must not carry a password: use api_key_env or api_key_file")
        return value

    @field_validator("headers")
    @classmethod
    def _no_inline_auth(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.lower() in ("authorization", "api-key", "x-api-key"):
                raise ValueError(
                    f"header {key!r} would put a secret in the config: "
                    "use api_key_env or api_key_file"
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
        elif self.api_version or self.deployment:
            raise ValueError("api_version and deployment are for kind 'azure'")
        return self

    def api_key(self) -> SecretStr | None:
        """Read the key by reference. Raises ConfigError naming the reference, never the key."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise ConfigError(
                    f"targets[{self.name}].api_key_env: environment variable "
                    f"{self.api_key_env} is not set"
                )
            return SecretStr(value.strip())
        if self.api_key_file:
            try:
                value = self.api_key_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"targets[{self.name}].api_key_file: cannot read {self.api_key_file}: "
                    f"{exc.strerror}"
                ) from None
            if not value:
                raise ConfigError(
                    f"targets[{self.name}].api_key_file: {self.api_key_file} is empty"
                )
            return SecretStr(value)
        return None

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


# --- workload ---------------------------------------------------------------------------


class TokenLength(Strict):
    """A distribution of prompt lengths in tokens."""

    dist: Literal["fixed", "uniform", "normal"] = "fixed"
    mean: Annotated[int, Field(ge=1)] = 256
    stddev: Annotated[float, Field(ge=0)] = 0.0  # normal
    min: Annotated[int, Field(ge=1)] = 1
    max: Annotated[int, Field(ge=1)] = 4096

    @model_validator(mode="after")
    def _bounds(self) -> TokenLength:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Prompts(Strict):
    source: Literal["synthetic", "file"] = "synthetic"
    input_tokens: TokenLength = TokenLength()
    file: Path | None = None  # JSONL: {"prompt": "..."} or {"messages": [...]} per line

    @model_validator(mode="after")
    def _file_given(self) -> Prompts:
        if self.source == "file" and self.file is None:
            raise ValueError("source is 'file' but no file is given")
        return self


class Load(Strict):
    """The load shape of one target in one phase."""

    mode: Literal["closed", "constant", "poisson", "ramp", "idle"] = "closed"
    concurrency: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 1
    rate: PositiveRate = 0.0
    rate_end: PositiveRate | None = None
    # open loop: sends out at once (0: the target's max_connections); a send that finds
    # them all out is not made and is counted (soakd_sends_missed_total, in_flight_cap)
    max_in_flight: Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)] = 0
    # open loop: a send whose instant is more than this past is not made (counted, late)
    max_lateness: PositiveDuration = 1.0

    @model_validator(mode="after")
    def _shape(self) -> Load:
        if self.mode in ("constant", "poisson", "ramp") and self.rate <= 0 and not (
            self.mode == "ramp" and (self.rate_end or 0) > 0
        ):
            raise ValueError(f"mode {self.mode!r} needs rate > 0")
        if self.mode == "ramp" and self.rate_end is None:
            raise ValueError("mode 'ramp' needs rate_end")
        if self.mode == "closed" and self.concurrency < 1:
            raise ValueError("mode 'closed' needs concurrency >= 1")
        return self


class PhaseConfig(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    duration: Duration | None = None
    until: str | None = None  # an ISO datetime, or a cron expression: run until it next fires
    load: Load = Load()
    targets: dict[str, Load] = Field(default_factory=dict)  # per-target overrides
    gateway: dict[str, GatewayModes] = Field(default_factory=dict)  # target -> its gateway

    @model_validator(mode="after")
    def _one_end(self) -> PhaseConfig:
        if (self.duration is None) == (self.until is None):
            raise ValueError("give a phase either duration or until")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"duration must be above zero, got {self.duration:g}s")
        return self


class Workload(Strict):
    prompts: Prompts = Prompts()
    max_tokens: Annotated[int, Field(ge=1)] = 512
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.7
    seed: int = 0


class AlertLimits(Strict):
    """Limits that only alert rules read (no verdict judges them), exported as gauges.
    The SLO limits are in the ``slo`` block."""

    vram_leak_per_hour: Annotated[float, BeforeValidator(lambda v: parse_bytes(v)),
                                  Field(gt=0, allow_inf_nan=False)] = 50e6
    dispatch_lag: Limit = 0.1
    e2e_p99_drift_per_hour: Limit = 1.0


THRESHOLDS_MOVED = (
    "exporter.thresholds: moved: the SLO limits are now the top-level slo block "
    "(vram_limit_bytes -> slo.vram_peak, error_ratio -> slo.error_ratio, p99_ttft_seconds -> "
    "slo.ttft_p99, p99_e2e_seconds -> slo.e2e_p99, jitter_ratio -> slo.jitter) and the "
    "alert-only ones alert_limits (vram_leak_bytes_per_hour -> vram_leak_per_hour, "
    "dispatch_lag_seconds -> dispatch_lag, p99_e2e_drift_seconds_per_hour -> "
    "e2e_p99_drift_per_hour); see docs/slo.md"
)


class ExporterBasicAuth(Strict):
    """HTTP basic auth on /metrics and /status (not on /healthz and /readyz, which say
    nothing and serve container health checks). The password is read by reference."""

    username: Annotated[str, Field(min_length=1, pattern=r"^[^:\s]+$")]
    password_file: Path | None = None
    password_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ExporterBasicAuth:
        if (self.password_file is None) == (self.password_env is None):
            raise ValueError("set password_file or password_env (one of them)")
        return self

    def password(self) -> SecretStr:
        """Read it. Raises ConfigError naming the reference, never the password."""
        if self.password_env:
            value = os.environ.get(self.password_env, "").strip()
            if not value:
                raise ConfigError(
                    f"exporter.basic_auth.password_env: environment variable "
                    f"{self.password_env} is not set"
                )
            return SecretStr(value)
        assert self.password_file is not None
        try:
            value = self.password_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(
                f"exporter.basic_auth.password_file: cannot read {self.password_file}: {why}"
            ) from None
        if not value:
            raise ConfigError(f"exporter.basic_auth.password_file: {self.password_file} is empty")
        return SecretStr(value)


class ExporterTls(Strict):
    """Serve /metrics, /status... over HTTPS with this certificate (PEM files)."""

    cert_file: Path
    key_file: Path


class Exporter(Strict):
    listen: str = "127.0.0.1:9464"  # loopback: anything wider is an explicit choice
    basic_auth: ExporterBasicAuth | None = None
    tls: ExporterTls | None = None

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class GpuConfig(Strict):
    """Where GPU readings come from. ``auto``: NVML when a driver answers, else none.
    ``dcgm``: a dcgm-exporter's /metrics at ``dcgm_url``, or, when that is unset, the
    /metrics of the first simulator target (the simulator speaks DCGM's names)."""

    source: Literal["auto", "nvml", "dcgm", "none"] = "auto"
    dcgm_url: str | None = None
    interval: Duration = 1.0
    leak_window: Duration = 3600.0

    @field_validator("dcgm_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return TargetConfig._http_url(value)

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: float) -> float:
        if value < 0.05:
            raise ValueError(f"interval must be at least 50ms, got {value:g}s")
        return value


class Probes(Strict):
    scrape_interval: Duration = 5.0  # target /metrics
    health_interval: Duration = 5.0
    # P99 E2E drift: one P99 per drift_interval, a Theil-Sen slope over drift_window
    drift_interval: Duration = 60.0
    drift_window: Duration = 3600.0

    @model_validator(mode="after")
    def _drift(self) -> Probes:
        if self.drift_interval < 1 or self.drift_window < 2 * self.drift_interval:
            raise ValueError(
                "drift_interval must be at least 1s and drift_window at least twice it, "
                f"got {self.drift_interval:g}s and {self.drift_window:g}s"
            )
        return self


_BYTE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
               "t": 1e12, "tb": 1e12, "kib": 1024.0, "mib": 1024.0**2, "gib": 1024.0**3,
               "tib": 1024.0**4}


def parse_bytes(value: Any) -> Any:
    """``"5GB"``, ``"512MiB"`` or a number -> bytes (other input is left to pydantic)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _BYTE_UNITS:
            raise ValueError(f"bad size {value!r}: use a number and a unit, e.g. 5GB or 512MiB")
        return int(float(match.group(1)) * _BYTE_UNITS[unit])
    return value


class JournalConfig(Strict):
    """The run's durable journal (``journal.db``, SQLite WAL): docs/journal.md."""

    synchronous: Literal["full", "normal"] = "full"  # full: a power cut loses <= 1 flush
    flush_interval: Duration = 0.5  # a commit at least this often: a kill loses < 1 s
    queue_size: Annotated[int, Field(ge=100)] = 10_000  # records waiting; beyond: dropped
    keep_samples: Duration | None = None  # delete probe samples older than this
    keep_requests: Duration | None = None  # delete request rows older than this
    max_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1_000_000)] | None = None
    itl_gaps: bool = True  # keep every inter-token gap (4 bytes each) for export

    @field_validator("flush_interval")
    @classmethod
    def _flush(cls, value: float) -> float:
        if not 0.01 <= value <= 0.5:
            raise ValueError(f"flush_interval must be within 10ms..500ms, got {value:g}s")
        return value


# --- the guard gateway (soakd gateway: docs/gateway.md) ---------------------------------

Bytes = Annotated[float, BeforeValidator(parse_bytes), Field(gt=0)]
"""Bytes, written in YAML as ``3.9GB``, ``512MiB`` or a number."""


class VramBreaker(Strict):
    """Open (answer 429) once VRAM used stays above ``limit_bytes`` for ``hold``; half-open
    once it stays below ``lower_mark_bytes`` for ``close_hold``; closed after one probe
    request succeeds."""

    enabled: bool = True
    limit_bytes: Bytes = 3.9e9
    hold: Duration = 5.0
    lower_mark_bytes: Bytes | None = None  # default: 97 % of limit_bytes
    close_hold: Duration | None = None  # default: hold
    retry_after: Duration = 5.0  # the Retry-After sent while open
    gpu: Annotated[int, Field(ge=0)] | None = None  # None: the fullest GPU

    @model_validator(mode="after")
    def _marks(self) -> VramBreaker:
        if self.lower_mark_bytes is not None and self.lower_mark_bytes >= self.limit_bytes:
            raise ValueError(
                f"lower_mark_bytes ({self.lower_mark_bytes:g}) must be below limit_bytes "
                f"({self.limit_bytes:g})"
            )
        return self

    @property
    def lower_mark(self) -> float:
        mark = self.lower_mark_bytes
        return mark if mark is not None else 0.97 * self.limit_bytes


class ErrorBreaker(Strict):
    """Open (answer 503) when upstream failures (5xx, connect errors, cut streams) exceed
    ``threshold`` of the requests of the last ``window`` (with at least ``min_requests``);
    after ``open_for`` one probe request decides: closed, or open again."""

    enabled: bool = True
    threshold: Annotated[float, Field(gt=0, le=1)] = 0.5
    window: Duration = 30.0
    min_requests: Annotated[int, Field(ge=1)] = 10
    open_for: Duration = 30.0


class Concurrency(Strict):
    """Requests in flight to the upstream. Static (``limit``), or adaptive: AIMD on the
    upstream's P95 time to first byte, every ``interval``. Beyond the limit requests wait,
    at most ``queue`` of them, each at most ``queue_timeout`` (then 429 / 503)."""

    limit: Annotated[int, Field(ge=1)] = 64  # the static limit, or where adaptive starts
    adaptive: bool = False
    min_limit: Annotated[int, Field(ge=1)] = 1
    max_limit: Annotated[int, Field(ge=1)] = 64
    target_p95: Duration = 2.0
    interval: Duration = 5.0
    min_samples: Annotated[int, Field(ge=1)] = 5
    decrease: Annotated[float, Field(gt=0, lt=1)] = 0.5
    queue: Annotated[int, Field(ge=0)] = 256
    queue_timeout: Duration = 30.0

    @model_validator(mode="after")
    def _bounds(self) -> Concurrency:
        if not self.min_limit <= self.max_limit:
            raise ValueError(f"min_limit ({self.min_limit}) is above max_limit ({self.max_limit})")
        if self.adaptive and not self.min_limit <= self.limit <= self.max_limit:
            raise ValueError(
                f"limit ({self.limit}) must be within min_limit..max_limit "
                f"({self.min_limit}..{self.max_limit})"
            )
        if self.interval <= 0 or self.target_p95 <= 0:
            raise ValueError("interval and target_p95 must be above zero")
        return self


class GatewayLimits(Strict):
    max_body_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1024)] = 8 << 20
    max_header_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=1024)] = 16384
    connect_timeout: Duration = 5.0
    total_timeout: Duration = 900.0  # one proxied request, first byte to last


class GatewaySettings(Strict):
    """What a gateway does; a target's ``gateway:`` section (soakd starts it) or the body of
    a ``soakd gateway`` config file (``GatewayConfig``)."""

    vram_breaker: VramBreaker = VramBreaker()
    error_breaker: ErrorBreaker = ErrorBreaker()
    concurrency: Concurrency = Concurrency()
    limits: GatewayLimits = GatewayLimits()
    gpu: GpuConfig = GpuConfig()  # where VRAM readings come from (dcgm: the upstream's page)


class GatewayModes(Strict):
    """A phase's switches for a target's gateway (unset: left as they are)."""

    vram_breaker: bool | None = None
    error_breaker: bool | None = None
    adaptive: bool | None = None


class GatewayConfig(GatewaySettings):
    """``soakd gateway --config FILE``: one upstream, one listening address."""

    listen: str = "127.0.0.1:8080"
    upstream: str
    admin_token_env: str | None = None  # enables PUT /gateway/modes with this bearer token
    logging: Logging = Field(default_factory=lambda: Logging())

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return Exporter._host_port(value)

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        checked = TargetConfig._http_url(value)
        assert checked is not None
        return checked.rstrip("/")

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class ReportConfig(Strict):
    energy_price_per_kwh: Annotated[float, Field(ge=0)] | None = None
    currency: str = "$"


REGRESSION_KEYS = ("ttft_p99", "tpot_p99", "e2e_p99", "ttft_p50", "e2e_p50", "error_ratio",
                   "goodput", "goodput_rps", "output_tps", "rps")
"""What ``compare.max_regression`` may bound (soakd/verdicts.py knows each one's direction)."""


def _regression(value: Any) -> Any:
    """``"10%"`` -> ("relative", 0.10); a number or a duration -> ("absolute", value)."""
    if isinstance(value, list | tuple) and len(value) == 2:  # as stored: (kind, amount)
        return tuple(value)
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return ("relative", float(value.strip()[:-1]) / 100)
        except ValueError:
            raise ValueError(f"bad percentage {value!r}") from None
    if isinstance(value, str):
        return ("absolute", parse_duration(value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a limit: {value!r} (use e.g. 10% or 0.001)")  # noqa: TRY004
    return ("absolute", float(value))


Regression = Annotated[
    tuple[Literal["relative", "absolute"], Annotated[float, Field(ge=0, allow_inf_nan=False)]],
    BeforeValidator(_regression)]


class Compare(Strict):
    """A candidate target against a baseline (a model version against the current one)."""

    baseline: str
    candidate: str
    max_regression: dict[str, Regression] = Field(default_factory=dict)

    @field_validator("max_regression")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(REGRESSION_KEYS))
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(unknown)} (known: {', '.join(REGRESSION_KEYS)})"
            )
        return value


class Logging(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class RunConfig(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")] = "soak"
    node: str = Field(default_factory=lambda: os.uname().nodename)
    duration: Duration | None = None  # a cap on the whole run
    loop: bool = False  # repeat the phases until duration
    drain_timeout: Duration = 30.0
    start_at: str | None = None  # ISO datetime: the plan's calendar start (default: now)


class Config(Strict):
    run: RunConfig = RunConfig()
    targets: Annotated[list[TargetConfig], Field(min_length=1)]
    workload: Workload = Workload()
    phases: Annotated[list[PhaseConfig], Field(min_length=1)]
    exporter: Exporter = Exporter()
    gpu: GpuConfig = GpuConfig()
    probes: Probes = Probes()
    logging: Logging = Logging()
    journal: JournalConfig = JournalConfig()
    report: ReportConfig = ReportConfig()
    slo: Slo = Slo()
    alert_limits: AlertLimits = AlertLimits()
    compare: Compare | None = None

    @model_validator(mode="after")
    def _names(self) -> Config:
        names = [t.name for t in self.targets]
        known = set(names)
        if len(known) != len(names):
            dupes = sorted(n for n, count in Counter(names).items() if count > 1)
            raise ValueError(f"duplicate target names: {', '.join(dupes)}")
        gated = {t.name for t in self.targets if t.gateway is not None}
        if self.compare is not None:
            for role in ("baseline", "candidate"):
                name = getattr(self.compare, role)
                if name not in names:
                    raise ValueError(
                        f"compare.{role}: unknown target {name!r} (known: {', '.join(names)})"
                    )
            if self.compare.baseline == self.compare.candidate:
                raise ValueError("compare: baseline and candidate are the same target")
        for phase in self.phases:
            unknown = sorted(set(phase.targets) - known)
            if unknown:
                raise ValueError(
                    f"phase {phase.name!r} sets load for unknown target(s) {', '.join(unknown)}"
                    f" (known: {', '.join(names)})"
                )
            for t in self.targets:
                load = phase.targets.get(t.name, phase.load)
                if load.mode == "closed" and load.concurrency > t.max_connections:
                    raise ValueError(
                        f"phase {phase.name!r}: concurrency {load.concurrency} for "
                        f"{t.name!r} is above its max_connections ({t.max_connections}): the "
                        "requests past it would wait inside soakd for a connection, and the "
                        "wait would count as TTFT; raise targets[].max_connections (at most "
                        f"{MAX_CONCURRENCY}) or lower the concurrency"
                    )
            stray = sorted(set(phase.gateway) - gated)
            if stray:
                raise ValueError(
                    f"phase {phase.name!r} sets gateway modes for {', '.join(stray)}, which "
                    f"has no gateway (targets with one: {', '.join(sorted(gated)) or 'none'})"
                )
        if self.run.loop and self.run.duration is None:
            raise ValueError("run.loop needs run.duration, or it would never end")
        return self

    def target(self, name: str) -> TargetConfig:
        return next(t for t in self.targets if t.name == name)

    def slo_for(self, name: str) -> Slo:
        """The run-wide slo with the target's own keys over it."""
        return self.target(name).slo.over(self.slo)

    def load_for(self, phase: PhaseConfig, target: str) -> Load:
        return phase.targets.get(target, phase.load)


# --- loading ----------------------------------------------------------------------------


def _env_value(key: str, text: str) -> Any:
    try:
        return _yaml_load(text)
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{key}: not a YAML value: {why}") from None


def _apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], prefix: str = ENV_PREFIX
) -> dict[str, Any]:
    """Overlay ``SOAKD__SECTION__KEY=value``. List items by index or by their ``name``:
    ``SOAKD__TARGETS__LOCAL__BASE_URL`` or ``SOAKD__TARGETS__0__BASE_URL``. Values are
    parsed as YAML scalars, so numbers and booleans keep their type."""
    for key in sorted(environ):
        if not key.startswith(prefix):
            continue
        path = [p.lower() for p in key[len(prefix) :].split("__") if p]
        if not path:
            continue
        node: Any = raw
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):
                idx = _list_index(node, part)
                if idx is None:
                    raise ConfigError(f"{key}: no list item {part!r} in {'.'.join(path[:i])}")
                if last:
                    node[idx] = _env_value(key, environ[key])
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = _env_value(key, environ[key])
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"{key}: {'.'.join(path[:i])} is not a section")
    return raw


def _list_index(items: list[Any], part: str) -> int | None:
    if part.isdigit():
        return int(part) if int(part) < len(items) else None
    for i, item in enumerate(items):
        if isinstance(item, dict) and str(item.get("name", "")).lower().replace("-", "_") == (
            part.replace("-", "_")
        ):
            return i
    return None


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _error_lines(exc: ValidationError, raw: Any, model: type[BaseModel]) -> list[str]:
    """Every pydantic error -> ``field.path: message (got VALUE)``, list items by name."""
    return list(dict.fromkeys(_one_error(err, raw, model)
                              for err in exc.errors(include_url=False)))


def _one_error(err: Any, raw: Any, model: type[BaseModel]) -> str:
    parts: list[str] = []
    node: Any = raw
    for loc in err["loc"]:
        if isinstance(loc, int) and isinstance(node, list) and loc < len(node):
            item = node[loc]
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                name = None  # a name that is itself the problem (a newline...): the index
            parts.append(f"{parts.pop() if parts else ''}[{name or loc}]")
            node = item
            continue
        if isinstance(loc, str) and loc.startswith(("function-", "literal[", "nullable")):
            continue
        # a key that is not plain text (a CR, a space...) is shown quoted, on one line
        parts.append(str(loc) if _KEY_RE.fullmatch(str(loc)) else repr(loc))
        node = node.get(loc) if isinstance(node, dict) else None
    where = ".".join(parts) or "config"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        hint = _did_you_mean(model, err["loc"])
        return f"{where}: unknown key ({hint or 'check the spelling'})"
    if err["type"] == "missing":
        return f"{where}: required, but missing"
    if "input" in err and err["type"] not in ("value_error",) and not isinstance(
        err["input"], dict | list
    ):
        got = repr(err["input"])
        return f"{where}: {msg} (got {got if len(got) <= 80 else got[:77] + '...'})"
    return f"{where}: {msg}"


def _did_you_mean(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """'did you mean X?' for a misspelled key: the closest field of the model it is in."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list item: same model
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return None
        current = _model_in(field.annotation)
        if current is None:
            return None
    names = list(getattr(current, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]`` or ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in reversed(get_args(annotation)):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_config(
    path: Path | str, environ: Mapping[str, str] | None = None
) -> Config:
    """Read, overlay env, validate. Every problem is a ConfigError with one line."""
    raw = _read_yaml(Path(path))
    return config_from_dict(raw, environ if environ is not None else os.environ)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        raw = _yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(
            f"{path}: not valid YAML at {where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(raw).__name__}")
    return raw


def config_from_dict(raw: dict[str, Any], environ: Mapping[str, str] | None = None) -> Config:
    raw = _apply_env(raw, environ or {})
    exporter = raw.get("exporter")
    if isinstance(exporter, dict) and "thresholds" in exporter:
        raise ConfigError(THRESHOLDS_MOVED)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError.of(_error_lines(exc, raw, Config)) from None


GATEWAY_ENV_PREFIX = "SOAKD_GATEWAY__"


def load_gateway_config(
    path: Path | str, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """A ``soakd gateway`` config file, read like the run's (``SOAKD_GATEWAY__`` env)."""
    raw = _read_yaml(Path(path))
    return gateway_config_from_dict(raw, environ if environ is not None else os.environ)


def gateway_config_from_dict(
    raw: dict[str, Any], environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    raw = _apply_env(raw, environ or {}, GATEWAY_ENV_PREFIX)
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError.of(_error_lines(exc, raw, GatewayConfig)) from None
